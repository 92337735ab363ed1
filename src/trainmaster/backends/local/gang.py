"""One attempt of a local run: its node agents, started together, watched together, stopped
together (the supervisor's unit, as a worker group is torch's elastic agent's).

Gang.wait() is the supervisor's poll loop. It returns an Outcome (outcome.py) when every
agent ended, or at the first
lost node that ends the attempt: an agent that died by a signal (the instance died) or exited on
a rendezvous or store error (the c10d store lived in a lost agent: its peers cannot go on). An
elastic job (rejoins) loses a node by a signal and goes on, taking the node back (rejoin.py),
unless the c10d store went with it. A run whose work is done while agents still wait
(completion.py) is ended there: they are stopped.

A cancel reaches an attempt two ways: the supervisor's SIGTERM handler (it signals the gang's
agents and sets Cancel), or state.json, which CancelWatch looks at before each agent starts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainmaster.backends.local import completion, rejoin
from trainmaster.backends.local.outcome import Lost, Outcome
from trainmaster.compile import lock
from trainmaster.launch import entry
from trainmaster.run import goodput, processes, state
from trainmaster.storage import RunPaths

# What a torchrun agent's log says when the rendezvous or its store is gone with a lost node
# (torch/distributed/elastic/rendezvous/api.py and c10d's error types).
STORE_LOST = (
    "RendezvousConnectionError",
    "RendezvousClosedError",
    "DistStoreError",
    "DistNetworkError",
)
POLL_S = 0.2


@dataclass
class Cancel:
    """Set once `cancel` asked for the end (the SIGTERM handler, or state.json seen): agents
    that end from then on are cancelled, not lost: neither retried nor taken back."""

    requested: bool = False


class Cancelled(Exception):
    """`cancel` asked for the end while the supervisor was still starting the run."""


class CancelWatch:
    """Raises Cancelled once state.json records a cancel. The file is parsed again only when it
    was replaced since the last look (every write is an atomic replace: a new inode): one parse
    per started node of a file that grows with the node count made starting n agents O(n^2),
    ~30 s at 1,024 nodes (measured in the scale work, docs/architecture.md 5: 15)."""

    def __init__(self, run: RunPaths) -> None:
        self.path, self.seen = run.state, (-1, -1, -1)
        self.reads = 0

    def check(self) -> None:
        st = os.stat(self.path)
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self.seen:
            return
        self.seen, self.reads = stamp, self.reads + 1
        if state.read(self.path).cancel_requested:
            raise Cancelled


def lost_reason(log: Path, offset: int, code: int | None) -> str | None:
    """Why an ended agent counts as a lost node (None: it finished, or its workers failed)."""
    if code is None or code == 0:
        return None
    if code < 0:
        return signal.Signals(-code).name
    try:
        with log.open("rb") as f:
            f.seek(offset)
            tail = f.read()[-(256 << 10) :].decode("utf-8", "replace")
    except OSError:
        return None
    found = [m for m in STORE_LOST if m in tail]
    return f"rendezvous lost: {found[0]}" if found else None


def signal_groups(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@dataclass
class Gang:
    """The agents of one attempt, owned by the supervisor: its SIGTERM handler signals them
    through signal_all(), the agents started so far (start() appends each as it starts)."""

    run: RunPaths
    commands: list[list[str]]  # one per node (backends/local/agents.py)
    env: dict[str, str]
    workdir: str
    held: lock.CacheLock | None  # the cacheset lock, kept held while any agent lives
    agents: list[subprocess.Popen[bytes]] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)  # where this attempt's node logs begin

    def start(self, before_each: Callable[[], None]) -> None:
        """Start every node's agent, each in its own session; before_each raises to stop."""
        self.offsets = [size(self._log(i)) for i in range(len(self.commands))]
        self.agents.clear()
        for i in range(len(self.commands)):
            before_each()
            self.agents.append(self.start_node(i))

    def start_node(self, i: int) -> subprocess.Popen[bytes]:
        """Start node i's agent (at the attempt's start, or again when it rejoins)."""
        self.offsets[i] = size(self._log(i))
        with self._log(i).open("ab") as log:
            agent = subprocess.Popen(
                self.commands[i],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**self.env, entry.ENV_NODE_INDEX: str(i)},
            )
        if self.held is not None:  # a killed supervisor must not free the cache its workers use
            self.held.also_held_by([a.pid for a in self.agents] + [agent.pid])
        return agent

    def signal_all(self, sig: int) -> None:
        """Signal every agent's process group (SIGTERM: `cancel` passed on)."""
        signal_groups([a.pid for a in self.agents], sig)

    def _log(self, i: int) -> Path:
        return self.run.logs / f"node{i}.log"

    def wait(
        self,
        cancel: Cancel,
        rejoins: rejoin.Rejoins | None,
        store_lost: Callable[[int], bool],
        end: completion.EndWatch,
    ) -> Outcome:
        """Exit codes so far, and the lost node that ends this attempt, if one does."""
        agents, offsets = self.agents, self.offsets
        left_out: set[int] = set()  # lost nodes not taken back (no rejoin left): seen once
        while True:
            codes = [a.poll() for a in agents]
            waiting = set(rejoins.waiting) if rejoins is not None else set()
            if not cancel.requested and end.check(codes, left_out | waiting):
                return Outcome(self.end_stuck(end.stuck))
            for i, code in enumerate(codes):
                if i in left_out:
                    continue
                if rejoins is not None and i in rejoins.waiting and code is not None:
                    rejoins.ended(i, code)
                    left_out.add(i)
                    continue
                why = None if cancel.requested else lost_reason(self._log(i), offsets[i], code)
                if why is None:
                    continue
                # `cancel` records itself, then signals the agents (and etcd) one by one, not
                # this process: an agent that ends now, killed or failing to reach a rendezvous
                # whose store went first, is cancelled, not lost.
                if state.read(self.run.state).cancel_requested:
                    cancel.requested = True
                    continue
                if rejoins is None or code is None or code > 0 or store_lost(i):
                    return Outcome([c if c is not None else -1 for c in codes], Lost(i, why))
                rejoins.lost(i, why, agents)
                if agents[i].poll() is not None:
                    left_out.add(i)
            if rejoins is not None:
                rejoins.poll()
            codes = [a.poll() for a in agents]
            if all(c is not None for c in codes):
                return Outcome([int(c) for c in codes if c is not None])
            time.sleep(POLL_S)  # polling child processes of their own sessions

    def stop(self, grace_s: float = 10.0) -> list[int]:
        """Stop what is left: the workers at once (their collectives wait on a dead peer; the
        last checkpoint is complete on disk), then the agents; their exit codes."""
        for w in processes.workers(state.read(self.run.state)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, signal.SIGKILL)
        signal_groups([a.pid for a in self.agents if a.poll() is None], signal.SIGTERM)
        until = time.monotonic() + grace_s
        while any(a.poll() is None for a in self.agents) and time.monotonic() < until:
            time.sleep(POLL_S)  # waiting for processes to exit after a signal (bounded)
        signal_groups([a.pid for a in self.agents if a.poll() is None], signal.SIGKILL)
        return [a.wait() for a in self.agents]

    def end_stuck(self, stuck: list[completion.Stuck]) -> list[int]:
        """Stop the agents that wait for a round that will not come (and those in their exit
        barrier, which waits for them), saying why: the run's work is done. An agent in the
        barrier sits in a C++ store wait its SIGTERM handler cannot interrupt: only the SIGKILL
        after the grace ends it, and nothing of it is lost (its workers finished): 1 s."""
        for s in stuck:
            print(f"trainmaster supervisor: {s.warning()}", flush=True)
            goodput.record(
                self.run.timeline, "worker_died_at_exit", t=time.time(), node=s.node, why=s.why
            )
        return self.stop(grace_s=1.0)
