"""Peers that stopped answering, seen by the job before Kubernetes sees it; and the fence that
keeps an attempt given up for lost from writing to the run.

A node that dies mid-step leaves its peers blocked in a collective (gloo and NCCL wait for the
process group's timeout, minutes) or, where the collective fails at once, their torchrun agents
waiting in the next rendezvous for a node that will not come; Kubernetes only says NotReady
after its grace (about 50 s) and evicts after the pods' toleration. So every pod of a
multi-node job watches its peers from its first process (backends/kubernetes/publish.py),
which lives as long as the pod, whatever the workers do:

- every BEAT_S it rewrites its node's file under runs/JOB/heartbeats/ATTEMPT/ with a counter
  (no clocks compared across nodes: a reader only notes when a value last changed, on its own
  monotonic clock);
- only while the job makes no progress (its metrics and timeline have not grown, as seen
  here, for LOOK_AFTER_S) does it read the other nodes' files; a node whose counter has not
  changed for lost_after_s, while the job stood still as long and this node's own beats went
  through, is lost: the job is blocked on it, and it stopped writing to the shared storage;
- then on_lost: the pod records it (hangs.jsonl, which `status` shows) and ends its command, so
  that the job restarts at once (publish.py).

The fence (runs/JOB/fence) names the attempt that holds the run: the trainer's rank 0 claims it
with the attempt's rendezvous id when it starts, so the attempt started last holds it. The
watch reads it every beat and, once it has seen its own attempt's claim, calls on_fenced when
another attempt holds it; the trainer's checkpoint writer checks it just before it publishes a
checkpoint (train/checkpoint/saving.py publish_guards). That is what lets the restart begin
before the lost node is known dead (the node watcher deletes its pod once its kubelet stopped
renewing its lease): a node that was only cut off, and comes back, has its old ranks write
nothing to the run once the new attempt started. Standard library only: tested with threads
and files.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

BEAT_S = 2.0  # how often a node rewrites its heartbeat
LOOK_AFTER_S = 4.0  # the job stood still this long: read the others' heartbeats
# A pod's exit codes (the trainer's own: 2 bad input, 3 hung, 4 diverged, 143 preempted)
EXIT_PEER_LOST = 6  # it ended its command for a lost peer
EXIT_FENCED = 8  # ... because another attempt holds the run


class Fenced(RuntimeError):
    """Another attempt of the job holds the run: this one may not write to it."""


@dataclass(frozen=True)
class Fence:
    """runs/JOB/fence and this attempt's token (picklable: the checkpoint writer gets it)."""

    path: Path
    token: str

    def claim(self) -> None:
        """The trainer's rank 0 of a new attempt: the run is this attempt's now."""
        from trainmaster import files

        files.write_atomic(self.path, self.token + "\n")

    def holder(self) -> str | None:
        """The token in the fence; None when there is none or it cannot be read."""
        try:
            return self.path.read_text().strip() or None
        except OSError:
            return None

    def check(self) -> None:
        """Raise Fenced if another attempt holds the run."""
        holder = self.holder()
        if holder is not None and holder != self.token:
            raise Fenced(self.describe(holder))

    def describe(self, holder: str) -> str:
        return (
            f"attempt {self.token} of this job was given up for lost and attempt {holder} "
            f"holds the run now ({self.path}): this attempt writes nothing more"
        )


@dataclass
class PeerWatch:
    """A pod's heartbeat and its look at the other nodes (the module's doc). stalled_s: seconds
    since the job's progress was last seen to move, here."""

    folder: Path  # runs/JOB/heartbeats/ATTEMPT
    node: int
    nodes: int
    lost_after_s: float
    fence: Fence
    stalled_s: Callable[[], float]
    on_lost: Callable[[int, float], None]
    on_fenced: Callable[[str], None]
    clock: Callable[[], float] = time.monotonic
    beat_s: float = BEAT_S
    _count: int = 0
    _beats_ok: list[float] = field(default_factory=list)  # when this node's beats went through
    _claimed: bool = False  # this attempt's claim seen in the fence
    _seen: dict[int, tuple[str, float]] = field(default_factory=dict)  # node -> (value, since)
    _gone: dict[int, str] = field(default_factory=dict)  # peers lost, by the value they left
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> PeerWatch:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.fenced()  # notes this attempt's claim if its rank 0 has made it already
        self.beat()
        threading.Thread(target=self._run, name="peer-watch", daemon=True).start()
        return self

    def stop(self, done: bool = True) -> None:
        """The command ended: no more beats; done says so in the file, so that a node whose
        command ended first is not taken for lost by one still finishing."""
        self._stop.set()
        if done:
            with contextlib.suppress(OSError):
                (self.folder / f"node-{self.node}").write_text("done\n")

    def beat(self) -> None:
        self._count += 1
        try:
            (self.folder / f"node-{self.node}").write_text(f"{self._count}\n")
        except OSError:
            return  # a storage hiccup: the next beat tries again, and nobody is judged meanwhile
        self._beats_ok.append(self.clock())
        del self._beats_ok[:-8]

    def _run(self) -> None:
        while not self._stop.wait(self.beat_s):
            holder = self.fenced()
            if holder is not None:
                self.on_fenced(self.fence.describe(holder))
                return
            self.beat()
            lost = self.look()
            if lost is not None and not self._stop.is_set():
                self.on_lost(*lost)  # an elastic job goes on: the peer is judged once

    def fenced(self) -> str | None:
        """The attempt that claimed the run after this one did, if any. Until this attempt's
        own claim is seen, the holder is the attempt before it (its rank 0 claims at start)."""
        holder = self.fence.holder()
        if holder == self.fence.token:
            self._claimed = True
        return holder if self._claimed and holder not in (None, self.fence.token) else None

    def look(self) -> tuple[int, float] | None:
        """(node, seconds silent) of a peer lost now, else None; reads only while stalled."""
        stalled, now = self.stalled_s(), self.clock()
        if stalled < LOOK_AFTER_S:
            self._seen.clear()  # the job moves: every peer answered; start afresh next stall
            return None
        # This node's own beats must have gone through lately: a storage that stalls for
        # everyone makes every node look silent.
        if not self._beats_ok or now - self._beats_ok[-1] > 2 * self.beat_s:
            return None
        for peer in range(self.nodes):
            if peer == self.node:
                continue
            try:
                value = (self.folder / f"node-{peer}").read_text().strip()
            except OSError:
                continue  # never beat (yet) or unreadable now: nothing to judge
            if not value or value == "done":
                continue
            if self._gone.get(peer) == value:
                continue  # lost already, and not back (a new pod in its place beats anew)
            self._gone.pop(peer, None)
            before = self._seen.get(peer)
            if before is None or before[0] != value:
                self._seen[peer] = (value, now)
                continue
            silent = now - before[1]
            if silent >= self.lost_after_s and stalled >= self.lost_after_s:
                self._gone[peer] = value
                return peer, silent
        return None


class Progress:
    """Seconds since the job last moved, as this pod sees it: when the run's metrics or
    timeline (written by rank 0, wherever it runs) last changed size, on this pod's clock."""

    def __init__(self, files: list[Path], clock: Callable[[], float] = time.monotonic) -> None:
        self.files, self.clock = files, clock
        self._sizes = self._read()
        self._since = clock()

    def _read(self) -> tuple[int, ...]:
        return tuple(_size(f) for f in self.files)

    def stalled_s(self) -> float:
        sizes, now = self._read(), self.clock()
        if sizes != self._sizes:
            self._sizes, self._since = sizes, now
        return now - self._since


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1
