"""A run's counters, and the rules that combine their sources, stated once.

`status`, `status --json`, `list`, `report`, summary.json and /metrics show the same counts
from different sources (the timeline while a job runs, torchrun's own count at its end, the
launcher's or Volcano's retries). Each rule below is the one place that says how they combine,
so the figures agree with each other and a counter never goes down while the job runs (a
Prometheus counter that falls reads as a reset).

    counter           sources                                   rule
    processes         rank 0's `start` events since the launch  counted; a rollback keeps its
                      (the timeline)                            process (processes())
    agent restarts    TORCHELASTIC_RESTART_COUNT of each node's the largest: each agent counts
                      torchrun agent                            the same restarts (agents())
    job_retries       the local launcher ($TRAINMASTER_JOB_RET- as said: only the launcher
                      RIES, state.json), Volcano's retryCount   counts them (job_retries())
    restarts of the   processes - 1 - job_retries while it      the largest of them, never
    worker group      runs; the agents' count in summary.json   below 0: never falls when the
                      or rank0.json once there                  summary comes (worker_group())
    restarts (status) worker group + job_retries                summed, each at least 0
                                                                (training_restarts())
    goodput restarts  processes - 1: a gang retry's trainer     counted (trainer_restarts()):
                      starts again too, and its gap is          the restarts whose time goodput
                      restart time                              calls `restart`
    rollbacks         rollback events (goodput), verdicts in    counted; their steps lost
                      rollbacks.jsonl (status: divergence.py)   summed
    steps lost        steps a later process or rollback redid   summed over steps windows
    saves             the trainer's background writes (`save`), counted (saves.stats)
                      a script's checkpoint_saved (`saved`)
    preemptions,      lines of preemptions.jsonl, hangs.jsonl   counted
    hangs
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

from trainmaster.run import timeline
from trainmaster.run.timeline import End, Event, Start

JOB_RETRIES_ENV = "TRAINMASTER_JOB_RETRIES"  # whole-gang restarts after a lost node, so far


def processes(events: Iterable[Event], launched_at: float | None = None) -> int:
    """Rank 0's trainer processes started since the launch. Without its time (a Kubernetes
    job's folder, which keeps the timeline of every launch of the job): those since the end of
    the launch before the newest process (the `end` a finished trainer records)."""
    evs = list(events)
    if launched_at is None:
        starts = [float(e.t) for e in evs if isinstance(e, Start)]
        ends = [float(e.t) for e in evs if isinstance(e, End)]
        before = [t for t in ends if starts and t < max(starts)]
        launched_at = max(before) if before else None
    return trainer_processes(timeline.attempts(evs, launched_at))


def trainer_processes(attempts: Iterable[timeline.Attempt]) -> int:
    """A rollback goes on in the same process: it is no new one."""
    return sum(not a.rollback for a in attempts)


def trainer_restarts(attempts: Iterable[timeline.Attempt]) -> int:
    """goodput's `restarts`: every trainer process after the first, whoever started it."""
    return trainer_processes(attempts) - 1


def rollbacks(attempts: Iterable[timeline.Attempt]) -> int:
    """goodput's `rollbacks`: the running trainer rolled back to a checkpoint (this launch)."""
    return sum(a.rollback for a in attempts)


def agents(counts: Iterable[int]) -> int:
    """The job's restarts from its node agents' own counts (TORCHELASTIC_RESTART_COUNT): every
    agent restarts its workers with the group, so each counts them all; the largest is the
    job's (an agent that joined later counts fewer)."""
    return max(counts, default=0)


def job_retries(environ: Mapping[str, str] = os.environ) -> int:
    """summary.json's `job_retries`: how often the launcher restarted the whole job."""
    raw = environ.get(JOB_RETRIES_ENV, "")
    return int(raw) if raw.isdigit() else 0


def worker_group(processes: int, job_retries: int, *said: Mapping[str, Any] | None) -> int:
    """Restarts of the worker group: while it runs, rank 0's trainer processes less one, less
    the whole-gang retries (each starts rank 0 again, and is job_retries); at the end the
    agents' own count (summary.json's or rank0.json's `restarts`) where larger, so it never
    falls when the summary comes. Never below 0."""
    counts = [int(src["restarts"]) for src in said if src and _count(src.get("restarts"))]
    return max([processes - job_retries - 1, *counts, 0])


def training_restarts(worker_group: int, job_retries: int) -> int:
    """`restarts` in `status` and `status --json`, the same on every backend: every restart of
    the training in this launch, whoever made it: the worker group's (torchrun's
    --max-restarts, worker_group()) and the whole gang's (job_retries: the local launcher's job
    retry after a lost node, Volcano's RestartJob on Kubernetes), which JobStatus.job_retries
    also gives alone."""
    return max(0, worker_group) + max(0, job_retries)


def _count(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
