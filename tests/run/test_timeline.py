"""timeline.jsonl's typed events: the lines the writers wrote before the types read back as
them, and the types write the very same lines (run/timeline.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from trainmaster.run import counters, goodput, saves, timeline
from trainmaster.run.timeline import (
    Checkpoint,
    End,
    JobRetry,
    Other,
    Preflight,
    Resume,
    Rollback,
    Save,
    Start,
    Steps,
    WorkerDiedAtExit,
)


def old_record(path: Path, event: str, **fields: Any) -> None:
    """goodput.record as it was before the event types (untyped dicts), verbatim."""
    line = (json.dumps({"event": event, **fields}) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


# Every writer's call, with the arguments in the order its call site passes them.
CALLS: list[tuple[str, dict[str, Any], timeline.Event]] = [
    ("start", {"t": 1.5, "step": 0, "compiles": True}, Start(1.5, 0, True)),  # the trainer
    ("start", {"t": 1.75, "compiles": False}, Start(1.75)),  # a custom script: no step
    ("preflight", {"t": 2.0, "end": 2.25, "nodes": 2}, Preflight(2.0, 2.25, 2)),
    ("resume", {"t": 2.5, "step": 4}, Resume(2.5, 4)),
    ("steps", {"t": 3.0, "end": 4.0, "first": 5, "last": 8}, Steps(3.0, 4.0, 5, 8)),
    ("checkpoint", {"t": 4.0, "end": 4.5, "step": 8}, Checkpoint(4.0, 4.5, 8)),
    ("save", {"t": 4.5, "end": 6.0, "step": 8, "bytes": 3_000_000}, Save(4.5, 6.0, 8, 3_000_000)),
    (
        "checkpoint",
        {"t": 5.0, "end": 5.5, "step": 9, "saved": True},
        Checkpoint(5.0, 5.5, 9, saved=True),
    ),
    (
        "rollback",
        {"t": 6.0, "end": 6.5, "step": 13, "to": 8},
        Rollback(6.0, 6.5, 13, to=8),
    ),
    (
        "checkpoint",
        {"t": 7.0, "end": 9.0, "step": 12, "final": True},
        Checkpoint(7.0, 9.0, 12, final=True),
    ),
    ("end", {"t": 9.5, "step": 12}, End(9.5, 12)),
    (
        "job_retry",
        {"t": 10.0, "node": 1, "step": None, "why": "agent exited"},
        JobRetry(10.0, 1, None, "agent exited"),
    ),
    (
        "worker_died_at_exit",
        {"t": 11.0, "node": 0, "why": "SIGABRT"},
        WorkerDiedAtExit(11.0, 0, "SIGABRT"),
    ),
]


def test_lines_written_the_old_way_read_as_their_events(tmp_path: Path) -> None:
    path = tmp_path / "timeline.jsonl"
    for kind, fields, _ in CALLS:
        old_record(path, kind, **fields)
    assert timeline.read(path) == [want for _, _, want in CALLS]


def test_the_events_write_the_same_bytes_as_the_old_writer(tmp_path: Path) -> None:
    old, new, typed = (tmp_path / n for n in ("old.jsonl", "new.jsonl", "typed.jsonl"))
    for kind, fields, event in CALLS:
        old_record(old, kind, **fields)
        goodput.record(new, kind, **fields)  # the writers' call, unchanged
        timeline.append(typed, event)
    assert new.read_bytes() == old.read_bytes() == typed.read_bytes()


def test_an_older_or_newer_line_reads_and_is_left_out_of_the_figures(tmp_path: Path) -> None:
    """A start without `compiles` (older trainers), a kind this version does not know, a known
    kind without a field it needs, and lines that are no events."""
    path = tmp_path / "timeline.jsonl"
    lines = [
        {"event": "start", "t": 0, "step": 0},
        {"event": "steps", "t": 1, "end": 2, "first": 1, "last": 1},
        {"event": "node_joined", "t": 2.5, "node": 3},
        {"event": "steps", "t": 3, "end": 4, "step": 2},  # no first/last
        {"event": "checkpoint", "t": 4, "step": 2},  # no end
        {"t": 5, "what": "no kind"},
        {"event": "steps", "t": "late"},
        [1, 2],
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    events = timeline.read(path)
    assert events[:2] == [Start(0, 0), Steps(1, 2, 1, 1)]
    others = events[2:]
    assert [type(e) for e in others] == [Other, Other, Other]
    assert [e.to_json() for e in others] == lines[2:5]  # kept as they were
    g, plain = goodput.breakdown(events), goodput.breakdown(events[:2])
    assert g is not None and plain is not None and g.seconds == plain.seconds
    assert saves.stats(events) == saves.stats(events[:2])
    assert counters.processes(events) == 1


def test_a_writer_naming_a_field_its_kind_lacks_fails(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        goodput.record(tmp_path / "t.jsonl", "steps", t=1.0, end=2.0, first=1, lst=1)
    assert not (tmp_path / "t.jsonl").exists()
    goodput.record(tmp_path / "t.jsonl", "a_new_kind", t=1.0, why="later")  # kept as it is
    assert timeline.read(tmp_path / "t.jsonl") == [Other(1.0, "a_new_kind", {"why": "later"})]


def test_a_wrongly_typed_optional_field_is_its_default() -> None:
    """As the readers took them before: a start's step that is no integer is none said."""
    assert timeline.parse({"event": "start", "t": 1, "step": "4"}) == Start(1, None)
    assert timeline.parse({"event": "save", "t": 1, "end": 2, "step": 3}) == Save(1, 2, 3, 0)
    assert timeline.parse({"event": "rollback", "t": 1, "end": 2, "step": 3, "to": None}) == Other(
        1, "rollback", {"end": 2, "step": 3, "to": None}
    )
