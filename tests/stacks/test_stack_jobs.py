"""The job on the stack this suite runs in, as real processes through the real CLI.

`make test` runs this module twice: in .venv with the pinned torch, and in .venv-trn1 with the
trn1 stack (stacks/trn1.txt: torch 2.9 + torch_xla 2.9 on the CPU, every other dependency at its
floor), where torch 2.9 once crashed every checkpoint save (no get_record_size). Each job saves
checkpoints every few steps, ends, and is relaunched with `launch --resume` to a later step.

The XLA jobs need torch_xla (the trn1 stack) and run one worker: torch_xla on a CPU has no
cross-process collectives, so more XLA workers are refused by design
(tests/train/test_xla.py); the 2-node job of the same stack runs on its CPU device.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from pathlib import Path

import pytest

from tests.backends.local.test_local import diagnosis, summary, wait_final
from tests.backends.local.test_local import job_file as local_job_file
from tests.conftest import run_cli, wait_for
from trainmaster.config import jobfile
from trainmaster.monitor import runinfo
from trainmaster.run import export, state
from trainmaster.storage import RunPaths, Storage

pytestmark = [pytest.mark.slow, pytest.mark.stacks, pytest.mark.timeout(1200)]
needs_xla = pytest.mark.skipif(
    importlib.util.find_spec("torch_xla") is None, reason="torch_xla: the trn1 stack only"
)
# XLA on the CPU: dropout off, so its random numbers (not the CPU's) do not matter here.
XLA_ENV = {"PJRT_DEVICE": "CPU", "TRAINMASTER_DROPOUT": "0"}
FAULT_ENV = {"TRAINMASTER_DIST_TIMEOUT_S": "180"}


def job_file(tmp_path: Path, name: str, *extra: str) -> Path:
    """test_local's job file (the local-cpu preset, bert-tiny on pydoc), 20 steps, a checkpoint
    every 5 (later --set values win)."""
    steps = ["train.max_steps=20", "train.checkpoint_every=5", "train.keep_checkpoints=2"]
    return local_job_file(tmp_path, name, *steps, "job.max_restarts=3", *extra)


def launch(store: Path, *args: str, env: dict[str, str] | None = None) -> None:
    result = run_cli("launch", *args, "--storage", str(store), env=env)
    assert result.returncode == 0, result.stderr


def succeeded(store: Path, job: str) -> dict:
    final = wait_final(store, job, timeout=900)
    assert final.phase == "succeeded", diagnosis(store, job)
    return summary(store, job)


def resumed_to_30(store: Path, job: str, path: Path, env: dict[str, str] | None = None) -> None:
    """`launch --resume --set train.max_steps=30` goes on from step 20 to 30."""
    launch(store, str(path), "--resume", "--set", "train.max_steps=30", env=env)
    s = succeeded(store, job)
    assert s["resumed_from"] == 20 and s["steps"] == 30, s
    steps = [r["step"] for r in runinfo.read_metrics(Storage(store).run_dir(job) / "metrics.jsonl")]
    assert steps[-10:] == list(range(21, 31))
    assert (Storage(store).run_dir(job) / "checkpoints" / "step_30" / "model.pt").is_file()


def test_a_two_node_job_survives_a_killed_worker_and_resumes_on_relaunch(
    pydoc_storage: Path, tmp_path: Path
) -> None:
    """2 nodes x 1 worker on the CPU device, checkpoints every 5 of 20 steps; rank 1 is
    SIGKILLed once checkpoint 5 is published, and the job goes on from it, not from step 0."""
    job = "stack-cpu"
    path = job_file(tmp_path, job, 'train.device="cpu"')
    launch(pydoc_storage, str(path), env=FAULT_ENV)
    run = RunPaths(Storage(pydoc_storage).run_dir(job))
    wait_for(lambda: max(export.checkpoints(run), default=0) >= 5, 900, "checkpoint 5")
    st = state.read(run.state)
    victims = [w for w in runinfo.workers(st) if w.rank == 1]
    assert victims, "rank 1 is running"
    os.kill(victims[0].pid, signal.SIGKILL)
    s = succeeded(pydoc_storage, job)
    assert s["restarts"] == 1 and s["steps"] == 20 and s["world_size"] == 2
    assert s["resumed_from"] is not None and s["resumed_from"] >= 5
    assert sorted(export.checkpoints(run))[-1] == 20
    resumed_to_30(pydoc_storage, job, path, env=FAULT_ENV)


@needs_xla
def test_an_xla_job_saves_every_5_steps_and_resumes_on_relaunch(
    pydoc_storage: Path, tmp_path: Path
) -> None:
    job = "stack-xla"
    path = job_file(tmp_path, job, 'train.device="xla"', "job.nnodes=1", "job.nproc_per_node=1")
    launch(pydoc_storage, str(path), env=XLA_ENV)
    s = succeeded(pydoc_storage, job)
    assert s["device"] == "xla" and s["steps"] == 20 and s["restarts"] == 0
    ckpts = Storage(pydoc_storage).run_dir(job) / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_15", "step_20"]
    resumed_to_30(pydoc_storage, job, path, env=XLA_ENV)


@needs_xla
def test_precompile_of_the_xla_job_runs_to_its_end(pydoc_storage: Path, tmp_path: Path) -> None:
    """The precompile job ends with a checkpoint save too (where torch 2.9 crashed)."""
    job = "stack-pre"
    path = job_file(tmp_path, job, 'train.device="xla"', "job.nnodes=1", "job.nproc_per_node=1")
    result = run_cli(
        "precompile",
        str(path),
        "--storage",
        str(pydoc_storage),
        "--steps",
        "2",
        "--json",
        env=XLA_ENV,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout)
    assert outcome, result.stdout
    pre = Storage(pydoc_storage).run_dir(f"{job}-precompile")
    assert json.loads((pre / "summary.json").read_text())["steps"] == 2
    cacheset = Storage(pydoc_storage).cache_dir(jobfile.load(path).train.cacheset)
    assert (cacheset / "fingerprint.json").is_file()  # rank 0 wrote it at the end
