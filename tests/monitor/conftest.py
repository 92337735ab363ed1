"""Fixtures: real local runs (the CLI itself: tests/conftest.py run_cli)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.backends.kubernetes.conftest import fake  # noqa: F401 - the fake Kubernetes API, for kubernetes paths
from tests.conftest import run_cli
from trainmaster.monitor import runinfo
from trainmaster.run import state
from trainmaster.storage import Storage

# Small and quick on 2 cores: bert-tiny, 2 nodes x 1 worker, 4 sequences per step.
FAST = [
    "train.batch_size=2",
    "train.global_batch_size=4",
    "train.warmup_steps=2",
    "train.checkpoint_every=1000",
]
REPORT_STEPS = 12


def job_file(folder: Path, name: str, *sets: str) -> Path:
    path = folder / f"{name}.toml"
    args = ["init", "--preset", "local-cpu", "--out", str(path), "--set", f'job.name="{name}"']
    for s in [*FAST, *sets]:
        args += ["--set", s]
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    return path


def last_step(store: Path, job: str) -> int:
    rows = runinfo.read_metrics(Storage(store).run_dir(job) / "metrics.jsonl")
    return int(rows[-1]["step"]) if rows else 0


@pytest.fixture(scope="session")
def finished_run(pydoc_storage: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(storage, job): a real 2-node local job of REPORT_STEPS steps, run to the end."""
    job = "monitored"
    path = job_file(tmp_path_factory.mktemp("monitor-job"), job, f"train.max_steps={REPORT_STEPS}")
    result = run_cli("launch", str(path), "--storage", str(pydoc_storage), "--follow", timeout=600)
    assert result.returncode == 0, result.stderr
    assert state.read(Storage(pydoc_storage).run_dir(job) / "state.json").phase == "succeeded"
    return pydoc_storage, job
