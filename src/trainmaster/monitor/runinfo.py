"""Read what a run left in its folder: state, metrics, summary, rank 0, worker processes.

Everything here is read-only and works from any shell, while the job runs or long after.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainmaster import jobfile
from trainmaster.errors import UserError
from trainmaster.launch import state
from trainmaster.launch.procs import Worker, workers
from trainmaster.storage import RunPaths, Storage


def run_paths(store: Storage, job: str) -> RunPaths:
    run = RunPaths(store.run_dir(job))
    if not run.state.exists():
        known = ", ".join(list_jobs(store)) or "none"
        raise UserError(f"no job {job!r} under {store.root / 'runs'} (jobs: {known}); "
                        "check --storage or `trainmaster list`", where="JOB")
    return run


def list_jobs(store: Storage) -> list[str]:
    runs = store.root / "runs"
    return sorted(p.parent.name for p in runs.glob("*/state.json")) if runs.exists() else []


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl, tolerating a last line that is being written right now."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


@dataclass
class Status:
    state: state.RunState
    last: dict[str, Any] | None
    summary: dict[str, Any] | None
    rank0: dict[str, Any] | None
    workers: list[Worker] = field(default_factory=list)
    max_steps: int | None = None
    eta_s: float | None = None

    @property
    def restarts(self) -> int:
        for source in (self.summary, self.rank0):
            if source and "restarts" in source:
                return int(source["restarts"])
        return 0


def status(store: Storage, job: str) -> Status:
    run = run_paths(store, job)
    st = state.observed(run.state)
    rows = read_metrics(run.metrics)
    last = rows[-1] if rows else None
    max_steps = None
    with contextlib.suppress(UserError):
        max_steps = jobfile.load(run.job_toml).train.max_steps
    eta = None
    if last and max_steps and len(rows) >= 2 and st.phase == "running":
        per_step = (rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]) / max(1, rows[-1]["step"] - rows[0]["step"])
        eta = per_step * max(0, max_steps - int(last["step"]))
    return Status(st, last, read_json(run.summary), read_json(run.rank0),
                  workers(st) if st.phase == "running" else [], max_steps, eta)
