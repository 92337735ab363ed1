"""A run's progress as one small record: what `status` shows under a job, for both backends.

The local backend computes it from the run folder whenever it is asked. On Kubernetes the run
folder is on the cluster's shared storage, out of the operator's reach: the pod that holds
rank 0 computes the same record from the same folder and publishes it as JSON in the job's
progress ConfigMap (backends/kubernetes/publish.py), where `status` reads it. One function
makes the record, so a job reads the same on a laptop and on a cluster.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from trainmaster.monitor import cost, history, runinfo
from trainmaster.run import checkpoints, counters, state, timeline
from trainmaster.storage import RunPaths

RECORD_VERSION = 1
MAX_METRICS_BYTES = 16 << 10  # a custom script may log any keys; a ConfigMap holds 1 MiB


@dataclass(frozen=True)
class RunProgress:
    step: int | None = None
    max_steps: int | None = None
    loss: float | None = None
    seq_per_s: float | None = None
    fraction: float | None = None  # step / max_steps
    eta_s: float | None = None
    cost_so_far_usd: float | None = None
    cost_to_finish_usd: float | None = None
    restarts: int = 0  # of the worker group (counters.worker_group); status_fields adds the gang's
    preemptions: int = 0
    rollbacks: int = 0
    rollback_steps_lost: int = 0
    hangs: tuple[str, ...] = ()
    metrics: dict[str, Any] = field(default_factory=dict)  # the newest metrics.jsonl row
    summary: dict[str, Any] | None = None  # summary.json once the workers wrote it
    goodput: float | None = None  # productive share of the wall time so far (run/goodput.py)
    last_checkpoint: int | None = None  # the step of the newest complete checkpoint
    notes: tuple[str, ...] = ()  # progress line, cost, hangs, summary: as `status` prints them
    at: float = 0.0  # when it was computed (Unix time)
    rank0_pod: str | None = None  # the pod rank0.json names: on Kubernetes rank 0's (status.py)
    rank0_at: float | None = None  # when that rank 0 wrote rank0.json (its node's clock)

    def to_json(self) -> str:
        record = {"version": RECORD_VERSION, **asdict(self)}
        if len(json.dumps(record["metrics"])) > MAX_METRICS_BYTES:
            record["metrics"] = {k: self.metrics[k] for k in ("step", "loss") if k in self.metrics}
        return json.dumps(record, separators=(",", ":"), allow_nan=False, default=str)

    @classmethod
    def from_json(cls, text: str | None) -> RunProgress | None:
        """The record, or None for none yet, another version's, or not JSON (never an error:
        `status` shows the pods whatever the record says)."""
        try:
            data = json.loads(text or "")
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
            return None
        known = {f.name for f in fields(cls)}
        kept = {k: v for k, v in data.items() if k in known}
        kept["hangs"] = tuple(kept.get("hangs") or ())
        kept["notes"] = tuple(kept.get("notes") or ())
        try:
            return cls(**kept)
        except TypeError:
            return None


def _number(row: dict[str, Any] | None, key: str) -> float | None:
    value = (row or {}).get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def of_status(s: runinfo.Status, run: RunPaths, *, detail: bool = True) -> RunProgress:
    """The record of a run folder read by runinfo; with `detail`, also the progress bar, cost and
    the lines `status` prints (a `list` row leaves them out: one cheap row per job)."""
    last = s.last
    base = RunProgress(
        step=int(last["step"]) if last else None,
        max_steps=s.max_steps,
        loss=_number(last, "loss"),
        seq_per_s=_number(last, "seq_per_s"),
        eta_s=s.eta_s,
        restarts=s.restarts,
        preemptions=s.preemptions,
        rollbacks=s.divergence["rollbacks"],
        rollback_steps_lost=s.divergence["rollback_steps_lost"],
        hangs=tuple(
            f"{h.describe()} (stacks in logs/{h.dump})" for h in s.hangs[-runinfo.HANGS_SHOWN :]
        ),
        metrics={k: v for k, v in (last or {}).items() if _finite(v)},
        summary=s.summary,
        at=time.time(),
        rank0_pod=_text((s.rank0 or {}).get("pod")),
        rank0_at=_number(s.rank0, "started_at"),
    )
    if not detail:
        return base
    notes = [runinfo.progress_text(s)]
    p = cost.progress_of_run(run, s.state, s.max_steps)
    notes += [cost.render(p)] if p else []
    g = runinfo.goodput_of(timeline.read(run.timeline), s.state)
    newest = _last_checkpoint(run)
    said = [f"goodput {g.ratio:.0%} of {cost.duration(g.wall)}"] if g and g.wall > 0 else []
    said += [f"last checkpoint: step {newest}"] if newest is not None else []
    notes += ["  ".join(said)] if said else []
    notes += runinfo.hang_lines(s)
    notes += runinfo.divergence_lines(s)
    summary = runinfo.summary_text(s)
    notes += [summary] if summary else []
    return dataclasses.replace(
        base,
        fraction=p.fraction if p else None,
        eta_s=p.eta_s if p else s.eta_s,
        cost_so_far_usd=p.spent if p else None,
        cost_to_finish_usd=p.to_finish if p else None,
        goodput=round(g.ratio, 4) if g and g.wall > 0 else None,
        last_checkpoint=newest,
        notes=tuple(notes),
    )


def _last_checkpoint(run: RunPaths) -> int | None:
    """The newest complete checkpoint's step: the built-in trainer's carry their meta file; a
    custom script's step_N folders carry none and are complete by their name (worker.py
    publishes each by a rename, as latest_checkpoint() finds them)."""
    newest = checkpoints.latest(run.checkpoints)
    if newest is not None:
        return newest.step
    cfg = history.read_config(run)
    if cfg is None or cfg.job.builtin:
        return None
    return checkpoints.newest_named(run.checkpoints)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _finite(value: object) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def of_folder(run: RunPaths, job: str, phase: state.Phase, job_retries: int = 0) -> RunProgress:
    """The record of a run folder that has no state.json (a Kubernetes job's, read in its pod):
    the node count and price from its job.toml, the time on the nodes from its metrics.
    job_retries: the gang's restarts before this attempt (the pod's Volcano job version), whose
    trainer processes are in the timeline too and are not the worker group's (counters.py)."""
    cfg = history.read_config(run)
    st = state.RunState(
        job=job,
        backend="kubernetes",
        phase=phase,
        nnodes=cfg.job.nnodes if cfg else 1,
        nproc_per_node=cfg.job.nproc_per_node if cfg else 1,
        job_retries=job_retries,
    )
    return of_status(runinfo.status_of(run, st), run)


def status_fields(
    record: RunProgress | None, *, job_retries: int, running: bool, now: float
) -> dict[str, Any]:
    """The fields of a job's status (backends/base.py JobStatus) that its record fills, the same
    for every backend: `restarts` counts the worker group's and the gang's
    (counters.training_restarts), job_retries the gang's alone; the ETA counts down from when the
    record was made and is None unless the job runs. No record: only the restarts are known."""
    worker_group = record.restarts if record else 0
    out: dict[str, Any] = {
        "restarts": counters.training_restarts(worker_group, job_retries),
        "job_retries": job_retries,
    }
    if record is None:
        return out
    eta = record.eta_s
    if eta is not None and running:
        eta = max(0.0, eta - max(0.0, now - record.at))
    return out | {
        "step": record.step,
        "max_steps": record.max_steps,
        "loss": record.loss,
        "seq_per_s": record.seq_per_s,
        "progress": record.fraction,
        "eta_s": eta if running else None,
        "cost_so_far_usd": record.cost_so_far_usd,
        "cost_to_finish_usd": record.cost_to_finish_usd,
        "preemptions": record.preemptions,
        "rollbacks": record.rollbacks,
        "rollback_steps_lost": record.rollback_steps_lost,
        "hangs": record.hangs,
        "goodput": record.goodput,
        "last_checkpoint": record.last_checkpoint,
        "metrics": dict(record.metrics),
        "summary": record.summary,
    }
