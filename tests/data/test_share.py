"""data/share.py: a stage's tasks shared between this process and forked workers."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import pytest

from trainmaster.data.examples import ExampleSettings
from trainmaster.data.share import workers
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
