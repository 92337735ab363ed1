"""In every pod of a multi-node job: the peer watch and the fence (run/peers.py), and what the
pod does about them. publish.py, the pod's first process, starts it beside the command.

A peer lost (its heartbeat stopped while the job stood still):
- the record `status` shows, in hangs.jsonl: "node 1: ... node 0 silent for 10 s";
- a fixed-size job: the command (torchrun and its workers) is killed and the pod ends with
  EXIT_PEER_LOST; Volcano's PodFailed policy restarts the gang at once (RestartJob), and the
  node watcher lets the lost node's pod go once its kubelet's lease is stale
  (nodewatch.py), so the gang is placed again well before the node controller says NotReady;
- an elastic job: only the workers are killed; torchrun restarts them into a rendezvous of the
  nodes that are left (job.min_nnodes), which goes on with them; the lost node's pod is
  replaced by Volcano alone (RestartPod) and its new agent joins at a later round.
Fenced (another attempt holds the run): the command is killed, nothing more is published.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from trainmaster.run import peers
from trainmaster.storage import RunPaths
from trainmaster.train.watchdog import Hang, record


@dataclass
class PodPeers:
    run: RunPaths
    node: int
    child: subprocess.Popen[bytes]
    elastic: bool
    ended: str | None = None  # "peer-lost" or "fenced" once this pod ended its command for it

    def on_lost(self, peer: int, silent: float) -> None:
        where = f"node {peer} silent for {silent:.0f} s (its heartbeat stopped)"
        step = last_step(self.run)
        hang = Hang(time.time(), -1, self.node, step, round(silent, 1), where, silent, "")
        with contextlib.suppress(OSError):
            record(self.run.hangs, hang)
        if self.elastic:
            print(f"trainmaster: peer lost: {where}; restarting this node's workers into a "
                  "rendezvous of the nodes left", flush=True)  # fmt: skip
            kill_workers(self.child.pid)
            return
        print(f"trainmaster: peer lost: {where}; ending this pod so that the gang restarts "
              "without that node", flush=True)  # fmt: skip
        self.ended = "peer-lost"
        end(self.child)

    def on_fenced(self, why: str) -> None:
        print(f"trainmaster: {why}", flush=True)
        self.ended = "fenced"
        end(self.child)

    def exit_code(self, code: int) -> int:
        if self.ended == "peer-lost":
            return peers.EXIT_PEER_LOST
        return peers.EXIT_FENCED if self.ended == "fenced" else code


def start(
    run: RunPaths,
    child: subprocess.Popen[bytes],
    *,
    attempt: str,
    pod: str,
    nodes: int,
    lost_after_s: float,
    elastic: bool,
) -> tuple[PodPeers, peers.PeerWatch] | None:
    """The watch for this pod, started; None for a single node, with the watch off
    (kubernetes.peer_lost_after_s = 0), or without the attempt's id or the pod's index."""
    index = pod.rpartition("-")[2]
    if nodes < 2 or lost_after_s <= 0 or not attempt or not index.isdigit():
        return None
    me = PodPeers(run, int(index), child, elastic)
    progress = peers.Progress([run.metrics, run.timeline])
    watch = peers.PeerWatch(
        folder=run.heartbeats / attempt,
        node=int(index),
        nodes=nodes,
        lost_after_s=lost_after_s,
        fence=peers.Fence(run.fence, attempt),
        stalled_s=progress.stalled_s,
        on_lost=me.on_lost,
        on_fenced=me.on_fenced,
    )
    try:
        return me, watch.start()
    except OSError as exc:  # the claim not writable: the job runs without the watch
        print(f"trainmaster: no peer watch: {exc}", flush=True)
        return None


def end(agent: subprocess.Popen[bytes]) -> None:
    """SIGKILL torchrun's agent, then its workers (in a container the pod's end would take them
    too: its first process is the last of its PID namespace)."""
    workers = children(agent.pid)
    with contextlib.suppress(OSError):
        agent.kill()
    for pid in workers:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def kill_workers(agent: int) -> None:
    """SIGKILL the children of torchrun's agent (its workers), not the agent."""
    for child in children(agent):
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)


def children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            text = Path(f"/proc/{pid}/task/{task}/children").read_text()
            out += [int(x) for x in text.split()]
    return out


def last_step(run: RunPaths) -> int:
    """The newest step in metrics.jsonl (its last line), 0 when none can be read."""
    try:
        with run.metrics.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().splitlines()
        return int(json.loads(lines[-1])["step"]) if lines else 0
    except (OSError, ValueError, KeyError, TypeError):
        return 0
