"""A lost node taken back into an elastic job (job.min_nnodes < job.nnodes), locally.

When an elastic job's node agent dies by a signal, the survivors go on without it: their
workers fail on the dead peer and torchrun re-forms the group from the nodes it has. The
supervisor then starts the lost node's agent again, with the same rendezvous id and endpoint,
as a node that returns. torch's c10d rendezvous (torch 2.13,
torch/distributed/elastic/rendezvous/dynamic_rendezvous.py) puts a node that arrives at a
complete round on its wait list, or, while the dead agent's entry still fills the round (until
its heartbeats expire: keep_alive_interval x keep_alive_max_attempt, 5 s x 3), on its
redundancy list until a place frees; each running agent asks num_nodes_waiting() every
monitor interval while its workers are healthy and, when one waits, restarts its workers into
a new round that holds both (agent/server/api.py _invoke_run: "membership changes do not count
as retries"). The etcd rendezvous does the same through its own wait count. The workers of
the new round resume from the last checkpoint with the accumulation of the full world again
(train/preflight.py grad_accum_for).

Not when the lost agent hosted the c10d store (the first agent to bind the endpoint's port on
loopback; node 0 with job.network = netns): the rendezvous went with it, no survivor can go
on, and the supervisor starts the gang again instead (a job retry). A node is taken back at
most job.max_retries times per launch (counted apart from job retries), so a node that keeps
dying is left out and the job goes on with the others.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainmaster.config import JobConfig
from trainmaster.launch.torchrun import Rendezvous
from trainmaster.run import processes, state

LISTEN = "0A"  # a socket's state LISTEN in /proc/net/tcp (include/net/tcp_states.h)


def listening(port: int) -> bool:
    """Whether a socket of this network namespace listens on the port (read from /proc, so
    nothing connects to the store: a probe would be one more client for it to handle)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 3 and cols[3] == LISTEN and int(cols[1].rpartition(":")[2], 16) == port:
                return True
    return False


def store_lost(cfg: JobConfig, rdzv: Rendezvous, node: int) -> bool:
    """Whether the c10d store went with this lost node (its agent has exited: the kernel has
    closed its sockets by the time the supervisor sees the exit)."""
    if rdzv.backend != "c10d":
        return False  # etcd holds the rendezvous; no node does
    if cfg.job.network == "netns":
        return node == 0  # is_host=true on node 0 only (netns.py)
    return not listening(int(rdzv.endpoint.rpartition(":")[2]))


@dataclass
class Rejoins:
    """The lost nodes of one launch of an elastic job: taken back, waiting to be, or left out."""

    run_state: Path
    budget: int  # job.max_retries
    start: Callable[[int], subprocess.Popen[bytes]]  # starts node i's agent (supervisor.py)
    last_step: Callable[[], int | None]
    used: int = 0
    waiting: dict[int, str] = field(default_factory=dict)  # node -> "lost at step S (SIG)"

    REJOINING = "rejoining"  # the end of a note while the node waits for a round (status)

    def lost(self, node: int, why: str, agents: list[subprocess.Popen[bytes]]) -> None:
        """Node's agent died by a signal and the store lives: start it again, or leave it out."""
        step = self.last_step()
        lost = f"lost at step {step} ({why})" if step is not None else f"lost ({why})"
        if self.used >= self.budget:
            note = f"{lost}; not taken back: {self.used}/{self.budget} used (job.max_retries)"
            self._record(node, note, None)
            return
        self.used += 1
        agents[node] = self.start(node)
        self.waiting[node] = lost
        self._record(node, f"{lost}, {self.REJOINING}", agents[node])

    def poll(self) -> None:
        """A node is back once torchrun started its workers: the new round admitted it."""
        if not self.waiting:
            return
        st = state.read(self.run_state)
        joined = {w.node for w in processes.workers(st)}
        for node in [n for n in self.waiting if n in joined]:
            step = self.last_step()
            back = f"back at step {step}" if step is not None else "back"
            self._record(node, f"{self.waiting.pop(node)}, {back}", None)

    def ended(self, node: int, code: int) -> None:
        """A node that was rejoining ended before a round admitted it: most often the others
        finished first and closed the rendezvous it waited on. Not a lost node: the job's end
        is the others' to decide."""
        lost = self.waiting.pop(node)
        end = "back" if code == 0 else f"ended (exit {code}) before it was back"
        self._record(node, f"{lost}, {end}", None)

    def _record(self, node: int, note: str, agent: subprocess.Popen[bytes] | None) -> None:
        # Only the supervisor writes nodes; update() keeps what others wrote (a cancel).
        nodes = list(state.read(self.run_state).nodes)
        update: dict[str, object] = {"note": note}
        if agent is not None:
            update |= {"pid": agent.pid, "start_time": state.start_time(agent.pid),
                       "exit_code": None, "rejoins": nodes[node].rejoins + 1}  # fmt: skip
        nodes[node] = nodes[node].model_copy(update=update)
        state.update(self.run_state, nodes=nodes, message=f"node {node} {note}")
        print(f"trainmaster supervisor: node {node} {note}", flush=True)
