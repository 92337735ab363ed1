"""Helpers of the compile-cache tests: the real CLI in a subprocess, job files, summaries."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import run_cli
from trainmaster.storage import Storage

# One thread per worker on 2 shared cores; dropout as BERT's (graphs do not depend on it).
RUN_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "NO_COLOR": "1", "COLUMNS": "200"}


def tm(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """run_cli with one thread per worker (RUN_ENV)."""
    return run_cli(*args, env={**RUN_ENV, **(env or {})}, timeout=timeout)


def job_file(folder: Path, name: str, *sets: str) -> Path:
    """bert-tiny on the built-in corpus, 1 node x 1 worker, compile on, a few steps."""
    path = folder / f"{name}.toml"
    base = [
        f'job.name="{name}"',
        "job.nnodes=1",
        "job.nproc_per_node=1",
        "job.max_restarts=0",
        "train.batch_size=8",
        "train.global_batch_size=16",
        "train.max_steps=3",
        "train.warmup_steps=1",
        "train.compile=true",
        f'train.cacheset="{name}"',
    ]
    args = ["init", "--preset", "local-cpu", "--out", str(path)]
    for s in [*base, *sets]:
        args += ["--set", s]
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    return path


def summary(store: Path, job: str) -> dict[str, Any]:
    return json.loads((Storage(store).run_dir(job) / "summary.json").read_text())
