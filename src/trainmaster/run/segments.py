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
    """Rows split where a process began: elapsed_s or the step going back, or the last row of
    the step after one a process `resumed` from (the run's goodput.resume_steps; the last, as a
    script that keeps its rows past a resume logs that step again later)."""
    after = set(resumed)
    began = {
        int(step): i
        for i, row in enumerate(rows)
        if (step := number(row.get("step"))) is not None and int(step) - 1 in after
    }
    firsts = set(began.values())
    out: list[list[Row]] = []
    last: float | None = None
    last_step: float | None = None
    for i, row in enumerate(rows):
        elapsed, step = number(row.get("elapsed_s")), number(row.get("step"))
        back = (elapsed is None or last is None or elapsed < last) or (
            step is not None and last_step is not None and step <= last_step
        )
        if not out or back or i in firsts:
            out.append([])
        out[-1].append(row)
        last, last_step = elapsed, step
    return out


def trained_s(rows: list[Row], resumed: Iterable[int] = ()) -> float:
    """Seconds the trainer processes ran up to their last logged step, summed over restarts."""
    return sum(number(seg[-1].get("elapsed_s")) or 0.0 for seg in segments(rows, resumed))


def step_s(rows: list[Row], resumed: Iterable[int] = ()) -> float | None:
    """Seconds per step lately: the newest segment's recent steps, its first step left out (it
    includes start-up and compilation); a process with one step so far borrows the pace of the
    one before it (its one step's time, start-up and all, is all a first process has)."""
    if not rows:
        return None
    each = segments(rows, resumed)
    for seg in reversed(each):
        recent = seg[-(RECENT_STEPS + 1) :]
        if len(recent) >= 2:
            t0, t1 = number(recent[0].get("elapsed_s")), number(recent[-1].get("elapsed_s"))
            steps = int(recent[-1]["step"]) - int(recent[0]["step"])
            if t0 is not None and t1 is not None and steps > 0:
                return max(0.0, (t1 - t0) / steps)
    t = number(each[-1][-1].get("elapsed_s"))
    return t if t else None
