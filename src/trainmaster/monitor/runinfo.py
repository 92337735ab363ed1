"""Read what a run left in its folder: state, metrics, summary, rank 0, worker processes.

Everything here is read-only and works from any shell, while the job runs or long after.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainmaster.config import JobConfig, jobfile
from trainmaster.errors import UserError
from trainmaster.run import counters, divergence, goodput, segments, state, timeline
from trainmaster.run import metrics as runlog
from trainmaster.run.processes import Worker, workers
from trainmaster.storage import RunPaths, Storage
from trainmaster.train import preempt, watchdog


def run_paths(store: Storage, job: str) -> RunPaths:
    run = RunPaths(store.run_dir(job))
    if not run.state.exists():
        known = ", ".join(list_jobs(store)) or "none"
        raise UserError(
            f"no job {job!r} under {store.runs} (jobs: {known}); "
            "check --storage or `trainmaster list`",
            where="JOB",
        )
    return run


def run_folders(store: Storage) -> list[str]:
    """Every run folder under the storage root, by name: the one lister. A folder may hold a
    run this machine did not launch (a Kubernetes job's, on shared storage: no state.json)."""
    runs = store.runs
    return sorted(p.name for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []


def list_jobs(store: Storage) -> list[str]:
    """The run folders of jobs launched from here: those with a state.json (`list`)."""
    return [j for j in run_folders(store) if RunPaths(store.run_dir(j)).state.exists()]


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's rows: JSON objects with a numeric `step` (run/metrics.py has the format).

    A last line being written right now, and lines a custom script wrote in another shape,
    are skipped; every other key is optional (a custom script need not log loss or seq_per_s).
    """
    return [row for row in runlog.read_jsonl(path) if _is_num(row.get("step"))]


def _is_num(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def max_steps_of(cfg: JobConfig | None, rows: list[dict[str, Any]]) -> int | None:
    """Steps the run is heading for: train.max_steps for the built-in trainer; for a custom
    entrypoint the `max_steps` its newest row logged, if any (train.* are not its settings)."""
    if cfg is not None and cfg.job.builtin:
        return cfg.train.max_steps
    for row in reversed(rows):
        if _is_num(row.get("max_steps")) and int(row["max_steps"]) > 0:
            return int(row["max_steps"])
    return None


@dataclass
class Status:
    state: state.RunState
    last: dict[str, Any] | None
    summary: dict[str, Any] | None
    rank0: dict[str, Any] | None
    workers: list[Worker] = field(default_factory=list)
    max_steps: int | None = None
    eta_s: float | None = None
    hangs: list[watchdog.Hang] = field(default_factory=list)
    preemptions: int = 0  # SIGTERMs honoured with a checkpoint (not failures)
    processes: int = 0  # rank 0's trainer processes started in this launch (its timeline)
    divergence: dict[str, Any] = field(default_factory=lambda: divergence.summary(None))

    @property
    def restarts(self) -> int:
        """The worker group's (run/counters.py worker_group)."""
        return counters.worker_group(
            self.processes, self.state.job_retries, self.summary, self.rank0
        )


def status(store: Storage, job: str) -> Status:
    run = run_paths(store, job)
    return status_of(run, state.observed(run.state))


def status_of(run: RunPaths, st: state.RunState) -> Status:
    """A run folder's story given its state (state.json, or a Kubernetes pod's own view)."""
    rows = read_metrics(run.metrics)
    last = rows[-1] if rows else None
    cfg = None
    with contextlib.suppress(UserError):
        cfg = jobfile.load(run.job_toml)
    max_steps = max_steps_of(cfg, rows)
    events = timeline.read(run.timeline)
    launched = launch_time(st)
    eta = None
    per_step = segments.step_s(rows, timeline.resume_steps(events))  # this process's own clock
    if last and max_steps and per_step is not None and len(rows) >= 2 and st.phase == "running":
        eta = per_step * max(0, max_steps - int(last["step"]))
    return Status(
        st,
        last,
        summary_of_launch(run, st),
        read_json(run.rank0),
        workers(st) if st.phase == "running" else [],
        max_steps,
        eta,
        watchdog.read_hangs(run.hangs),
        len(preempt.read(run.preemptions)),
        counters.processes(events, launched),
        divergence.summary(run.rollbacks),
    )


def launch_time(st: state.RunState) -> float | None:
    """When this launch began: state.json's start, or its creation while the local supervisor
    has not started the agents yet (a pending launch: nothing of an earlier one is its own).
    None for a Kubernetes job's folder read in its pod (no state.json there)."""
    if st.started_at is not None:
        return st.started_at
    return st.created_at if st.backend == "local" else None


def goodput_of(events: list[timeline.Event], st: state.RunState | None) -> goodput.Goodput | None:
    """Goodput over the one window `report`, `status` and /metrics share (goodput.of_run): this
    launch to the end state.json records, or now while it runs."""
    if st is None:
        return goodput.of_run(events, None, None)
    return goodput.of_run(events, launch_time(st), st.finished_at, running=st.phase == "running")


def summary_of_launch(run: RunPaths, st: state.RunState) -> dict[str, Any] | None:
    """summary.json when this launch's workers wrote it; one left by an earlier launch of the
    same job (`launch --resume`, older than this launch) is not this run's end. A folder without
    a launch time (a Kubernetes job's, read in its pod) takes the one it has."""
    launched = launch_time(st)
    try:
        if launched is not None and run.summary.stat().st_mtime < launched:
            return None
    except OSError:
        return None
    return read_json(run.summary)


HANGS_SHOWN = 4


def hang_lines(s: Status) -> list[str]:
    """The newest hangs the watchdogs caught (each hung rank of an attempt reports its own:
    the stuck one, and its peers waiting for it in a collective)."""
    lines = [f"hang: {h.describe()} (stacks in logs/{h.dump})" for h in s.hangs[-HANGS_SHOWN:]]
    if lines:
        lines.append(
            f"hung workers exit for a restart from the last checkpoint; {len(s.hangs)} "
            "hang report(s) in this run (hangs.jsonl)"
        )
    return lines


def divergence_lines(s: Status) -> list[str]:
    """The stop of a run that diverged (run/divergence.py), while it is its newest verdict."""
    last = s.divergence["diverged"]
    if not last or last.get("action") != "stop" or s.state.phase == "running":
        return []
    return [f"stopped: {last.get('line') or 'training diverged (rollbacks.jsonl)'}"]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if 1e3 <= abs(value) < 1e9 else f"{value:.4g}"
    return str(value)


SHOWN = 6  # values of the newest row shown after its step


def progress_text(s: Status) -> str:
    """`step 40/200  loss 2.31  seq_per_s 51.2  restarts 1`: the newest metrics row, whatever
    keys it has (built-in rows: loss and seq/s first), and the restarts (counters.py
    training_restarts),
    metrics or not."""
    parts = []
    if s.last is not None:
        step = int(s.last["step"])
        parts.append(f"step {step}/{s.max_steps}" if s.max_steps else f"step {step}")
        skip = {"step", "max_steps", "elapsed_s", "mlm_loss", "nsp_loss", "mfu", "resumed_from"}
        if "seq_per_s" in s.last:
            skip.add("tokens_per_s")
        keys: list[str] = [k for k in ("loss", "seq_per_s") if k in s.last]
        keys += [k for k in s.last if k not in skip and k not in keys]
        shown = [f"{k} {_fmt(s.last[k])}" for k in keys[:SHOWN] if s.last[k] is not None]
        if _is_num(s.last.get("mfu")):  # a share of the device's peak, next to the rate
            at = next((i + 1 for i, t in enumerate(shown) if t.startswith("seq_per_s ")), 0)
            shown.insert(at or len(shown), f"mfu {s.last['mfu']:.0%}")
        parts += shown
    parts.append(f"restarts {counters.training_restarts(s.restarts, s.state.job_retries)}")
    if s.preemptions:
        parts.append(f"preemptions {s.preemptions} (SIGTERM, checkpointed)")
    if s.divergence["rollbacks"]:
        lost = s.divergence["rollback_steps_lost"]
        parts.append(f"rollbacks {s.divergence['rollbacks']} ({lost} steps taken back)")
    return "  ".join(parts)


def summary_text(s: Status) -> str | None:
    """summary.json in one line: the keys it has (a custom script's holds status and restarts)."""
    if not s.summary:
        return None
    names = {"steps": "steps", "final_loss": "final loss", "avg_seq_per_s": "seq/s average"}
    parts = [str(s.summary.get("status", "?"))]
    parts += [f"{names[k]} {_fmt(s.summary[k])}" for k in names if s.summary.get(k) is not None]
    return "summary: " + ", ".join(parts)
