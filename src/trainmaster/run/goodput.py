"""Goodput (docs/architecture.md 3.9): where a run's wall time went, from the events rank 0
records in timeline.jsonl (run/timeline.py has every kind and field).

breakdown() lays the events out as one timeline from launch to end in which every second is in
exactly one category, so the parts always add up to the wall time. A checkpoint wait inside a
steps window (the copy's rest before the next update; a GPU's wait, placed at the end of the
window it was read in) is cut out of that window where it falls: checkpoint time, not training,
as saves.stats counts it per save. Its counts (restarts, rollbacks) follow run/counters.py. No
torch here: `report` (operator side) and the trainer (for summary.json) share this module.

The writers' face stays here (record, the launch's environment variables, summary_fields), so
that train/ and the local supervisor call one module for their events.
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmaster.run import counters, saves, timeline
from trainmaster.run.counters import JOB_RETRIES_ENV as JOB_RETRIES_ENV  # the writers' face
from trainmaster.run.counters import job_retries as job_retries
from trainmaster.run.timeline import LAUNCHED_AT_ENV as LAUNCHED_AT_ENV
from trainmaster.run.timeline import Checkpoint, Event, Steps
from trainmaster.run.timeline import launched_at_from as launched_at_from
from trainmaster.run.timeline import read as read
from trainmaster.run.timeline import record as record
from trainmaster.run.timeline import resume_steps as resume_steps

KINDS = ("startup", "compile", "productive", "lost", "checkpoint", "restart", "other")


@dataclass(frozen=True)
class Span:
    kind: str
    start: float  # seconds since launch
    end: float


@dataclass(frozen=True)
class Goodput:
    wall: float
    seconds: dict[str, float]
    steps_lost: int
    restarts: int
    spans: tuple[Span, ...]
    rollbacks: int = 0

    @property
    def ratio(self) -> float:
        return self.seconds["productive"] / self.wall if self.wall > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """summary.json's `goodput`: seconds per category, the ratio, the counts."""
        return {
            "wall": round(self.wall, 3),
            **{k: round(v, 3) for k, v in self.seconds.items()},
            "ratio": round(self.ratio, 4),
            "steps_lost": self.steps_lost,
            "restarts": self.restarts,
            "rollbacks": self.rollbacks,
        }


def _per_step(windows: list[Steps]) -> list[float]:
    return [(w.end - w.t) / w.count for w in windows]


def _steady(attempts: list[timeline.Attempt]) -> dict[int, float | None]:
    """Each attempt's median seconds per step, its first window (warm-up/compile) left out;
    an attempt with no other window borrows the median of all the others."""
    own = {}
    for i, a in enumerate(attempts):
        later = [w for w in a.items if isinstance(w, Steps)][1:]
        own[i] = _per_step(later)
    everything = [x for xs in own.values() for x in xs]
    fallback = statistics.median(everything) if everything else None
    return {i: statistics.median(xs) if xs else fallback for i, xs in own.items()}


def breakdown(
    events: Iterable[Event],
    *,
    launched_at: float | None = None,
    ended_at: float | None = None,
) -> Goodput | None:
    """Wall time from launch (default: the first trainer's start) to end (default: the last
    event) split into KINDS; None without a trainer start.

    startup: launch to the run's first step. compile: the first step of a compiling process,
    less a steady step. productive / lost: step time, lost where a later process resumed from
    an earlier step (that work was redone). checkpoint: training stood still for a save.
    restart: from the last event of a process that died to its successor's first step (and of a
    rollback, from the bad step to the first step after it).
    other: logging between steps, and the end (last checksum, summary, exit).
    """
    attempts = timeline.attempts(events, launched_at)
    if not attempts:
        return None
    launch = launched_at if launched_at is not None else attempts[0].start
    last_event = max(
        [a.start for a in attempts] + [float(i.end) for a in attempts for i in a.items]
    )
    end = ended_at if ended_at is not None else last_event
    steady = _steady(attempts)
    spans: list[Span] = []
    lost_steps = 0
    cursor, seen_step = launch, False

    def put(kind: str, t0: float, t1: float) -> None:
        nonlocal cursor
        t0, t1 = max(t0, cursor), min(max(t1, cursor), end)
        if t1 > t0:
            spans.append(Span(kind, t0 - launch, t1 - launch))
        cursor = max(cursor, t1)

    for i, a in enumerate(attempts):
        # A later process that resumed from an earlier step redid the steps after it; one
        # that said nothing and made no step (a script dead at its imports) redid none.
        redo_from = min(
            (b.resumed for b in attempts[i + 1 :] if b.resumed is not None), default=None
        )
        stepping = False
        for item in a.items:
            put("other" if stepping else ("restart" if seen_step else "startup"), cursor, item.t)
            t0, t1 = float(item.t), float(item.end)
            if isinstance(item, Checkpoint):
                put("checkpoint", t0, t1)
                continue
            per, n = steady[i], item.count
            if not stepping and a.compiles and per is not None:
                put("compile", t0, t0 + max(0.0, (t1 - t0) - n * per))
            lost = 0 if redo_from is None else max(0, min(n, item.last - redo_from))
            lost_steps += lost
            split = t1 - (t1 - max(t0, cursor)) * lost / n
            put("productive", cursor, split)
            put("lost", split, t1)
            stepping = seen_step = True
    put("other" if seen_step and stepping else ("restart" if seen_step else "startup"), cursor, end)
    waits = [
        (float(i.t) - launch, float(i.end) - launch)
        for a in attempts
        for i in a.items
        if isinstance(i, Checkpoint)
    ]
    spans = _cut_out(spans, _merged(waits))
    seconds = dict.fromkeys(KINDS, 0.0)
    for s in spans:
        seconds[s.kind] += s.end - s.start
    return Goodput(
        max(0.0, end - launch),
        seconds,
        lost_steps,
        counters.trainer_restarts(attempts),
        tuple(spans),
        counters.rollbacks(attempts),
    )


def of_run(
    events: Iterable[Event],
    started_at: float | None,
    finished_at: float | None,
    *,
    running: bool = False,
    now: float | None = None,
) -> Goodput | None:
    """The one window `report`, `status` and /metrics measure, so that they agree: from the
    launch (runinfo.launch_time: state.json's) to the end it records, or to now while it has
    none; without a launch time (a Kubernetes job's folder), from the first trainer's start to
    now while it runs (a hang lowers it), else to the last event. The trainer's own summary
    stops as it exits: its wall and `other` are shorter."""
    now = time.time() if now is None else now
    if started_at is None:
        return breakdown(events, ended_at=now if running else None)
    return breakdown(events, launched_at=started_at, ended_at=finished_at or now)


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for t0, t1 in sorted(intervals):
        if out and t0 <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], t1))
        elif t1 > t0:
            out.append((t0, t1))
    return out


def _cut_out(spans: list[Span], waits: list[tuple[float, float]]) -> list[Span]:
    """The spans with every checkpoint wait (sorted, disjoint) that falls inside one of another
    kind made a checkpoint span of its own, in place: the total stays the wall time."""
    starts = [w[0] for w in waits]
    out: list[Span] = []
    for s in spans:
        pos, i = s.start, max(0, bisect.bisect_right(starts, s.start) - 1)
        while s.kind != "checkpoint" and i < len(waits) and waits[i][0] < s.end:
            w0, w1 = max(waits[i][0], pos), min(waits[i][1], s.end)
            if w1 > w0:
                if w0 > pos:
                    out.append(Span(s.kind, pos, w0))
                out.append(Span("checkpoint", w0, w1))
                pos = w1
            i += 1
        if s.end > pos:
            out.append(Span(s.kind, pos, s.end))
    return out


def summary_fields(path: Path, step: int) -> dict[str, Any]:
    """summary.json's goodput and checkpoint_saves as the trainer ends (an "end" event now),
    computed as `report` does; report runs on to the end that state.json records."""
    now = time.time()
    timeline.append(path, timeline.End(now, step))
    launched = launched_at_from()
    events = read(path)
    g = breakdown(events, launched_at=launched, ended_at=now)
    return {
        "goodput": g.to_json() if g else None,
        "checkpoint_saves": saves.stats(events, launched_at=launched),
    }
