"""Divergence (train.on_divergence): what the trainer does when the training itself goes wrong.

A process can be healthy while its training is not: one bad batch or an unlucky update gives a
non-finite loss or gradient norm, or the loss jumps far above where it was, and every later
checkpoint carries it. The trainer checks each step's loss (the mean over all ranks, from the
all-reduce it runs anyway) and whether any rank's gradient norm was non-finite (one more float
in it), so every rank reaches the same verdict in the same step, before that step's checkpoint
is taken: a checkpoint after a bad step is never written, so the newest one is a good one.

    rollback  back to the newest checkpoint from before the bad step (weights, optimizer,
              schedule, RNG), and on from where the data was: the batches that led there are
              skipped, as PaLM's authors did. At most train.max_rollbacks in any
              train.rollback_window steps; one more, or no checkpoint to go back to, stops.
    stop      the newest checkpoint stays the last good one, and the job ends (exit
              EXIT_DIVERGED) with one line saying why.
    off       nothing is checked.

Each verdict is one line of runs/JOB/rollbacks.jsonl (status, report and /metrics read it); a
stop also names its launch, so that the restarts the launcher would make of it fail at once
with the same line (refuse_restart) instead of training into the same wall again, while a new
launch (`trainmaster launch --resume`, after a change of lr, say) starts as usual. No torch
here: the trainer (train/rollback.py) and the operator's side share it.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainmaster.run import metrics as runlog

EXIT_DIVERGED = 4  # train/__main__.py's exit codes: 0 done, 1 failed, 2 bad input, 3 hung
HISTORY = 50  # the recent steps whose median loss a spike is measured against
MIN_HISTORY = 10  # no spike verdict before this many good steps (the first steps fall fast)
# What names one launch in a worker's environment: the local supervisor's launch time, or the
# Kubernetes job's PodGroup (a new launch is a new Volcano job).
LAUNCH_ENVS = ("TRAINMASTER_LAUNCHED_AT", "TRAINMASTER_PODGROUP")


class Diverged(Exception):
    """Raised on every rank when the job stops for divergence: the trainer exits EXIT_DIVERGED."""


@dataclass(frozen=True)
class Verdict:
    step: int
    reason: str  # "non-finite loss" | "non-finite gradient norm" | "loss spike"
    value: float  # the step's loss (or gradient norm)
    median: float | None  # the recent median loss it was measured against

    def describe(self) -> str:
        if self.reason == "loss spike" and self.median is not None:
            return f"loss spike at step {self.step}: {self.value:.4g} > median {self.median:.4g}"
        return f"{self.reason} at step {self.step} ({self.value})"


class Detector:
    """Each step's reduced loss in order; the first bad one is a Verdict. The same numbers on
    every rank give the same verdict on every rank."""

    def __init__(self, spike: float) -> None:
        self.spike = spike
        self.recent: deque[float] = deque(maxlen=HISTORY)

    def check(self, step: int, loss: float, grad_norm: float, bad_grads: bool) -> Verdict | None:
        median = statistics.median(self.recent) if len(self.recent) >= MIN_HISTORY else None
        if not math.isfinite(loss):
            return Verdict(step, "non-finite loss", loss, median)
        if bad_grads or not math.isfinite(grad_norm):
            return Verdict(step, "non-finite gradient norm", grad_norm, median)
        if self.spike > 0 and median is not None and loss > self.spike * median:
            return Verdict(step, "loss spike", loss, median)
        self.recent.append(loss)
        return None


def allowed(past: list[dict[str, Any]], step: int, most: int, window: int) -> bool:
    """One more rollback at STEP is within `most` in any `window` steps."""
    recent = [r for r in past if r.get("action") == "rollback" and step - r["step"] < window]
    return len(recent) < most


def launch_of(environ: Mapping[str, str]) -> str | None:
    return next((environ[k] for k in LAUNCH_ENVS if environ.get(k)), None)


def record(
    path: Path, verdict: Verdict, *, action: str, to: int | None, **extra: Any
) -> dict[str, Any]:
    """Rank 0: one line per verdict (action "rollback" to step TO, or "stop")."""
    line = {"t": time.time(), **asdict(verdict), "action": action, "to": to, **extra}
    line["value"] = repr(verdict.value) if not math.isfinite(verdict.value) else verdict.value
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    return line


def read(path: Path) -> list[dict[str, Any]]:
    """The verdicts of a run, oldest first (a line that does not parse is skipped)."""
    return [e for e in runlog.read_jsonl(path) if isinstance(e.get("step"), int)]


def stop_line(verdict: Verdict, newest: int | None, why: str) -> str:
    kept = f"the newest checkpoint (step {newest}) is from before it" if newest else "no checkpoint"
    return (
        f"training diverged: {verdict.describe()}; {why}; {kept}. Lower train.lr or raise "
        "train.warmup_steps, then `trainmaster launch --resume`"
    )


def refuse_restart(path: Path, environ: Mapping[str, str]) -> str | None:
    """The stop line when this launch already stopped for divergence: a restart of it would
    resume from the same checkpoint into the same batches."""
    launch = launch_of(environ)
    stops = [r for r in read(path) if r.get("action") == "stop"]
    if launch is None or not stops or stops[-1].get("launch") != launch:
        return None
    return str(stops[-1].get("line") or "training diverged (rollbacks.jsonl)")


def summary(path: Path | None) -> dict[str, Any]:
    """For status, report and /metrics: rollbacks so far, the steps they lost, the last verdict."""
    lines = read(path) if path is not None else []
    rolled = [r for r in lines if r.get("action") == "rollback"]
    return {
        "rollbacks": len(rolled),
        "rollback_steps_lost": sum(r["step"] - (r.get("to") or 0) for r in rolled),
        "diverged": lines[-1] if lines else None,
    }
