"""data/share.py: a stage's tasks shared between this process and forked workers."""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from trainmaster.data.settings import ExampleSettings
from trainmaster.data.share import _claim, workers
from trainmaster.data.vocab import load_vocab
from trainmaster.errors import DataError

_PARENT = os.getpid()
_CLAIMED = mp.get_context("fork").Event()  # inherited by the forked workers


def _pid(item: int, worker: Any = None) -> tuple[int, int]:
    return item, os.getpid()


def _fails_in_a_worker(item: int, worker: Any = None) -> int:
    """This process's task waits until a forked worker has taken the other one, which fails."""
    if os.getpid() != _PARENT:
        _CLAIMED.set()
        raise DataError("cannot read (a test's failure)", where=f"slice {item}")
    assert _CLAIMED.wait(60), "no forked worker took a task"
    return item


def _killed(item: int, worker: Any = None) -> int:
    """A forked worker dies holding this task, as the OOM killer would kill it; this
    process's task waits until one has taken the other task."""
    if os.getpid() != _PARENT:
        _CLAIMED.set()
        os.kill(os.getpid(), signal.SIGKILL)
    assert _CLAIMED.wait(60), "no forked worker took a task"
    return item


def _exits(item: int, worker: Any = None) -> int:
    """A forked worker leaves in the middle of the stage (a C extension calling exit())."""
    if os.getpid() != _PARENT:
        _CLAIMED.set()
        os._exit(3)
    assert _CLAIMED.wait(60), "no forked worker took a task"
    return item


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_task_runs_once_and_stages_follow(pydoc_vocab: Path, n: int) -> None:
    with workers(n, load_vocab(pydoc_vocab), True, ExampleSettings()) as run:
        first = list(run(_pid, range(200)))
        second = list(run(_pid, range(7), final=True))
    for got, count in ((first, 200), (second, 7)):
        assert sorted(item for item, _ in got) == list(range(count))
        assert len({pid for _, pid in got}) <= n


def test_a_forked_workers_failure_reaches_the_caller(pydoc_vocab: Path) -> None:
    _CLAIMED.clear()
    failure = r"slice \d: cannot read \(a test's failure\)"
    with (
        workers(2, load_vocab(pydoc_vocab), True, ExampleSettings()) as run,
        pytest.raises(DataError, match=failure),
    ):
        list(run(_fails_in_a_worker, range(2)))


# The failure these guard against was a hang: a timeout, not a measured time, ends them.
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize(
    ("task", "how"),
    [(_killed, r"was killed by SIGKILL \(out of memory\?\)"), (_exits, "exited with code 3")],
    ids=["SIGKILL", "exit-3"],
)
def test_a_dead_forked_worker_ends_the_run(
    pydoc_vocab: Path, n: int, task: Callable[..., int], how: str
) -> None:
    _CLAIMED.clear()
    before = _children()
    error = rf"^data prepare: worker \d \(pid (\d+)\) {how} during the {task.__name__} stage; "
    with (
        pytest.raises(DataError, match=error) as caught,
        workers(n, load_vocab(pydoc_vocab), True, ExampleSettings()) as run,
    ):
        assert sorted(k for k, _ in run(_pid, range(50))) == list(range(50))  # then the next
        list(run(task, range(2)))
    found = re.search(r"pid (\d+)", str(caught.value))
    assert found and int(found.group(1)) not in before
    assert _children() <= before  # the others stopped too, and every one reaped


def test_a_worker_killed_between_stages_ends_the_next(pydoc_vocab: Path) -> None:
    before = _children()
    with (
        pytest.raises(DataError, match=r"worker 1 \(pid \d+\) was killed by SIGKILL"),
        workers(2, load_vocab(pydoc_vocab), True, ExampleSettings()) as run,
    ):
        list(run(_pid, range(3)))
        (worker,) = _children() - before
        os.kill(worker, signal.SIGKILL)  # idle, waiting for the next stage
        list(run(_pid, range(3)))
    assert _children() <= before


def _take_and_die(counter: Any) -> None:
    counter.get_lock().acquire()
    os.kill(os.getpid(), signal.SIGKILL)  # the lock stays taken for good


class _Stalled(Exception):
    pass


def _stalled() -> None:
    raise _Stalled


def test_a_claim_does_not_wait_forever_on_a_lock_whose_holder_died() -> None:
    """A worker killed between taking the counter's lock and giving it back: this process,
    which must notice the death, is not stuck waiting for the lock."""
    ctx = mp.get_context("fork")
    counter = ctx.Value("q", 0)
    holder = ctx.Process(target=_take_and_die, args=(counter,))
    holder.start()
    holder.join()
    assert holder.exitcode == -signal.SIGKILL
    with pytest.raises(_Stalled):
        _claim(counter, _stalled)
