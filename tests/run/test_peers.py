"""The peer watch (run/peers.py): heartbeats on the shared storage, a peer taken for lost only
when its heartbeat stopped while the job stood still as long, and the fence that ends an attempt
another one replaced. Real threads and files; where a test needs exact seconds it drives the
watch's look() with a clock of its own."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from trainmaster.run import peers


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def watch(
    tmp_path: Path, node: int, stalled: list[float], clock: Clock | None = None, **kw
) -> peers.PeerWatch:
    lost: list[tuple[int, float]] = []
    w = peers.PeerWatch(
        folder=tmp_path / "heartbeats" / "attempt-v0",
        node=node,
        nodes=3,
        fence=peers.Fence(tmp_path / "fence", "attempt-v0"),
        stalled_s=lambda: stalled[0],
        on_lost=lambda n, s: lost.append((n, s)),
        on_fenced=lambda why: None,
        **({"clock": clock} if clock else {}),
        **{"lost_after_s": 10.0, **kw},
    )
    w.folder.mkdir(parents=True, exist_ok=True)
    w.lost = lost  # type: ignore[attr-defined]
    return w


def tick(clock: Clock, stalled: list[float], *beating: peers.PeerWatch) -> None:
    clock.t += 2
    stalled[0] += 2
    for w in beating:
        w.beat()


def test_a_peer_whose_heartbeat_stops_while_the_job_stands_still_is_lost(tmp_path: Path) -> None:
    clock, stalled = Clock(), [0.5]
    me, alive, dead = (watch(tmp_path, n, stalled, clock) for n in (0, 1, 2))
    for w in (me, alive, dead):
        w.beat()
    assert me.look() is None  # the job moves: nothing read, nothing judged
    stalled[0] = peers.LOOK_AFTER_S
    assert me.look() is None  # the first look: values noted
    found = []
    for _ in range(5):  # 10 s: node 1 beats every 2 s, node 2 never again
        tick(clock, stalled, me, alive)
        found.append(me.look())
    assert found == [None, None, None, None, (2, 10.0)]
    tick(clock, stalled, me, alive)
    assert me.look() is None  # judged once: an elastic job goes on without it
    dead.beat()  # a new pod in its place beats anew: watched again
    for _ in range(5):
        tick(clock, stalled, me, alive)
        assert me.look() is None or me.look() == (2, pytest.approx(10.0))


def test_a_silent_peer_is_not_lost_while_the_job_moves(tmp_path: Path) -> None:
    """Steps that complete prove every peer answered: a heartbeat late (a node overloaded,
    storage slow to show it) is no loss."""
    clock, stalled = Clock(), [peers.LOOK_AFTER_S]
    me, other = watch(tmp_path, 0, stalled, clock), watch(tmp_path, 1, stalled, clock)
    other.beat()
    me.beat()
    me.look()
    clock.t += 30
    stalled[0] = 3.0  # the metrics grew meanwhile
    me.beat()
    assert me.look() is None
    stalled[0] = 9.0  # standing still again, but not for lost_after_s since the values were noted
    clock.t += 5
    me.beat()
    assert me.look() is None


def test_nobody_is_judged_while_this_nodes_own_beats_do_not_go_through(tmp_path: Path) -> None:
    """A storage that stalls for everyone makes every node look silent: no verdict then."""
    clock, stalled = Clock(), [60.0]
    me, other = watch(tmp_path, 0, stalled, clock), watch(tmp_path, 1, stalled, clock)
    other.beat()
    me.beat()
    me.look()
    clock.t += 30  # 30 s without one of this node's own beats going through
    assert me.look() is None
    me.beat()
    assert me.look() == (1, 30.0)


def test_a_peer_that_finished_or_never_beat_is_never_lost(tmp_path: Path) -> None:
    clock, stalled = Clock(), [peers.LOOK_AFTER_S]
    me, done = watch(tmp_path, 0, stalled, clock), watch(tmp_path, 1, stalled, clock)
    done.beat()
    done.stop()  # its command ended well: the file says "done"
    me.beat()
    me.look()
    clock.t += 60
    stalled[0] = 60.0
    me.beat()
    assert me.look() is None  # node 1 done, node 2 no file at all


def test_the_thread_reports_a_lost_peer_and_beats_meanwhile(tmp_path: Path) -> None:
    reported = threading.Event()
    stalled = [60.0]  # the job has stood still for a minute already
    me = watch(tmp_path, 0, stalled, beat_s=0.01, lost_after_s=0.05)
    me.on_lost = lambda n, s: (me.lost.append((n, s)), reported.set())  # type: ignore[attr-defined]
    (me.folder / "node-1").write_text("7\n")  # a peer that beat once, then never again
    me.start()
    try:
        assert reported.wait(30)
    finally:
        me.stop(done=False)
    assert me.lost[0][0] == 1  # type: ignore[attr-defined]
    assert (me.folder / "node-0").read_text().strip().isdigit()


def test_an_attempt_replaced_by_a_newer_one_is_fenced(tmp_path: Path) -> None:
    """Once its own claim was seen, another holder ends the attempt; before that, the holder is
    the attempt before it (its rank 0 has not claimed yet)."""
    old = watch(tmp_path, 1, [0.0])
    assert old.fenced() is None  # no fence yet
    peers.Fence(tmp_path / "fence", "earlier").claim()
    assert old.fenced() is None
    old.fence.claim()
    assert old.fenced() is None
    peers.Fence(tmp_path / "fence", "attempt-v1").claim()
    assert old.fenced() == "attempt-v1"
    with pytest.raises(peers.Fenced, match="attempt attempt-v1 holds the run"):
        old.fence.check()


def test_the_thread_calls_on_fenced(tmp_path: Path) -> None:
    fenced = threading.Event()
    why: list[str] = []
    me = watch(tmp_path, 0, [0.0], beat_s=0.01)
    me.on_fenced = lambda text: (why.append(text), fenced.set())  # type: ignore[method-assign]
    me.fence.claim()
    me.start()
    peers.Fence(tmp_path / "fence", "attempt-v1").claim()
    assert fenced.wait(30)
    assert "attempt-v1 holds the run" in why[0]


def test_progress_counts_from_the_last_change_of_the_runs_files(tmp_path: Path) -> None:
    clock = Clock()
    metrics = tmp_path / "metrics.jsonl"
    progress = peers.Progress([metrics, tmp_path / "timeline.jsonl"], clock)
    clock.t += 5
    assert progress.stalled_s() == 5.0  # nothing there yet: standing still since the start
    metrics.write_text("{}\n")
    assert progress.stalled_s() == 0.0
    clock.t += 7
    assert progress.stalled_s() == 7.0
