"""A run whose work is done while a node's agent still waits: the supervisor ends it as succeeded.

torch 2.13 sometimes aborts a gloo worker as its interpreter exits, after the script finished
(`terminate called without an active exception`, exit -6), even with destroy_process_group.
torchrun counts that as a failed worker group: the node's agent restarts its workers and waits
in a new rendezvous round for the other nodes, which never come. Their agents wait in the exit
barrier (torch/distributed/elastic/agent/server/api.py _exit_barrier, 300 s) and then exit 0;
the restarted agent waits out the join timeout (rendezvous.timeout, 600 s) and the job failed
although every step ran.

The run is done, and the waiting agents are stopped, when all of this holds:
- the work finished: rank 0's summary.json of this launch (written only at a normal end: by the
  trainer, or by the entry shim when the script returned 0), or, for a custom script, a node
  whose workers all finished: its agent exited 0 (torchrun exits 0 only when all its workers
  did), or, while that agent still waits in the exit barrier, the shim said so for each of its
  workers (RUN/finished/nodeN.L, written after this attempt's last start). A gang's workers
  cannot all finish while a peer's are missing, unless the script had ended; so a rank 0 that
  dies at the end of a custom script after the other nodes finished ends the job at once, not
  after the barrier's 300 s. Not for the trainer: there an agent at 0 with no summary may mean
  rank 0 died writing the final checkpoint;
- no worker of the run is alive: nothing is still computing;
- some node lost a worker (torchrun's `failed (exitcode: N)` line in its log) after the last
  start of rank 0 (timeline.jsonl), and has ended or waits with no worker (the restart
  rendezvous); every other node exited 0 or waits with no worker (the exit barrier). A worker
  that failed mid-run made every node restart, so a later rank 0 started after torchrun logged
  that failure: without this test, the agents of a run that restarted and then finished would
  show the same picture while they meet in the exit barrier. A log line whose time does not
  parse counts as no such failure: the job ends as before.

A worker that dies before the end makes its peers' collectives fail, not finish: no summary,
no agent at 0, and the supervisor's retry and rejoin logic acts as before.
"""

from __future__ import annotations

import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from trainmaster.run import processes, state, timeline
from trainmaster.storage import RunPaths

# torch/distributed/elastic/multiprocessing/api.py when a worker of the group failed, in torch's
# log format (elastic/utils/logging.py: level, MMDD HH:MM:SS.uuuuuu in local time, pid, file).
FAILED = re.compile(
    rb"^[EWI](\d{4} \d\d:\d\d:\d\d)(\.\d+) \d+ \S+\] failed \(exitcode: (-?\d+)\) local_rank: ",
    re.MULTILINE,
)
TAIL = 64 << 10  # after the failure the node's agent writes little: a traceback or two
BARRIER_NOTE = "workers finished; agent stopped in torchrun's exit barrier"


@dataclass(frozen=True)
class Stuck:
    """A node whose agent waits (or ended) after one of its workers died at the end."""

    node: int
    code: int  # the worker's exit code as torchrun reports it (-6: SIGABRT)

    @property
    def why(self) -> str:
        return signal.Signals(-self.code).name if self.code < 0 else f"exit code {self.code}"

    @property
    def note(self) -> str:
        verb = "aborted" if self.code < 0 else "failed"
        return f"a worker {verb} at exit ({self.why}) after the run completed"

    def warning(self) -> str:
        """status's message and the supervisor log's line."""
        return f"node {self.node}: {self.note}; job counted as succeeded"


def worker_failure(log: Path, offset: int) -> tuple[float, int] | None:
    """(when, exit code) of the last worker failure torchrun logged since offset, or None."""
    try:
        with log.open("rb") as f:
            f.seek(max(offset, f.seek(0, 2) - TAIL))
            found = FAILED.findall(f.read())
    except OSError:
        return None
    if not found:
        return None
    day, frac, code = (b.decode() for b in found[-1])
    now = time.time()
    year = time.localtime(now).tm_year
    try:  # the line has no year: this one, or the last one for a line from late December
        at = time.mktime(time.strptime(f"{year}{day}", "%Y%m%d %H:%M:%S")) + float(frac)
        if at > now + 86400:
            at = time.mktime(time.strptime(f"{year - 1}{day}", "%Y%m%d %H:%M:%S")) + float(frac)
    except (ValueError, OverflowError):
        return None
    return at, int(code)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


class EndWatch:
    """Polled by the supervisor with every look at its agents; says when the run is done."""

    def __init__(
        self, run: RunPaths, builtin: bool, offsets: list[int], launched: float, nproc: int = 1
    ) -> None:
        self.run, self.builtin, self.offsets, self.launched = run, builtin, offsets, launched
        self.nproc = nproc  # workers per node: a node finished when each of them said so
        self.stuck: list[Stuck] = []  # the verdict, once given
        self.barrier: list[int] = []  # with it: nodes whose workers finished, agent waiting
        # node -> (log size, its last failure): a log that did not grow is not read again
        self.seen: dict[int, tuple[int, tuple[float, int] | None]] = {}

    def check(self, codes: list[int | None], skip: set[int]) -> list[Stuck]:
        """The nodes to stop when the run is done (module docstring), else []. skip: nodes
        that are not part of the gang now (rejoining, or lost and left out)."""
        self.stuck = self._look(codes, skip)
        if self.stuck:
            mine = {s.node for s in self.stuck} | skip
            self.barrier = [i for i, c in enumerate(codes) if c is None and i not in mine]
        return self.stuck

    def _look(self, codes: list[int | None], skip: set[int]) -> list[Stuck]:
        nodes = [i for i in range(len(codes)) if i not in skip]
        zero = [i for i in nodes if codes[i] == 0]
        others = [i for i in nodes if codes[i] != 0]
        if not others:
            return []
        # stats: the cheap test on every poll (state.json grows with the nodes)
        summary = _mtime(self.run.summary) >= self.launched
        said = not self.builtin and _mtime(self.run.finished) >= self.launched
        if not summary and (self.builtin or not (zero or said)):
            return []
        st = state.read(self.run.state)
        if st.cancel_requested or processes.workers(st):
            return []
        starts = [e.t for e in timeline.read(self.run.timeline) if isinstance(e, timeline.Start)]
        if not starts:
            return []
        last = max(starts)
        ended = zero or (said and self._finished(nodes, last))
        if not (state.summary_of_attempt(self.run.state, st) or (ended and not self.builtin)):
            return []
        found = []
        for i in others:
            failure = self._failure(i)
            if failure is not None and failure[0] > last:
                found.append(Stuck(i, failure[1]))
            elif codes[i] is not None:  # ended for another reason (lost): not ours to judge
                return []
        return found

    def _finished(self, nodes: list[int], since: float) -> list[int]:
        """The nodes each of whose workers said its script returned after `since`."""
        return [
            i
            for i in nodes
            if all(_mtime(self.run.finished / f"node{i}.{r}") >= since for r in range(self.nproc))
        ]

    def _failure(self, node: int) -> tuple[float, int] | None:
        log = self.run.logs / f"node{node}.log"
        try:
            size = log.stat().st_size
        except OSError:
            return None
        if node not in self.seen or self.seen[node][0] != size:
            self.seen[node] = (size, worker_failure(log, self.offsets[node]))
        return self.seen[node][1]
