"""Divergence (run/divergence.py, train/rollback.py): a NaN loss injected at a chosen step into a
real 2-node job (`trainmaster launch`, local backend: 2 torchrun agents, 1 gloo worker each). With `rollback` the
job goes back to the checkpoint before it, skips the batches that led there, and completes with
finite weights; with `stop` it ends with one line and a non-zero exit, its newest checkpoint the
last good one, and a restart of the same launch stops again at once."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.backends.local.test_local import (
    FAULT_ENV,
    JOB_STEPS,
    diagnosis,
    job_file,
    summary,
    wait_final,
)
from tests.conftest import run_cli
from trainmaster.run import checkpoints, counters, divergence, goodput, state, timeline
from trainmaster.storage import Storage
from trainmaster.train import faults

BAD = 23  # the NaN in step 23 of 40 (a checkpoint every 10): back to 20, steps 21-23 taken back


# --- the detector and its records: no torch, no processes -------------------------------------


def test_non_finite_values_and_spikes_are_verdicts_ordinary_noise_is_not() -> None:
    d = divergence.Detector(spike=2.0)
    assert d.check(1, 10.0, 1.0, False) is None
    assert d.check(2, 30.0, 1.0, False) is None  # too few steps for a median: no spike yet
    for step in range(3, 13):
        assert d.check(step, 7.0 + (step % 3) * 0.5, 1.0, False) is None
    spike = d.check(13, 20.0, 1.0, False)
    assert spike is not None and spike.reason == "loss spike" and spike.median == 7.5
    assert "20 > median 7.5" in spike.describe()
    assert d.check(14, 14.0, 1.0, False) is None  # under 2x the median
    nan = d.check(15, math.nan, 1.0, False)
    assert nan is not None and nan.reason == "non-finite loss"
    grads = d.check(16, 7.0, math.inf, False)
    assert grads is not None and grads.reason == "non-finite gradient norm"
    other_rank = d.check(17, 7.0, 1.0, True)  # another rank's norm, through the all-reduce
    assert other_rank is not None and other_rank.reason == "non-finite gradient norm"
    assert divergence.Detector(spike=0).check(1, 1e9, 1.0, False) is None  # 0: spikes off


def test_rollbacks_are_bounded_in_a_window_of_steps() -> None:
    past = [{"step": 100, "action": "rollback"}, {"step": 400, "action": "rollback"}]
    assert divergence.allowed(past, 500, most=3, window=1000)
    past.append({"step": 450, "action": "rollback"})
    assert not divergence.allowed(past, 500, most=3, window=1000)
    assert divergence.allowed(past, 1150, most=3, window=1000)  # step 100's has left the window
    assert not divergence.allowed([], 5, most=0, window=10)  # max_rollbacks 0: never


def test_a_stop_refuses_restarts_of_its_own_launch_only(tmp_path: Path) -> None:
    path = tmp_path / "rollbacks.jsonl"
    bad = divergence.Verdict(7, "non-finite loss", math.nan, None)
    line = divergence.record(path, bad, action="stop", to=5, launch="1700000000.5", line="why")
    assert line["value"] == "nan"  # strict JSON: a NaN is written as its text
    json.loads(path.read_text())  # parses without Python's NaN extension
    same = {"TRAINMASTER_LAUNCHED_AT": "1700000000.5"}
    assert divergence.refuse_restart(path, same) == "why"
    assert divergence.refuse_restart(path, {"TRAINMASTER_LAUNCHED_AT": "1800000000.0"}) is None
    assert divergence.refuse_restart(path, {}) is None  # no launch to tell: the restart trains


def test_goodput_counts_a_rollback_as_lost_steps_not_a_restart() -> None:
    events = [
        timeline.Start(0.0, 0),
        timeline.Steps(1.0, 2.0, 1, 10),
        timeline.Steps(2.0, 3.0, 11, 13),
        timeline.Rollback(3.0, 3.5, 13, to=10),
        timeline.Steps(3.5, 4.5, 11, 20),
    ]
    g = goodput.breakdown(events)
    assert g is not None and g.steps_lost == 3 and g.rollbacks == 1 and g.restarts == 0
    assert g.seconds["lost"] == pytest.approx(1.0) and g.seconds["restart"] == pytest.approx(0.5)
    assert counters.processes(events) == 1  # one trainer process: restarts stay 0
    assert timeline.resume_steps(events) == [0, 10]  # metrics rows after it start again at 11


# --- a real 2-node job, launched as a user launches it ---------------------------------------


def _launch(store: Path, tmp: Path, name: str, *sets: str) -> state.RunState:
    """`trainmaster launch` (local backend: 2 nodes x 1 gloo worker, the pydoc corpus), rank 1's
    loss NaN in step BAD (rank 0 learns it from the loss all-reduce); waits for the end."""
    path = job_file(tmp, name, *sets)
    env = FAULT_ENV | {faults.NAN_AT_STEP_ENV: f"1:{BAD}"}
    assert run_cli("launch", str(path), "--storage", str(store), env=env).returncode == 0
    return wait_final(store, name)


def test_a_nan_rolls_back_skips_and_the_job_completes_finite(
    pydoc_storage: Path, tmp_path: Path
) -> None:
    job = "diverge-rollback"
    final = _launch(pydoc_storage, tmp_path, job)
    run = Storage(pydoc_storage).run_dir(job)
    assert final.phase == "succeeded", diagnosis(pydoc_storage, job)
    log = (run / "logs" / "rank0.log").read_text()
    assert f"divergence: non-finite loss at step {BAD} (nan); rolled back to step 20" in log
    assert f"skipping the batches of steps 21-{BAD}" in log

    [line] = divergence.read(run / "rollbacks.jsonl")
    assert (line["step"], line["to"], line["action"]) == (BAD, 20, "rollback")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, JOB_STEPS + 1))  # none twice, none missing
    assert all(math.isfinite(r["loss"]) for r in rows)
    s = summary(pydoc_storage, job)
    assert s["status"] == "completed" and s["steps"] == JOB_STEPS and s["ranks_agree"]
    assert s["goodput"]["rollbacks"] == 1 and s["goodput"]["steps_lost"] == BAD - 20
    assert s["restarts"] == 0 and s["goodput"]["restarts"] == 0  # the same processes went on
    final_ckpt = checkpoints.latest(run / "checkpoints")
    assert final_ckpt is not None and final_ckpt.step == JOB_STEPS
    weights = torch.load(final_ckpt.path / "model.pt", weights_only=True)
    assert all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point())

    # the data went on from where the loader was: the batches of steps 21-BAD were skipped
    assert line["data_at"] > line["data_from"]  # rank 0's [epoch, round, offset]

    shown = run_cli("status", job, "--storage", str(pydoc_storage), "--json")
    assert shown.returncode == 0, shown.stderr
    st = json.loads(shown.stdout)
    assert st["rollbacks"] == 1 and st["rollback_steps_lost"] == BAD - 20 and st["restarts"] == 0
    assert any(f"rollbacks 1 ({BAD - 20} steps taken back)" in n for n in st["notes"]), st["notes"]


def test_with_stop_the_job_ends_in_one_line_and_the_last_good_checkpoint_stays(
    pydoc_storage: Path, tmp_path: Path
) -> None:
    job = "diverge-stop"
    final = _launch(pydoc_storage, tmp_path, job, "train.on_divergence='stop'")
    run = Storage(pydoc_storage).run_dir(job)
    assert final.phase == "failed", diagnosis(pydoc_storage, job)
    [line] = divergence.read(run / "rollbacks.jsonl")
    assert (line["step"], line["to"], line["action"]) == (BAD, 20, "stop")
    said = line["line"]
    assert f"non-finite loss at step {BAD}" in said and "train.on_divergence is stop" in said
    shown = run_cli("status", job, "--storage", str(pydoc_storage))
    assert "stopped: training diverged: non-finite loss at step 23" in shown.stdout, shown.stdout
    shown = run_cli("status", job, "--storage", str(pydoc_storage), "--json")
    assert f"stopped: {said}" in json.loads(shown.stdout)["notes"]
    # the newest checkpoint is the last good one: step BAD's weights were never saved
    newest = checkpoints.latest(run / "checkpoints")
    assert newest is not None and newest.step == 20
    weights = torch.load(newest.path / "model.pt", weights_only=True)
    assert all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point())
    # torchrun restarted the workers (max_restarts 6): each stopped at once with the same line,
    # training nothing, and no trainer printed a traceback (torchrun's agent prints its own)
    rank0 = (run / "logs" / "rank0.log").read_text()
    assert rank0.count(f"trainmaster: {said}") == 7 and "resumed from step" not in rank0
    assert not any("Traceback" in p.read_text() for p in (run / "logs").glob("rank*.log"))
