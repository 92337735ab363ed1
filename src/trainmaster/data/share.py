"""How `data prepare` shares a stage's tasks between processes: this one and N-1 forked ones.

This process is a worker too (worker 0): with 2 workers it forks one process, not two, so one
worker pays no process start (fork, building its encoder, faulting in a fresh heap) and no
core waits on a parent that only hands out tasks. The tasks of a stage are claimed from one
shared counter, by this process between its own tasks and by each forked one in a loop:
whoever is free takes the next, so a slow task or a busy core leaves no one idle until the
last task. Results (small: row counts, seconds) come back as they are made, in any order.

Plain processes, not a multiprocessing Pool: a worker killed by the OOM killer or a crash in a
C extension never sends the result of the task it claimed, and a Pool, which quietly starts a
replacement, left this process waiting for it forever. Whenever this process waits, it waits
on the results and on the workers' exits together: a worker that exits before it has left the
stage ends the run at once, with an error that says which one died and how. One that stays
alive but sends nothing for stall_s (stopped, deadlocked, stuck in a C call) ends it the same
way, saying so: a task takes seconds, so silence that long is no slow task.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from trainmaster.data import pool as tasks
from trainmaster.data.settings import ExampleSettings
from trainmaster.data.vocab import Vocab
from trainmaster.errors import DataError

# run(fn, items, final=False) -> each item's result, in any order; final: the last stage,
# after which the forked workers exit (while this process commits the output).
Runner = Callable[..., Iterator[Any]]

_HINTS = {"SIGKILL": " (out of memory?)", "SIGSEGV": " (a crash in a C extension?)"}
STALL_S = 600.0  # a forked worker silent this long in a stage is hung (--stall-timeout)


def _claim(counter: Any, stalled: Callable[[], None] = lambda: None) -> int:
    """The next task of the stage. A worker killed while holding the lock never releases it:
    this process does not wait on it blindly but looks for a dead worker (`stalled`)."""
    lock = counter.get_lock()
    while not lock.acquire(timeout=1.0):
        stalled()
    try:
        k = int(counter.value)
        counter.value = k + 1
    finally:
        lock.release()
    return k


def _serve(me: int, team: _Forked, local: tasks.Worker, stages: Connection) -> None:
    """A forked worker: each stage this process sends, its tasks claimed until none is left,
    each result sent as soon as it is made (a failure ends its part of the stage), then
    'left'. Results are small (one pipe write, atomic): a worker killed while sending leaves
    no half message behind."""

    def send(kind: str, value: Any) -> None:
        with team.lock:
            team.out.send((me, kind, value))

    # The parent's ends of the pipes, closed here: once it is gone, recv and send fail.
    for end in [team.results, *team.stages.values()]:
        end.close()
    tasks.init_pool_worker(local)  # the parent's Worker, copied by the fork: built once
    try:
        while (stage := stages.recv()) is not None:
            fn, items = stage
            while (k := _claim(team.counter)) < len(items):
                try:
                    send("result", fn(items[k]))
                except Exception as exc:  # any error is the parent's to report
                    send("failed", exc)
                    break
            send("left", None)
    except (EOFError, BrokenPipeError):  # the parent was killed: no one waits for the work
        return


class _Forked:
    """The forked workers, from this process's side."""

    def __init__(self, counter: Any, stall_s: float = STALL_S) -> None:
        self.counter, self.stall_s = counter, stall_s
        self.heard: dict[int, float] = {}  # worker -> when it last sent something (monotonic)
        self.procs: dict[int, BaseProcess] = {}
        self.stages: dict[int, Connection] = {}
        self.busy: dict[int, BaseProcess] = {}  # the workers not yet out of the current stage
        self.stage = ""

    def start(self, n: int, local: tasks.Worker) -> None:
        ctx = mp.get_context("fork")
        # This process keeps the writing end too: the results pipe never reads as ended.
        self.results, self.out = ctx.Pipe(duplex=False)
        self.lock = ctx.Lock()  # one result at a time on the pipe
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the workers
        try:
            for me in range(1, n):
                theirs, ours = ctx.Pipe(duplex=False)
                self.stages[me] = ours
                p = ctx.Process(target=_serve, args=(me, self, local, theirs), daemon=True)
                p.start()
                self.procs[me] = p
                theirs.close()  # only the worker holds it: a dead one's pipe breaks
        finally:
            signal.signal(signal.SIGINT, previous)

    def begin(self, fn: Callable[..., Any], items: list[Any], final: bool) -> None:
        self.counter.value = 0  # every forked worker has left the last stage
        self.stage = getattr(fn, "__name__", "a").removesuffix("_task")
        self.busy = dict(self.procs)
        self.heard = dict.fromkeys(self.procs, time.monotonic())
        for me, conn in self.stages.items():
            try:
                conn.send((fn, items))
                if final:
                    conn.send(None)
            except OSError:  # it died since the last stage
                raise self._death(me) from None

    def check(self) -> None:
        """While the counter's lock stays taken: did its holder die or hang? (A worker exits
        by itself only after it has left the stage, with code 0.)"""
        for me, p in self.busy.items():
            if p.exitcode not in (None, 0):
                raise self._death(me)
        self._stalled()

    def _stalled(self) -> None:
        now = time.monotonic()
        for me in self.busy:
            if now - self.heard[me] > self.stall_s:
                raise self._hung(me, now - self.heard[me])

    def collect(self, block: bool) -> list[Any]:
        """The results sent so far (block: at least one, or a worker leaving the stage); a
        worker that exits before it has left the stage raises."""
        # Blocking, it wakes at the latest when the quietest worker's silence runs out.
        quietest = min((self.heard[me] for me in self.busy), default=time.monotonic())
        timeout = max(0.0, quietest + self.stall_s - time.monotonic()) + 0.05 if block else 0
        ready = wait([self.results, *(p.sentinel for p in self.busy.values())], timeout)
        got = []
        while self.results.poll():  # all a worker sent is here before its exit is seen
            me, kind, value = self.results.recv()
            self.heard[me] = time.monotonic()
            if kind == "failed":
                raise value
            if kind == "left":
                del self.busy[me]
            else:
                got.append(value)
        for me, p in self.busy.items():
            if p.sentinel in ready:
                raise self._death(me)
        self._stalled()
        return got

    def _death(self, me: int) -> DataError:
        p = self.procs[me]
        p.join()
        how = f"exited with code {p.exitcode}"
        if p.exitcode is not None and p.exitcode < 0:
            name = signal.Signals(-p.exitcode).name
            how = f"was killed by {name}{_HINTS.get(name, '')}"
        return DataError(
            f"worker {me} (pid {p.pid}) {how} during the {self.stage} stage; the output is "
            "unchanged; rerun, with fewer --workers if memory is short",
            where="data prepare",
        )

    def _hung(self, me: int, silent: float) -> DataError:
        p = self.procs[me]
        return DataError(
            f"worker {me} (pid {p.pid}) sent nothing for {silent:.0f} s during the {self.stage} "
            f"stage (hung or stopped; --stall-timeout {self.stall_s:g}); the output is "
            "unchanged; rerun",
            where="data prepare",
        )

    def stop(self) -> None:
        """Kill whatever still runs (after the final stage, nothing does) and reap them all."""
        for p in self.procs.values():
            if p.exitcode is None:
                p.kill()
        for p in self.procs.values():
            p.join()


@contextmanager
def workers(
    n: int, vocab: Vocab, lower_case: bool, settings: ExampleSettings, stall_s: float = STALL_S
) -> Iterator[Runner]:
    """A runner over this process and n-1 forked workers (none forked for n == 1); a forked
    worker that sends nothing for stall_s seconds in a stage ends the run (DataError).

    Forked workers ignore SIGINT (Ctrl-C reaches the whole process group): this process alone
    decides to stop, kills them and cleans up. tokenizers must not use its own threads in a
    worker (one worker per core already) nor after a fork.
    """
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    local = tasks.Worker(vocab.tokens, lower_case, settings)
    try:
        if n == 1:

            def here(fn: Callable[..., Any], items: Sequence[Any], final: bool = False) -> Any:
                return (fn(item, local) for item in items)

            yield here
            return
        # Forked, the workers inherit this process's Worker (its encoder built), the counter
        # and the result pipe: nothing of them is pickled and nothing is built again.
        team = _Forked(mp.get_context("fork").Value("q", 0), stall_s)
        try:
            team.start(n, local)

            def shared(
                fn: Callable[..., Any], items: Sequence[Any], final: bool = False
            ) -> Iterator[Any]:
                items = list(items)
                team.begin(fn, items, final)
                done = 0
                while (k := _claim(team.counter, team.check)) < len(items):
                    yield fn(items[k], local)
                    done += 1
                    for r in team.collect(block=False):
                        yield r
                        done += 1
                while done < len(items) or team.busy:  # every worker out before the next stage
                    for r in team.collect(block=True):
                        yield r
                        done += 1

            yield shared
        finally:
            team.stop()
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved
