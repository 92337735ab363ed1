"""How `data prepare` shares a stage's tasks between processes: this one and N-1 forked ones.

This process is a worker too: with 2 workers it forks one process, not two, so one worker
pays no process start (fork, building its encoder, faulting in a fresh heap) and no core
waits on a parent that only hands out tasks. The tasks of a stage are claimed from one
shared counter, by this process between its own tasks and by each forked one in a loop:
whoever is free takes the next, so a slow task or a busy core leaves no one idle until the
last task. Results (small: row counts, seconds) come back as they are made, in any order.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from trainmaster.data import pool as tasks
from trainmaster.data.examples import ExampleSettings
from trainmaster.data.vocab import Vocab

# run(fn, items, final=False) -> each item's result, in any order; final: the last stage,
# after which the forked workers exit (while this process commits the output).
Runner = Callable[..., Iterator[Any]]

_SHARED: tuple[Any, Any] | None = None  # (next task, results) of a forked worker


def _init(worker: tasks.Worker, claim: Any, out: Any) -> None:
    global _SHARED
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    tasks.init_pool_worker(worker)
    _SHARED = (claim, out)


def _claim(counter: Any) -> int:
    with counter.get_lock():
        k = int(counter.value)
        counter.value = k + 1
    return k


def _drain(fn: Callable[..., Any], items: Sequence[Any]) -> None:
    """A forked worker's part of a stage: claim tasks until none is left, sending each result
    as soon as it is made (the parent reports progress); a failure ends the loop."""
    assert _SHARED is not None, "_init did not run"
    counter, out = _SHARED
    while (k := _claim(counter)) < len(items):
        try:
            out.put((True, fn(items[k])))
        except Exception as exc:  # noqa: BLE001 (any error is the parent's to report)
            out.put((False, exc))
            return


@contextmanager
def workers(n: int, vocab: Vocab, lower_case: bool, settings: ExampleSettings) -> Iterator[Runner]:
    """A runner over this process and n-1 forked workers (none forked for n == 1).

    Forked workers ignore SIGINT (Ctrl-C reaches the whole process group): this process alone
    decides to stop, terminates them and cleans up. tokenizers must not use its own threads
    in a worker (one worker per core already) nor after a fork.
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
        # and the queue: nothing is pickled and nothing is built again.
        ctx = mp.get_context("fork")
        counter, out = ctx.Value("q", 0), ctx.SimpleQueue()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the workers
        try:
            p = ctx.Pool(n - 1, _init, (local, counter, out))
        finally:
            signal.signal(signal.SIGINT, previous)

        def shared(
            fn: Callable[..., Any], items: Sequence[Any], final: bool = False
        ) -> Iterator[Any]:
            items = list(items)
            counter.value = 0  # no forked worker is between stages' tasks now
            jobs = [p.apply_async(_drain, (fn, items)) for _ in range(n - 1)]
            if final:
                p.close()
            done = 0
            while (k := _claim(counter)) < len(items):
                yield fn(items[k], local)
                done += 1
                while not out.empty():
                    yield _result(out.get())
                    done += 1
            while done < len(items):
                yield _result(out.get())
                done += 1
            for job in jobs:
                job.get()  # every forked worker is out of the loop before the next stage

        try:
            yield shared
        finally:
            p.terminate()
            p.join()
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def _result(sent: tuple[bool, Any]) -> Any:
    ok, value = sent
    if not ok:
        raise value
    return value
