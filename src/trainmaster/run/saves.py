"""summary.json's `checkpoint_saves`: the checkpoint writes of a run and how long training stood
still for them, from the timeline's `save` and `checkpoint` events (run/timeline.py).

The writes overlap training (the background writer); the stand-stills are goodput's
`checkpoint` time, here split per save: the median save is what a user tunes
checkpoint_every against, the end's wait for the last write is a cost paid once.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from trainmaster.run.timeline import Checkpoint, End, Event, Save, Start, Steps

SaveKey = tuple[int, int | None]  # (the trainer run, counted by start events; the step saved)


def stats(events: Iterable[Event], *, launched_at: float | None = None) -> dict[str, Any]:
    """The writes (background; MB/s over their time) and how long training stood still for
    them: in all (blocked_s), per save while training went on (the median and the largest of
    each save's waits: staging, then the copy's rest before the next update), and at the end
    (final_wait_s: the last save and the wait for its write, which the trainer marks `final`;
    nothing trains after it). A save is one step's waits in one trainer run (between start
    events): a restart that saves the step again is another. The count: the trainer's
    background writes and a script's checkpoint_saved calls (counters.py)."""
    evs = [e for e in events if launched_at is None or e.t >= launched_at]
    saves = [e for e in evs if isinstance(e, Save)]
    waits = [e for e in evs if isinstance(e, Checkpoint)]
    stalls = [e.end - e.t for e in waits]
    per_key: dict[SaveKey, float] = {}
    ends: list[SaveKey] = []
    said: set[SaveKey] = set()
    run, last = 0, None
    for e in evs:
        if isinstance(e, Start):
            run += 1
        elif isinstance(e, Checkpoint):
            key = last = (run, e.step)
            per_key[key] = per_key.get(key, 0.0) + e.end - e.t
            if e.final and key not in ends:
                ends.append(key)
            if e.saved:  # a custom script writes no background `save`: each is a save it made
                said.add(key)
    if last is not None and not any(e.final for e in waits):
        # A finished run of a trainer before `final`: its end is its last save when nothing
        # trained after it and the trainer ended after it (a run still going, or killed, has
        # no end event there: its last save is one made while training).
        steps = [e.end for e in evs if isinstance(e, Steps)]
        ended = any(isinstance(e, End) and e.t >= waits[-1].t for e in evs)
        if steps and ended and waits[-1].t >= max(steps):
            ends.append(last)
    per_save = {k: v for k, v in per_key.items() if k not in ends}
    final_wait = per_key[ends[-1]] if ends else 0.0  # the last run's end: the last write
    secs = [e.end - e.t for e in saves]
    total_bytes = sum(e.bytes for e in saves)
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
