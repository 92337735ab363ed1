"""The fast path's per-device choices: CUDA gets its options, the CPU and XLA do not; and the
loop's batched host reads (CUDA's sync_every) write the same metrics rows as reading every step.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.train.helpers import make_job
from trainmaster.config import jobfile
from trainmaster.train import device, loop, model, optim, preflight
from trainmaster.train.device import CUDA_SYNC_EVERY, Runtime, options_for
from trainmaster.train.preflight import Env

# Checkpoint writing and device choices use torch's newer and private APIs: run on every
# stack (the trn1 stack too, `make stacks`).
pytestmark = pytest.mark.stacks


def test_cuda_gets_the_gpu_fast_path() -> None:
    o = options_for("cuda", bf16=True)
    assert o.autocast_bf16 and o.adamw == "fused" and o.attn_implementation == "sdpa"
    assert o.pin_memory and o.non_blocking and o.tf32
    assert o.sync_every == CUDA_SYNC_EVERY > 1
    assert not options_for("cuda", bf16=False).autocast_bf16  # fp32 asked for: no autocast


@pytest.mark.parametrize("bf16", [False, True])
def test_cpu_gets_none_of_the_cuda_only_options(bf16: bool) -> None:
    o = options_for("cpu", bf16=bf16)
    assert not (o.pin_memory or o.non_blocking or o.tf32)
    assert o.sync_every == 1  # every step's loss is read: per-step rows as before
    assert o.autocast_bf16 is bf16 and o.adamw == "fused" and o.attn_implementation == "sdpa"


def test_xla_keeps_its_own_path() -> None:
    o = options_for("xla", bf16=True)
    assert not o.autocast_bf16  # bf16 weights on XLA, no autocast
    assert o.adamw == "foreach" and o.attn_implementation == "eager"
    assert not (o.pin_memory or o.non_blocking or o.tf32) and o.sync_every == 1


@pytest.mark.parametrize(
    ("kind", "flag"), [("cuda", "fused"), ("cpu", "fused"), ("xla", "foreach")]
)
def test_optimizer_follows_the_device_kind(kind: str, flag: str) -> None:
    cfg = jobfile.preset("local-cpu", [])
    opt = optim.make_optimizer(cfg, model.build(cfg, 300), kind)
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults[flag] is True


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_model_takes_the_attention_of_the_options(attn: str) -> None:
    cfg = jobfile.preset("local-cpu", [])
    assert model.build(cfg, 300, attn).config._attn_implementation == attn


def test_cpu_batches_are_passed_through_untouched() -> None:
    rt = Runtime(Env(), "cpu", bf16=False)
    batch = {"input_ids": torch.arange(6).reshape(2, 3)}
    (out,) = list(rt.batches([batch]))
    assert out["input_ids"] is batch["input_ids"] and not out["input_ids"].is_pinned()


def _run(
    storage: Path, name: str, every: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[dict[str, Any]], int]:
    """bert-tiny, 1 worker, in this process, with the host reading the loss every `every` steps."""
    real = device.options_for
    monkeypatch.setattr(
        device,
        "options_for",
        lambda kind, *, bf16: dataclasses.replace(real(kind, bf16=bf16), sync_every=every),
    )
    reads = {"n": 0}
    real_log = loop.Trainer._log

    def counting(self: loop.Trainer, pending: list[Any], *rest: Any) -> Any:
        reads["n"] += 1
        return real_log(self, pending, *rest)

    monkeypatch.setattr(loop.Trainer, "_log", counting)
    job = make_job(
        storage,
        name,
        "train.max_steps=9",
        "train.checkpoint_every=100",
        "train.global_batch_size=4",
        "train.warmup_steps=2",
        nproc=1,
    )
    plan = preflight.make_plan(job, str(storage), environ={})
    loop.train(plan, 0.0)
    rows = [
        {k: v for k, v in row.items() if k not in ("seq_per_s", "tokens_per_s", "mfu", "elapsed_s")}
        for row in _rows(job)
    ]
    return rows, reads["n"]


def _rows(job: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (job.parent / "metrics.jsonl").read_text().splitlines()]


def test_batched_host_reads_write_the_same_rows(
    pydoc_storage: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = tmp_path / "storage"
    (storage / "datasets").mkdir(parents=True)
    (storage / "datasets" / "pydoc").symlink_to(pydoc_storage / "datasets" / "pydoc")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a worker of the trainer tests (2 shared cores)
    try:
        every_step, reads_1 = _run(storage, "sync-1", 1, monkeypatch)
        batched, reads_4 = _run(storage, "sync-4", 4, monkeypatch)
    finally:
        torch.set_num_threads(threads)
    assert [r["step"] for r in batched] == list(range(1, 10))
    assert batched == every_step  # same losses, norms and lrs, only read later
    assert reads_1 == 9
    assert reads_4 == 4  # step 1 (time to first step), 4, 8, and 9 (the end)
