"""A run's metrics rows split by the trainer process that wrote them.

`elapsed_s` in metrics.jsonl counts from the start of the trainer process, so it starts again
after every restart: times are summed over segments, one per process lifetime, rather than read
off the last line. Where a segment starts is known two ways: the timeline says after which step
each process started (goodput.resume_steps; its first row is the next step), and elapsed_s goes
back. The timeline is needed where a new process's start-up took longer than its predecessor ran
(an early restart): there elapsed_s goes on rising across the restart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

RECENT_STEPS = 20  # steps the per-step time (ETA) is averaged over

Row = dict[str, Any]


def number(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def segments(rows: list[Row], resumed: Iterable[int] = ()) -> list[list[Row]]:
    """Rows split where a process began: the step after one it `resumed` from (the run's
    goodput.resume_steps), or elapsed_s going back (a folder without a timeline)."""
    after = set(resumed)
    out: list[list[Row]] = []
    last = None
    for row in rows:
        elapsed, step = number(row.get("elapsed_s")), number(row.get("step"))
        began = step is not None and int(step) - 1 in after
        if not out or elapsed is None or last is None or elapsed < last or began:
            out.append([])
        out[-1].append(row)
        last = elapsed
    return out


def trained_s(rows: list[Row], resumed: Iterable[int] = ()) -> float:
    """Seconds the trainer processes ran up to their last logged step, summed over restarts."""
    return sum(number(seg[-1].get("elapsed_s")) or 0.0 for seg in segments(rows, resumed))


def step_s(rows: list[Row], resumed: Iterable[int] = ()) -> float | None:
    """Seconds per step lately: the newest segment's recent steps, its first step left out
    (it includes start-up and compilation)."""
    if not rows:
        return None
    seg = segments(rows, resumed)[-1][-(RECENT_STEPS + 1) :]
    if len(seg) >= 2:
        t0, t1 = number(seg[0].get("elapsed_s")), number(seg[-1].get("elapsed_s"))
        steps = int(seg[-1]["step"]) - int(seg[0]["step"])
        if t0 is not None and t1 is not None and steps > 0:
            return max(0.0, (t1 - t0) / steps)
    t = number(seg[-1].get("elapsed_s"))  # one step so far: its time is all we know
    return t if t else None
