"""Preemption (docs/architecture.md 5: 14.3): SIGTERM from the platform is a request to
save and stop, not a crash.

A spot interruption, a pod eviction, a drained node or `trainmaster cancel` all arrive as
SIGTERM, with a grace period before SIGKILL (Kubernetes: terminationGracePeriodSeconds; torchrun
gives its workers 30 s after forwarding the signal; `cancel --grace`). Without a handler the
worker dies at once and everything since the last periodic checkpoint is lost.

With one, the worker only notes the request. The loop adds the note to the step's loss
all-reduce (one more float in a collective it runs anyway), so every rank learns of it in the
same step even when only one node was signalled, and at the next host read of the losses all
ranks stop together: a checkpoint of that step (collective, as any other), its write awaited,
one line in runs/JOB/preemptions.jsonl, and exit code EXIT_PREEMPTED. `status` and
summary.json count preemptions apart from failures.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from trainmaster.run import metrics as runlog

EXIT_PREEMPTED = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM


class Preempted(Exception):
    """Raised by the loop after the preemption checkpoint: __main__ exits EXIT_PREEMPTED."""

    def __init__(self, step: int) -> None:
        super().__init__(f"preempted (SIGTERM): stopped after step {step} with a checkpoint of it")
        self.step = step


class Preemption:
    """SIGTERM noted, not obeyed at once (installed from the main thread, as Python requires)."""

    def __init__(self) -> None:
        self.requested_at: float | None = None
        self._previous: Any = None

    def install(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def uninstall(self) -> None:
        """Put the previous handler back (a trainer run in-process, e.g. by the tests)."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.requested_at is None:
            self.requested_at = time.time()

    @property
    def flag(self) -> float:
        """This rank's vote in the step's all-reduce: 1 once SIGTERM has arrived."""
        return 1.0 if self.requested_at is not None else 0.0


def record(path: Path, *, step: int, requested_at: float | None, saved_s: float) -> None:
    """Rank 0: one line per preemption honoured (requested_at: when rank 0 itself got the
    signal; None when another rank's vote stopped it)."""
    line = {
        "t": time.time(),
        "step": step,
        "signal_at": requested_at,
        "checkpoint_s": round(saved_s, 3),
    }
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def read(path: Path) -> list[dict[str, Any]]:
    """The preemptions of a run, oldest first; a line that does not parse is skipped."""
    return [e for e in runlog.read_jsonl(path) if isinstance(e.get("step"), int)]
