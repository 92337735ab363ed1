"""Fixtures: the `trainmaster` command and real local runs.

`tm(...)` runs `python -m trainmaster ARGS` as a user would.
"""

from __future__ import annotations

import os
import subprocess
import sys
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


def tm_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainmaster", *args]


def tm_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **(extra or {})}


def tm(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        tm_cmd(*args), env=tm_env(env), capture_output=True, text=True, timeout=timeout
    )


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


def one_line_error(result: subprocess.CompletedProcess[str], text: str) -> None:
    """Bad input: exit 2, exactly one line on stderr, saying `text`."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and text in lines[0], result.stderr


@pytest.fixture(scope="session")
def finished_run(pydoc_storage: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(storage, job): a real 2-node local job of REPORT_STEPS steps, run to the end."""
    job = "monitored"
    path = job_file(tmp_path_factory.mktemp("monitor-job"), job, f"train.max_steps={REPORT_STEPS}")
    result = run_cli("launch", str(path), "--storage", str(pydoc_storage), "--follow", timeout=600)
    assert result.returncode == 0, result.stderr
    assert state.read(Storage(pydoc_storage).run_dir(job) / "state.json").phase == "succeeded"
    return pydoc_storage, job
