"""timeline.jsonl: rank 0's events, one frozen dataclass per kind, and the file they live in.

metrics.jsonl cannot tell where a run's wall time went: a resumed trainer drops the rows of the
steps it is about to redo (so that no step appears twice) and elapsed_s starts again with every
process. So rank 0 also appends to runs/JOB/timeline.jsonl, which nothing truncates, one JSON
object per line, `{"event": KIND, "t": T, ...}`, all times from time.time(). Each kind below
says its fields; the JSON keys are the field names, in their order. Why one class per kind: the
readers (goodput, counters, saves, status, the local supervisor's end watch) once took
`ev.get(...)` apart on their own, each with its own idea of a missing field.

The file format does not change with the classes: parse() reads any line the writers ever
wrote, and to_json() writes the object they wrote (an optional field marked OMIT is left out at
its default, as the writers left it out). A line of a kind this version does not know, or one
that lacks a field its kind needs, reads as Other: kept, and ignored by every figure.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from trainmaster.run import metrics as runlog

LAUNCHED_AT_ENV = "TRAINMASTER_LAUNCHED_AT"  # set by the local supervisor for its agents
OMIT = {"omit_default": True}  # written only when not at its default (as the writers did)


@dataclass(frozen=True)
class Event:
    """One line of the timeline: `t` is when it happened (or began, for a span)."""

    KIND: ClassVar[str] = ""
    t: float

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"event": self.KIND}
        for f in fields(self):
            value = getattr(self, f.name)
            if not (f.metadata.get("omit_default") and value == f.default):
                out[f.name] = value
        return out


@dataclass(frozen=True)
class Start(Event):
    """A trainer process began at t (before its imports), resuming after `step`; a custom
    script's start has no step (its `resume`, or else its first step, says). `compiles`: it
    compiles graphs (torch.compile, XLA), so its first step is partly compilation."""

    KIND = "start"
    step: int | None = field(default=None, metadata=OMIT)
    compiles: bool = False


@dataclass(frozen=True)
class Steps(Event):
    """Steps first..last ran from t to end: one host-sync window (on CPU, one step)."""

    KIND = "steps"
    end: float
    first: int
    last: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True)
class Checkpoint(Event):
    """Training stood still from t to end for the save of `step`: gather, wait for the previous
    write, copy to CPU memory, the copy's rest before the next update, and on a GPU the
    stream's own wait for it (recorded after the next sync as [end - its length, end]).
    `final`: the wait for the last write as the trainer ends; `saved`: a custom script's
    checkpoint_saved (a complete save: no Save follows)."""

    KIND = "checkpoint"
    end: float
    step: int | None
    final: bool = field(default=False, metadata=OMIT)
    saved: bool = field(default=False, metadata=OMIT)


@dataclass(frozen=True)
class Save(Event):
    """Step `step`'s background write ran from t to end (it overlapped training)."""

    KIND = "save"
    end: float
    step: int | None
    bytes: int = 0


@dataclass(frozen=True)
class End(Event):
    """The trainer finished at step `step` (it closes a launch: counters.processes)."""

    KIND = "end"
    step: int | None = None


@dataclass(frozen=True)
class Rollback(Event):
    """A divergence at step `step` rolled the running trainer back to step `to`
    (run/divergence.py): steps to+1..step are lost, t..end is restart time."""

    KIND = "rollback"
    end: float
    step: int | None
    to: int


@dataclass(frozen=True)
class Resume(Event):
    """A custom script resumed after `step` (the shim learns it from latest_checkpoint())."""

    KIND = "resume"
    step: int


@dataclass(frozen=True)
class Preflight(Event):
    """A custom script's node preflight ran from t to end over `nodes` nodes."""

    KIND = "preflight"
    end: float
    nodes: int


@dataclass(frozen=True)
class JobRetry(Event):
    """The local supervisor started the whole gang again after node `node` was lost."""

    KIND = "job_retry"
    node: int
    step: int | None
    why: str


@dataclass(frozen=True)
class WorkerDiedAtExit(Event):
    """The local supervisor stopped node `node`'s agent, stuck after the run's work was done."""

    KIND = "worker_died_at_exit"
    node: int
    why: str


@dataclass(frozen=True)
class Other(Event):
    """A line of a kind this version does not know, or lacking a field its kind needs."""

    kind: str = ""
    data: dict[str, Any] = field(default_factory=dict, hash=False)

    def to_json(self) -> dict[str, Any]:
        return {"event": self.kind, "t": self.t, **self.data}


KINDS: dict[str, type[Event]] = {c.KIND: c for c in (
    Start, Steps, Checkpoint, Save, End, Rollback, Resume, Preflight, JobRetry, WorkerDiedAtExit
)}  # fmt: skip


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


CHECKS = {"float": _is_number, "int": _is_int, "str": lambda v: isinstance(v, str)}


def _field(f: Field[Any], raw: Mapping[str, Any]) -> tuple[bool, Any]:
    """(whether the line gives the field, its value). A flag is its truth; an optional field
    (`X | None`) or one with a default takes that where the line has no usable value; a
    required one makes the line an Other."""
    kind, _, rest = str(f.type).partition(" | ")
    value = raw.get(f.name)
    if kind == "bool":
        return True, bool(value)
    if CHECKS[kind](value):
        return True, value
    if rest == "None":
        return True, None
    if f.default is not MISSING:
        return True, f.default
    return False, None


def parse(raw: Mapping[str, Any]) -> Event | None:
    """One line's object as its event; None without a kind or a numeric `t` (not an event)."""
    kind, t = raw.get("event"), raw.get("t")
    if not isinstance(kind, str) or not isinstance(t, (int, float)) or isinstance(t, bool):
        return None
    cls = KINDS.get(kind)
    if cls is not None:
        values = {}
        for f in fields(cls):
            ok, values[f.name] = _field(f, raw)
            if not ok:
                break
        else:
            return cls(**values)
    return Other(t, kind, {k: v for k, v in raw.items() if k not in ("event", "t")})


def make(kind: str, **values: Any) -> Event:
    """The event a writer names: its class with these fields (a wrong field name is a
    TypeError, as for any dataclass); a kind this version does not know, as Other."""
    cls = KINDS.get(kind)
    if cls is not None:
        return cls(**values)
    t = values.pop("t")
    return Other(t, kind, values)


def append(path: Path, event: Event) -> None:
    """Append one event as one O_APPEND write (whole lines even with the writer thread)."""
    line = (json.dumps(event.to_json()) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def record(path: Path, event: str, **values: Any) -> None:
    """The writers' call (train/, backends/local/): append the event of this kind and fields."""
    append(path, make(event, **values))


def read(path: Path) -> list[Event]:
    """The events of a timeline file in file order; a torn last line (a killed writer) is
    skipped, as is a line that is no event (no kind, no time)."""
    return [e for e in (parse(raw) for raw in runlog.read_jsonl(path)) if e is not None]


def launched_at_from(environ: Mapping[str, str] = os.environ) -> float | None:
    """When the launcher started the job's agents (None: not said, e.g. on Kubernetes)."""
    raw = environ.get(LAUNCHED_AT_ENV, "")
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


@dataclass
class Attempt:
    """One trainer process (of rank 0): its start, and its steps and checkpoints in time order."""

    start: float
    resumed: int | None  # a script that did not say: before its first step (None: no step)
    compiles: bool
    items: list[Steps | Checkpoint] = field(default_factory=list)
    rollback: bool = False  # the same process, rolled back (not a restart)


def attempts(events: Iterable[Event], launched: float | None = None) -> list[Attempt]:
    """The trainer processes since the launch (all, without one), and each rollback of one
    (an Attempt of its own: the steps after it redo the rolled-back ones)."""
    out: list[Attempt] = []
    for ev in sorted(events, key=lambda e: float(e.t)):
        if isinstance(ev, Start):
            out.append(Attempt(float(ev.t), ev.step, ev.compiles))
        elif out and isinstance(ev, Rollback):
            out.append(Attempt(float(ev.t), ev.to, False, rollback=True))
        elif out and isinstance(ev, Resume):
            out[-1].resumed = ev.step
        elif out and isinstance(ev, (Steps, Checkpoint)):
            out[-1].items.append(ev)
    for a in out:
        if a.resumed is None:  # a script's: before its first step; None if it made none
            first = [i.first - 1 for i in a.items if isinstance(i, Steps)]
            a.resumed = first[0] if first else None
    # An earlier launch of the same job (`launch --resume`) is not part of this one's wall time.
    return [a for a in out if launched is None or a.start >= launched]


def resume_steps(events: Iterable[Event], launched_at: float | None = None) -> list[int]:
    """The step each trainer process (since the launch, if given) started after, in time
    order (0 for a fresh start; a process that made no step and did not say is left out): the
    first metrics row of a process is the step after it, which tells a restart even where
    elapsed_s does not go back."""
    return [a.resumed for a in attempts(events, launched_at) if a.resumed is not None]
