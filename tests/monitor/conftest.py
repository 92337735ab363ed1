"""Fixtures: real local runs (the CLI itself: tests/conftest.py run_cli)."""

from __future__ import annotations

from pathlib import Path

from tests.backends.kubernetes.conftest import fake  # noqa: F401 - the fake Kubernetes API, for kubernetes paths
from tests.conftest import run_cli
from trainmaster.monitor import runinfo
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
