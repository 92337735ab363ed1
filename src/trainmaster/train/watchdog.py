"""Hang watchdog (docs/architecture.md 5: 14.1): a worker whose step does not advance is
stopped, not waited for.

A rank that stops making progress (a peer died mid-collective without closing its sockets, a
device that stopped answering, a deadlock) otherwise leaves the whole job waiting for the
process group's timeout, 30 minutes by default. Every worker runs one daemon thread. When the
step counter has not moved for the timeout it:

1. dumps every thread's Python stack with faulthandler (stdlib, async-signal-safe, works while
   the main thread is blocked inside C++) into runs/JOB/logs/hang-rankR.txt, and says so in
   the rank's log;
2. appends one record to runs/JOB/hangs.jsonl (`status` shows the newest: "rank 5 on node 1:
   no step for 312 s, last in all_reduce");
3. asks whether this node is the cause (on_hang: train/nodefault.py probes the device and
   marks the node on Kubernetes when it failed), then
4. ends the process with EXIT_HUNG, so that torchrun restarts the group from the last
   checkpoint (its peers fail on the closed connection, or their own watchdog fires).

The timeout: train.hang_timeout when set (0 turns the watchdog off); otherwise
max(FLOOR_S, FACTOR x the slowest of the recent steps). Before the first step completes the
watchdog is not armed: the first step carries compilation, which may take many minutes, and
rendezvous has its own timeout. No torch here, so it is testable with plain threads.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from trainmaster.run import metrics as runlog

FLOOR_S = 300.0  # never below: checkpoints, logging and slow nodes must not look like hangs
FACTOR = 20.0  # x the slowest recent step
RECENT = 20  # steps remembered for the derived timeout
EXIT_HUNG = 3  # the worker's exit code after a hang (1 is an error, 2 bad input)


@dataclass(frozen=True)
class Hang:
    """One line of hangs.jsonl."""

    t: float
    rank: int
    node: int
    step: int  # the last step the rank finished
    no_step_s: float
    where: str  # what the rank was doing (the last label the loop set)
    timeout_s: float
    dump: str  # the stack dump's file name, in the run's logs folder

    def describe(self) -> str:
        # A label between steps ("after step 4", "after the checkpoint of step 4": the
        # trainer's and a script's) already says where the rank stood; a phase of the next
        # step ("step 5: loss all_reduce") is said after the last step done.
        where, idle = self.where, f"no step for {self.no_step_s:.0f} s"
        if self.rank < 0:  # a pod's record of a lost peer (backends/kubernetes/podpeers.py)
            return f"node {self.node}: {idle} after step {self.step}; {where}"
        if not where.startswith("after "):
            where = f"after step {self.step}, last in {where}"
        who = f"rank {self.rank} on node {self.node}"
        return f"{who}: {idle} (timeout {self.timeout_s:.0f} s) {where}"


def read_hangs(path: Path) -> list[Hang]:
    """The hangs recorded for a run, oldest first; lines that do not parse are skipped."""
    out = []
    for obj in runlog.read_jsonl(path):
        with contextlib.suppress(TypeError):  # another shape
            out.append(Hang(**obj))
    return out


def record(path: Path, hang: Hang) -> None:
    """One line of hangs.jsonl (a pod records a lost peer so too: backends/kubernetes/publish.py)."""
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(asdict(hang)) + "\n")


def derived_timeout(step_s: list[float], configured: float | None) -> float | None:
    """Seconds without a step that count as a hang; None: not armed (yet, or switched off)."""
    if configured is not None:
        return configured or None
    return max(FLOOR_S, FACTOR * max(step_s)) if step_s else None


class Watchdog:
    """One per worker. The loop calls beat() after every step and sets `where` before each
    phase of a step; the thread does the rest. exit_fn is os._exit (tests pass their own)."""

    def __init__(
        self,
        *,
        logs: Path,
        hangs: Path,
        rank: int,
        node: int,
        configured: float | None,
        exit_fn: Callable[[int], None] = os._exit,
        poll_s: float = 1.0,
        on_hang: Callable[[str], None] | None = None,
    ) -> None:
        self.logs, self.hangs, self.rank, self.node = logs, hangs, rank, node
        self.on_hang = on_hang  # before exiting: is it this node? (train/nodefault.py)
        self.configured, self.exit_fn, self.poll_s = configured, exit_fn, poll_s
        self.where = "start-up"
        self.step = 0
        self._last = time.monotonic()
        self._steps: deque[float] = deque(maxlen=RECENT)
        self._armed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name=f"hang-watchdog-{rank}", daemon=True
        )

    def start(self) -> Watchdog:
        if self.configured != 0:
            self._thread.start()
        return self

    def beat(self, step: int, step_s: float | None = None) -> None:
        """A step finished (step_s: its time, left out for the first, which compiles)."""
        now = time.monotonic()
        if step_s is not None:
            self._steps.append(step_s)
        self.step, self._last, self._armed = step, now, True

    def stop(self) -> None:
        """Disarm for good (the loop is done: the end's gathers are not steps)."""
        self._stop.set()

    @property
    def timeout(self) -> float | None:
        return derived_timeout(list(self._steps), self.configured) if self._armed else None

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            limit = self.timeout
            idle = time.monotonic() - self._last
            if limit is not None and idle > limit:
                self._fire(idle, limit)
                return

    def _fire(self, idle: float, limit: float) -> None:
        dump = self.logs / f"hang-rank{self.rank}.txt"
        hang = Hang(
            time.time(),
            self.rank,
            self.node,
            self.step,
            round(idle, 1),
            self.where,
            limit,
            dump.name,
        )
        self.logs.mkdir(parents=True, exist_ok=True)
        with dump.open("a", encoding="utf-8") as f:
            f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} hang: {hang.describe()}\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        record(self.hangs, hang)
        print(
            f"trainmaster: hang: {hang.describe()}; stacks in logs/{dump.name}; exiting so "
            "that torchrun restarts from the last checkpoint",
            flush=True,
        )
        if self.on_hang is not None:
            try:
                self.on_hang(hang.describe())
            except Exception as e:  # nothing may keep a hung worker alive
                print(f"trainmaster: hang: node check failed: {e}", flush=True)
        self.exit_fn(EXIT_HUNG)
