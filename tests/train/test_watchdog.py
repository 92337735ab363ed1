"""The hang watchdog's thread, without torch (docs/architecture.md 5: 14.1): it fires only after
the timeout of no step, dumps the stack of the stuck thread, records the hang and calls its exit
function."""

from __future__ import annotations

import threading
from pathlib import Path

from trainmaster.storage import RunPaths
from trainmaster.train import scriptnet, watchdog
from trainmaster.train.watchdog import Watchdog, derived_timeout


def test_timeout_is_derived_from_the_slowest_recent_step_with_a_floor() -> None:
    assert derived_timeout([], None) is None  # not armed before a step has finished
    assert derived_timeout([0.2, 0.5], None) == watchdog.FLOOR_S
    assert derived_timeout([1.0, 40.0, 2.0], None) == 40.0 * watchdog.FACTOR
    assert derived_timeout([0.2], 12.5) == 12.5  # configured wins
    assert derived_timeout([0.2], 0) is None  # 0: off


def stuck_in_a_collective(release: threading.Event) -> None:
    release.wait(60)  # the frame the dump must show


def test_stuck_worker_is_dumped_recorded_and_ended(tmp_path: Path) -> None:
    exited: list[int] = []
    fired = threading.Event()

    def exit_fn(code: int) -> None:
        exited.append(code)
        fired.set()

    wd = Watchdog(
        logs=tmp_path / "logs",
        hangs=tmp_path / "hangs.jsonl",
        rank=3,
        node=1,
        configured=0.3,
        exit_fn=exit_fn,
        poll_s=0.05,
    )
    assert wd.timeout is None  # not armed: nothing fires during start-up and compilation
    wd.start()
    wd.beat(7, 0.01)
    wd.where = "step 8: loss all_reduce"
    release = threading.Event()
    worker = threading.Thread(target=stuck_in_a_collective, args=(release,), name="trainer")
    worker.start()
    try:
        assert fired.wait(30), "the watchdog never fired"
    finally:
        release.set()
        worker.join()
    assert exited == [watchdog.EXIT_HUNG]
    [hang] = watchdog.read_hangs(tmp_path / "hangs.jsonl")
    assert (hang.rank, hang.node, hang.step, hang.where) == (3, 1, 7, "step 8: loss all_reduce")
    assert hang.no_step_s >= 0.3 and hang.timeout_s == 0.3
    assert hang.describe().startswith("rank 3 on node 1: no step for ")
    dump = (tmp_path / "logs" / hang.dump).read_text()
    assert "stuck_in_a_collective" in dump and "hang: rank 3 on node 1" in dump


def test_beats_keep_it_quiet_and_stop_disarms_it(tmp_path: Path) -> None:
    exited: list[int] = []
    wd = Watchdog(
        logs=tmp_path / "logs",
        hangs=tmp_path / "hangs.jsonl",
        rank=0,
        node=0,
        configured=2.0,
        exit_fn=exited.append,
        poll_s=0.02,
    )
    wd.start()
    # 3 s of beats 0.05 s apart: longer than the timeout, each beat well within it.
    for step in range(1, 61):
        wd.beat(step, 0.01)
        wd._stop.wait(0.05)
    wd.stop()
    wd._thread.join(5)
    assert not wd._thread.is_alive() and exited == []
    assert not (tmp_path / "hangs.jsonl").exists()


def test_switched_off_it_starts_no_thread(tmp_path: Path) -> None:
    wd = Watchdog(logs=tmp_path, hangs=tmp_path / "h.jsonl", rank=0, node=0, configured=0)
    wd.start()
    wd.beat(1, 0.1)
    assert not wd._thread.is_alive() and wd.timeout is None


def test_unreadable_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "hangs.jsonl"
    path.write_text('{"t": 1, "rank": 0}\nnot json\n')
    assert watchdog.read_hangs(path) == []


def test_a_hang_says_once_where_the_rank_stood(tmp_path: Path) -> None:
    """The label of a point between steps ("after step 4", what a custom script's progress
    sets) is the whole place; a phase of the next step is said after the last step done."""
    net = scriptnet.Net(RunPaths(tmp_path), rank=0, node=0, hang_timeout=5.0)
    net.progress(4)  # a script's log_metrics(4) or heartbeat(): the watchdog is not started

    def said(where: str) -> str:
        step = net.watchdog.step
        hang = watchdog.Hang(0.0, 0, 0, step, 6.0, where, timeout_s=5.0, dump="hang-rank0.txt")
        return hang.describe()

    head = "rank 0 on node 0: no step for 6 s (timeout 5 s) "
    assert said(net.watchdog.where) == head + "after step 4"
    net.checkpoint_saved(4)
    assert said(net.watchdog.where) == head + "after the checkpoint of step 4"
    loop = "step 5: data, forward, backward (gradient all_reduce), optimizer"  # train/loop.py
    assert said(loop) == head + f"after step 4, last in {loop}"
