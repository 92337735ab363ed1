"""Goodput (docs/architecture.md 3.9): where a run's wall time went, from the events rank 0
records.

metrics.jsonl cannot tell it: a resumed trainer drops the rows of the steps it is about to
redo (so that no step appears twice) and elapsed_s starts again with every process. So rank 0
also appends to runs/JOB/timeline.jsonl, which nothing truncates, one JSON object per line,
all times from time.time():

    {"event": "start", "t": T, "step": S, "compiles": B}     a trainer process began at T (before
                                                             its imports), resuming after step S;
                                                             B: it compiles graphs (compile, XLA)
    {"event": "steps", "t": T0, "end": T1, "first": A, "last": B}
                                                             steps A..B ran from T0 to T1 (one
                                                             host-sync window; on CPU one step)
    {"event": "checkpoint", "t": T0, "end": T1, "step": S}   training stood still for the save of
                                                             step S (gather, wait for the previous
                                                             write, copy to CPU memory, the
                                                             copy's rest before the next update,
                                                             and on a GPU the stream's own wait
                                                             for it, recorded after the next sync
                                                             as [T1 - its length, T1]);
                                                             "final": true on the wait for the
                                                             last write as the trainer ends;
                                                             "saved": true from a custom script's
                                                             checkpoint_saved (a complete save:
                                                             no "save" event follows)
    {"event": "save", "t": T0, "end": T1, "step": S, "bytes": N}
                                                             step S's background write finished
                                                             (it overlapped training)
    {"event": "end", "t": T, "step": S}                      the trainer finished at step S
    {"event": "rollback", "t": T0, "end": T1, "step": B, "to": S}
                                                             a divergence at step B rolled the
                                                             running trainer back to step S
                                                             (run/divergence.py): steps S+1..B
                                                             are lost, T0..T1 is restart time
    {"event": "resume", "t": T, "step": S}                   a custom script resumed after step S
                                                             (its start event has no step: the shim
                                                             learns it from latest_checkpoint())

breakdown() lays the events out as one timeline from launch to end in which every second is in
exactly one category, so the parts always add up to the wall time. A checkpoint wait inside a
steps window (the copy's rest before the next update; a GPU's wait, placed at the end of the
window it was read in) is cut out of that window where it falls: checkpoint time, not training,
as save_stats counts it per save. No torch here: `report` (operator side) and the trainer (for
summary.json) share this module.
"""

from __future__ import annotations

import bisect
import json
import os
import statistics
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainmaster.run import metrics as runlog

KINDS = ("startup", "compile", "productive", "lost", "checkpoint", "restart", "other")
LAUNCHED_AT_ENV = "TRAINMASTER_LAUNCHED_AT"  # set by the local supervisor for its agents
JOB_RETRIES_ENV = "TRAINMASTER_JOB_RETRIES"  # whole-gang restarts after a lost node, so far


def record(path: Path, event: str, **fields: Any) -> None:
    """Append one event as one O_APPEND write (whole lines even with the writer thread)."""
    line = (json.dumps({"event": event, **fields}) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read(path: Path) -> list[dict[str, Any]]:
    """The events of a timeline file; a torn last line (a killed writer) is skipped."""
    return [
        ev
        for ev in runlog.read_jsonl(path)
        if isinstance(ev.get("t"), (int, float)) and "event" in ev
    ]


def job_retries(environ: Mapping[str, str] = os.environ) -> int:
    """summary.json's `job_retries`: how often the launcher restarted the whole job."""
    raw = environ.get(JOB_RETRIES_ENV, "")
    return int(raw) if raw.isdigit() else 0


def launched_at_from(environ: Mapping[str, str] = os.environ) -> float | None:
    """When the launcher started the job's agents (None: not said, e.g. on Kubernetes)."""
    raw = environ.get(LAUNCHED_AT_ENV, "")
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


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


@dataclass
class _Attempt:
    """One trainer process (of rank 0): its start, and its steps and checkpoints in time order."""

    start: float
    resumed: int | None  # a script that did not say: before its first step (None: no step)
    compiles: bool
    items: list[dict[str, Any]] = field(default_factory=list)
    rollback: bool = False  # the same process, rolled back (not a restart)


def _attempts(events: Iterable[dict[str, Any]], launched: float | None) -> list[_Attempt]:
    out: list[_Attempt] = []
    for ev in sorted(events, key=lambda e: float(e["t"])):
        if ev["event"] == "start":
            step = ev.get("step")
            resumed = int(step) if isinstance(step, int) else None
            out.append(_Attempt(float(ev["t"]), resumed, bool(ev.get("compiles"))))
        elif out and ev["event"] == "rollback" and isinstance(ev.get("to"), int):
            out.append(_Attempt(float(ev["t"]), int(ev["to"]), False, rollback=True))
        elif out and ev["event"] == "resume" and isinstance(ev.get("step"), int):
            out[-1].resumed = int(ev["step"])
        elif (
            out
            and ev["event"] in ("steps", "checkpoint")
            and isinstance(ev.get("end"), (int, float))
        ):
            out[-1].items.append(ev)
    for a in out:
        if a.resumed is None:  # a script's: before its first step; None if it made none
            first = [int(i["first"]) - 1 for i in a.items if i["event"] == "steps"]
            a.resumed = first[0] if first else None
    # An earlier launch of the same job (`launch --resume`) is not part of this one's wall time.
    return [a for a in out if launched is None or a.start >= launched]


def _per_step(windows: list[dict[str, Any]]) -> list[float]:
    return [(w["end"] - w["t"]) / (w["last"] - w["first"] + 1) for w in windows]


def _steady(attempts: list[_Attempt]) -> dict[int, float | None]:
    """Each attempt's median seconds per step, its first window (warm-up/compile) left out;
    an attempt with no other window borrows the median of all the others."""
    own = {}
    for i, a in enumerate(attempts):
        later = [w for w in a.items if w["event"] == "steps"][1:]
        own[i] = _per_step(later)
    everything = [x for xs in own.values() for x in xs]
    fallback = statistics.median(everything) if everything else None
    return {i: statistics.median(xs) if xs else fallback for i, xs in own.items()}


def breakdown(
    events: Iterable[dict[str, Any]],
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
    attempts = _attempts(events, launched_at)
    if not attempts:
        return None
    launch = launched_at if launched_at is not None else attempts[0].start
    last_event = max(
        [a.start for a in attempts] + [float(i["end"]) for a in attempts for i in a.items]
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
            put("other" if stepping else ("restart" if seen_step else "startup"), cursor, item["t"])
            t0, t1 = float(item["t"]), float(item["end"])
            if item["event"] == "checkpoint":
                put("checkpoint", t0, t1)
                continue
            per = steady[i]
            if not stepping and a.compiles and per is not None:
                n = item["last"] - item["first"] + 1
                put("compile", t0, t0 + max(0.0, (t1 - t0) - n * per))
            lost = (
                0
                if redo_from is None
                else max(0, min(item["last"] - item["first"] + 1, item["last"] - redo_from))
            )
            lost_steps += lost
            split = t1 - (t1 - max(t0, cursor)) * lost / (item["last"] - item["first"] + 1)
            put("productive", cursor, split)
            put("lost", split, t1)
            stepping = seen_step = True
    put("other" if seen_step and stepping else ("restart" if seen_step else "startup"), cursor, end)
    waits = [
        (float(i["t"]) - launch, float(i["end"]) - launch)
        for a in attempts
        for i in a.items
        if i["event"] == "checkpoint"
    ]
    spans = _cut_out(spans, _merged(waits))
    seconds = dict.fromkeys(KINDS, 0.0)
    for s in spans:
        seconds[s.kind] += s.end - s.start
    rolled = sum(a.rollback for a in attempts)
    restarts = len(attempts) - rolled - 1
    return Goodput(max(0.0, end - launch), seconds, lost_steps, restarts, tuple(spans), rolled)


def of_run(
    events: Iterable[dict[str, Any]],
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


def processes(events: Iterable[dict[str, Any]], launched_at: float | None = None) -> int:
    """Rank 0's trainer processes started since the launch. Without its time (a Kubernetes
    job's folder, which keeps the timeline of every launch of the job): those since the end of
    the launch before the newest process (the `end` a finished trainer records)."""
    evs = list(events)
    if launched_at is None:
        starts = [float(e["t"]) for e in evs if e["event"] == "start"]
        ends = [float(e["t"]) for e in evs if e["event"] == "end"]
        before = [t for t in ends if starts and t < max(starts)]
        launched_at = max(before) if before else None
    return sum(not a.rollback for a in _attempts(evs, launched_at))


def resume_steps(events: Iterable[dict[str, Any]], launched_at: float | None = None) -> list[int]:
    """The step each trainer process (since the launch, if given) started after, in time
    order (0 for a fresh start; a process that made no step and did not say is left out): the
    first metrics row of a process is the step after it, which tells a restart even where
    elapsed_s does not go back."""
    return [a.resumed for a in _attempts(events, launched_at) if a.resumed is not None]


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


def save_stats(
    events: Iterable[dict[str, Any]], *, launched_at: float | None = None
) -> dict[str, Any]:
    """summary.json's `checkpoint_saves`: the writes (background; MB/s over their time) and
    how long training stood still for them: in all (blocked_s), per save while training went
    on (the median and the largest of each save's waits: staging, then the copy's rest before
    the next update), and at the end (final_wait_s: the last save and the wait for its write,
    which the trainer marks `final`; nothing trains after it). A save is one step's waits in
    one trainer run (between start events): a restart that saves the step again is another."""
    evs = [e for e in events if launched_at is None or e["t"] >= launched_at]
    saves = [e for e in evs if e["event"] == "save" and isinstance(e.get("end"), (int, float))]
    waits = [e for e in evs if e["event"] == "checkpoint" and "end" in e]
    stalls = [e["end"] - e["t"] for e in waits]
    # One save's waits: the same step in the same trainer run (a restart may save it again).
    per_key: dict[tuple[int, Any], float] = {}
    ends: list[tuple[int, Any]] = []
    keyed: list[tuple[tuple[int, Any], dict[str, Any]]] = []
    run, last = 0, None
    for e in evs:
        if e["event"] == "start":
            run += 1
        elif e["event"] == "checkpoint" and "end" in e:
            key = last = (run, e.get("step"))
            keyed.append((key, e))
            per_key[key] = per_key.get(key, 0.0) + e["end"] - e["t"]
            if e.get("final") and key not in ends:
                ends.append(key)
    if last is not None and not any("final" in e for e in waits):
        # A finished run of a trainer before `final`: its end is its last save when nothing
        # trained after it and the trainer ended after it (a run still going, or killed, has
        # no end event there: its last save is one made while training).
        steps = [e["end"] for e in evs if e["event"] == "steps" and "end" in e]
        ended = any(e["event"] == "end" and e["t"] >= waits[-1]["t"] for e in evs)
        if steps and ended and waits[-1]["t"] >= max(steps):
            ends.append(last)
    # A custom script writes no background `save`: each checkpoint_saved is a save it made.
    said = {k for k, e in keyed if e.get("saved")}
    per_save = {k: v for k, v in per_key.items() if k not in ends}
    final_wait = per_key[ends[-1]] if ends else 0.0  # the last run's end: the last write
    secs = [e["end"] - e["t"] for e in saves]
    total_bytes = sum(int(e.get("bytes", 0)) for e in saves)
    return {
        "count": len(saves) + len(said),
        "total_s": round(sum(secs), 3),
        "max_s": round(max(secs), 3) if secs else None,
        "mb": round(total_bytes / 1e6, 3),
        "bytes": total_bytes,
        "mb_per_s": round(total_bytes / 1e6 / sum(secs), 1) if secs and sum(secs) > 0 else None,
        "blocked_s": round(sum(stalls), 3),
        "max_blocked_s": round(max(stalls), 3) if stalls else None,
        "per_save_blocked_s": round(statistics.median(per_save.values()), 3) if per_save else None,
        "max_per_save_blocked_s": round(max(per_save.values()), 3) if per_save else None,
        "final_wait_s": round(final_wait, 3),
    }


def summary_fields(path: Path, step: int) -> dict[str, Any]:
    """summary.json's goodput and checkpoint_saves as the trainer ends (an "end" event now),
    computed as `report` does; report runs on to the end that state.json records."""
    now = time.time()
    record(path, "end", t=now, step=step)
    launched = launched_at_from()
    events = read(path)
    g = breakdown(events, launched_at=launched, ended_at=now)
    return {
        "goodput": g.to_json() if g else None,
        "checkpoint_saves": save_stats(events, launched_at=launched),
    }
