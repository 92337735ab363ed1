"""The trainer as the launcher runs it: real torchrun agents, 2 gloo workers, the real corpus.

bert-tiny on the built-in corpus (tests/conftest.py's pydoc_storage: 4 shards, a 4k vocab),
global batch 16 = 2 workers x 2 micro-batches of 4, 60 steps. One uninterrupted 1-node run is
the reference; a run stopped and resumed, and a 2-node run, must reproduce it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.train.helpers import make_job, metrics, processes_mentioning, summary, torchrun
from trainmaster.run import checkpoints

pytestmark = pytest.mark.slow
STEPS = 60


def steps(rows: list[dict]) -> list[int]:
    return [r["step"] for r in rows]


def losses(rows: list[dict]) -> list[float]:
    return [r["loss"] for r in rows]


def final_params(job: Path, step: int) -> dict[str, torch.Tensor]:
    return torch.load(job.parent / "checkpoints" / f"step_{step}" / "model.pt", weights_only=True)


@pytest.fixture(scope="module")
def straight(pydoc_storage: Path) -> Path:
    """The reference: 60 steps in one go, 1 node x 2 workers."""
    job = make_job(pydoc_storage, "train-straight")
    result = torchrun(job, pydoc_storage, timeout=240)
    assert result.ok, result.output[-3000:]
    assert not processes_mentioning(str(job))
    return job


def test_loss_falls_and_ranks_agree(straight: Path) -> None:
    rows = metrics(straight)
    assert steps(rows) == list(range(1, STEPS + 1))
    first = sum(losses(rows[:5])) / 5
    last = sum(losses(rows[-10:])) / 10
    assert first > 8.5  # ln(4096) + ln(2) = 9.0 for a model that knows nothing
    assert last < first - 1.5, (first, last)
    s = summary(straight)
    assert s["ranks_agree"] is True and s["status"] == "completed" and s["steps"] == STEPS
    assert s["world_size"] == 2 and s["global_batch_size"] == 16 and s["grad_accum"] == 2
    assert s["resumed_from"] is None and s["compile_cache"] == "off" and s["restarts"] == 0
    assert s["nccl_net_plugin"] == "n/a"  # gloo on cpu: no NCCL (docs/architecture.md 5: 12.3)
    assert s["final_loss"] == rows[-1]["loss"]
    assert s["peak_seq_per_s"] >= s["avg_seq_per_s"] > 0 and s["time_to_first_step_s"] > 0


def test_metrics_rows_and_schedule(straight: Path) -> None:
    rows = metrics(straight)
    keys = {
        "step",
        "loss",
        "mlm_loss",
        "nsp_loss",
        "lr",
        "grad_norm",
        "seq_per_s",
        "tokens_per_s",
        "mfu",
        "elapsed_s",
        "world",
        "global_batch",
    }
    assert all(keys <= set(r) for r in rows)
    # every step's batch is the configured global batch: micro-batch x accumulation x workers
    assert {(r["world"], r["global_batch"]) for r in rows} == {(2, 16)}
    assert all(math.isclose(r["loss"], r["mlm_loss"] + r["nsp_loss"], rel_tol=1e-5) for r in rows)
    assert all(r["mfu"] is None for r in rows)  # a generic CPU host has no catalog peak
    assert all(r["tokens_per_s"] == pytest.approx(r["seq_per_s"] * 128, rel=1e-3) for r in rows)
    lrs = [r["lr"] for r in rows]
    assert lrs[:6] == pytest.approx([2e-4, 4e-4, 6e-4, 8e-4, 1e-3, 1e-3])  # warm-up to the peak
    assert lrs[6] == pytest.approx(1e-3 * (1 - 1 / 55))
    assert lrs[-1] == pytest.approx(1e-3 / 55)  # linear decay, reaching 0 at max_steps
    assert all(r["grad_norm"] > 0 for r in rows)


def test_tensorboard_events_hold_every_step(straight: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(straight.parent / "tensorboard"))
    events.Reload()
    assert {"loss", "mlm_loss", "nsp_loss", "lr", "grad_norm", "seq_per_s"} <= set(
        events.Tags()["scalars"]
    )
    loss = events.Scalars("loss")
    assert [e.step for e in loss] == list(range(1, STEPS + 1))
    assert loss[-1].value == pytest.approx(metrics(straight)[-1]["loss"], rel=1e-6)


def test_checkpoints_kept_and_rank0_recorded(straight: Path) -> None:
    kept = [c.step for c in checkpoints.complete(straight.parent / "checkpoints")]
    assert kept == [50, 60]  # every 25 steps and at the end; the newest 2 kept
    assert not list((straight.parent / "checkpoints").glob(".tmp-*"))
    meta = checkpoints.read_meta(straight.parent / "checkpoints" / "step_60")
    assert meta is not None and meta["world_size"] == 2 and len(meta["positions"]) == 2
    rank0 = json.loads((straight.parent / "rank0.json").read_text())
    assert rank0["local_rank"] == 0 and rank0["node_rank"] == 0 and rank0["pid"] > 0


def test_resume_is_the_straight_run(pydoc_storage: Path, straight: Path) -> None:
    """30 steps, stop, 30 more == 60 at once: the same losses after step 30, the same weights."""
    split = make_job(pydoc_storage, "split", "train.steps_this_run=30")
    first = torchrun(split, pydoc_storage)
    assert first.ok, first.output[-3000:]
    assert summary(split)["status"] == "stopped" and summary(split)["steps"] == 30
    # What a crash after step 30 may leave: metrics of steps that no checkpoint holds (one line
    # torn), a half-written checkpoint under its temporary name, a step folder with no meta.
    with (split.parent / "metrics.jsonl").open("a") as f:
        f.write('{"step": 31, "loss": 1.0}\n{"step": 32, "loss": 1.0}\n{"step": 33, "lo')
    ckpts = split.parent / "checkpoints"
    (ckpts / ".tmp-step_40-4242").mkdir()
    (ckpts / ".tmp-step_40-4242" / "model.pt").write_bytes(b"PK\x03\x04 half a zip")
    (ckpts / "step_45").mkdir()
    (ckpts / "step_45" / "model.pt").write_bytes(b"")

    second = torchrun(split, pydoc_storage)
    assert second.ok, second.output[-3000:]
    assert "resumed from step 30" in second.output
    s = summary(split)
    assert s["resumed_from"] == 30 and s["status"] == "completed" and s["steps"] == STEPS
    a, b = metrics(straight), metrics(split)
    assert steps(b) == list(range(1, STEPS + 1))  # no step twice, the torn line gone
    assert losses(b[30:]) == pytest.approx(losses(a[30:]), rel=1e-6, abs=1e-6)
    pa, pb = final_params(straight, STEPS), final_params(split, STEPS)
    assert pa.keys() == pb.keys()
    assert max(float((pa[k].float() - pb[k].float()).abs().max()) for k in pa) <= 1e-6
    assert summary(straight)["param_checksum"] == s["param_checksum"]
    assert not (ckpts / ".tmp-step_40-4242").exists()  # cleaned up by the next save


def test_two_nodes_give_the_one_node_curve(pydoc_storage: Path, straight: Path) -> None:
    """2 nodes x 1 worker (two torchrun agents, c10d) == 1 node x 2 workers, step for step.

    Same world size, global batch and micro-batch: the same sequences in every step on every
    rank, so the losses must agree to float precision (checked over the first 20 steps).
    """
    job = make_job(pydoc_storage, "two-nodes", "train.steps_this_run=20", nnodes=2, nproc=1)
    result = torchrun(job, pydoc_storage)
    assert result.ok, result.output[-3000:]
    assert not processes_mentioning(str(job))
    s = summary(job)
    assert s["world_size"] == 2 and s["grad_accum"] == 2 and s["ranks_agree"] and s["steps"] == 20
    assert losses(metrics(job)) == pytest.approx(losses(metrics(straight)[:20]), rel=1e-5)
