"""The cacheset lock with real processes: waiting, refusal, stale locks, handing over."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from trainmaster.compile import lock
from trainmaster.errors import UserError


class Proc:
    """A tests.compile.holder process, read line by line (blocking reads, bounded by a timeout)."""

    def __init__(self, folder: Path, job: str, wait_s: float = 0.0) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-m", "tests.compile.holder", str(folder), job, str(wait_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def line(self, timeout: float = 60) -> str:
        assert self.p.stdout is not None
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            ready, _, _ = select.select([self.p.stdout], [], [], 0.5)
            if ready:
                return self.p.stdout.readline().strip()
        raise AssertionError("no line from the holder process in time")

    def release(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write("\n")
        self.p.stdin.flush()

    def end(self) -> int:
        """Close its stdin (a holder then releases and exits); kill it if it does not."""
        if self.p.stdin is not None and not self.p.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.p.stdin.close()
        try:
            return self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return self.p.wait(timeout=30)


@contextmanager
def holder(folder: Path, job: str, wait_s: float = 0.0) -> Iterator[Proc]:
    proc = Proc(folder, job, wait_s)
    try:
        yield proc
    finally:
        proc.end()


def test_second_job_waits_until_the_first_releases(tmp_path: Path) -> None:
    with holder(tmp_path, "first") as first:
        assert first.line().startswith("held ")
        second = Proc(tmp_path, "second", wait_s=120)  # started once the first holds the lock
        assert second.line() == "waiting first"
        assert lock.read(tmp_path) is not None and lock.read(tmp_path)[0].job == "first"  # type: ignore[index]
        first.release()
        assert first.line() == "released"
        assert second.line().startswith("held ")
        assert lock.read(tmp_path)[0].job == "second"  # type: ignore[index]
        second.release()
        assert second.line() == "released" and second.end() == 0
        assert first.end() == 0
    assert lock.read(tmp_path) is None


def test_refused_after_the_timeout_naming_the_holder(tmp_path: Path) -> None:
    with holder(tmp_path, "busy") as first:
        assert first.line().startswith("held ")
        t0 = time.monotonic()
        with pytest.raises(UserError) as err:
            lock.acquire(tmp_path, job="me", purpose="train", wait_s=1.0)
        assert time.monotonic() - t0 >= 1.0
        text = str(err.value)
        assert f"in use by job busy (train; pid {first.p.pid} on {socket.gethostname()}" in text
        assert "after waiting 1 s" in text and "--wait-lock" in text
        with pytest.raises(UserError, match="in use by job busy"):
            lock.acquire(tmp_path, job="me", purpose="train")  # no wait: at once


def test_lock_of_a_killed_process_is_recovered(tmp_path: Path) -> None:
    with holder(tmp_path, "doomed") as doomed:
        assert doomed.line().startswith("held ")
        os.kill(doomed.p.pid, signal.SIGKILL)  # no chance to release
        doomed.p.wait(timeout=30)
    left = lock.read(tmp_path)
    assert left is not None and left[0].pid == doomed.p.pid
    assert lock.stale_reason(*left) == f"pid {doomed.p.pid} on this host is gone"
    held = lock.acquire(tmp_path, job="next", purpose="precompile")
    assert lock.read(tmp_path)[0].job == "next"  # type: ignore[index]
    held.release()
    assert not list(tmp_path.glob(".lock*"))  # no leftovers of the take-over


def _foreign(folder: Path, age_s: float) -> None:
    """A lock of a process on another node, last heartbeat age_s ago."""
    path = lock.path_of(folder)
    path.write_text(
        json.dumps(
            {
                "pid": 1,
                "host": "other-node",
                "job": "remote",
                "purpose": "train",
                "since": time.time() - age_s,
                "token": "abc",
            }
        )
    )
    os.utime(path, (time.time() - age_s, time.time() - age_s))


def test_another_nodes_lock_is_stale_only_without_heartbeat(tmp_path: Path) -> None:
    _foreign(tmp_path, age_s=5)
    with pytest.raises(UserError, match="job remote .*pid 1 on other-node"):
        lock.acquire(tmp_path, job="me", purpose="train")
    _foreign(tmp_path, age_s=lock.STALE_S + 60)
    held = lock.acquire(tmp_path, job="me", purpose="train")
    assert held.owned()
    held.release()


def test_heartbeat_keeps_the_lock_fresh(tmp_path: Path) -> None:
    held = lock.acquire(tmp_path, job="me", purpose="train")
    old = time.time() - 1000
    os.utime(lock.path_of(tmp_path), (old, old))
    held.start_heartbeat(every_s=0.05)
    end = time.monotonic() + 30
    while lock.path_of(tmp_path).stat().st_mtime == old:
        assert time.monotonic() < end, "no heartbeat"
        time.sleep(0.05)  # polling the heartbeat thread's effect, bounded
    held.release()
    assert lock.read(tmp_path) is None


def test_hand_over_adopt_and_release_only_what_is_ours(tmp_path: Path) -> None:
    held = lock.acquire(tmp_path, job="job", purpose="train")
    held.hand_over(12345)
    assert lock.read(tmp_path)[0].pid == 12345  # type: ignore[index]
    adopted = lock.adopt(tmp_path, held.holder.token)
    assert adopted is not None and lock.adopt(tmp_path, "another-token") is None
    # Taken over by someone else (it looked stale): our release leaves their lock alone.
    lock.path_of(tmp_path).unlink()
    theirs = lock.acquire(tmp_path, job="theirs", purpose="train")
    adopted.release()
    assert theirs.owned()
    theirs.release()


def test_a_restarted_job_reclaims_its_own_lock(tmp_path: Path) -> None:
    _foreign(tmp_path, age_s=1)  # job "remote": its previous rank-0 pod, gone
    with pytest.raises(UserError):
        lock.acquire(tmp_path, job="remote", purpose="train")
    held = lock.acquire(tmp_path, job="remote", purpose="train", reclaim_own_job=True)
    assert held.owned()
    held.release()


def test_worker_uses_the_launchers_lock(tmp_path: Path) -> None:
    launcher = lock.acquire(tmp_path, job="job", purpose="train")
    assert (
        lock.for_worker(tmp_path, job="job", launcher_token=launcher.holder.token, wait_s=0) is None
    )
    launcher.release()
    own = lock.for_worker(tmp_path, job="job", launcher_token=None, wait_s=0)
    assert own is not None and own.owned()
    own.release()


# --- docs/architecture.md 5: 17.3: a lock is never seen half-written ------------------------------


def test_a_contender_never_steals_a_lock_being_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A contender runs while the first acquirer is writing its lock's content. Creating the lock
    file first and writing it after showed the contender an empty file, which it took for a dead
    holder's and stole: both then believed they held the cacheset."""
    contender: list[object] = []
    real_dumps = json.dumps

    def dumps_with_a_contender(obj: object, **kw: object) -> str:
        if not contender:  # the first acquirer is between creating and writing its lock
            contender.append(None)  # the contender's own dumps goes straight through
            try:
                contender.append(lock.acquire(tmp_path, job="second", purpose="train"))
            except UserError as err:
                contender.append(err)
        return real_dumps(obj, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(lock.json, "dumps", dumps_with_a_contender)
    try:
        first: object = lock.acquire(tmp_path, job="first", purpose="train")
    except UserError as err:
        first = err
    monkeypatch.setattr(lock.json, "dumps", real_dumps)
    holders = [h for h in (first, *contender[1:]) if isinstance(h, lock.CacheLock)]
    assert len(holders) == 1, (first, contender)  # exactly one holds the cacheset
    assert holders[0].owned()


def _with_other_start(holder: lock.Holder) -> lock.Holder:
    return dataclasses.replace(holder, also=tuple((p, (t or 0) + 1) for p, t in holder.also))


# --- docs/architecture.md 5: 17.7: a killed supervisor keeps the cache while its workers compile -


def test_lock_of_a_dead_holder_is_held_while_its_agents_live(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    held = lock.acquire(tmp_path, job="first", purpose="train", pid=int(dead.stdout))
    agent = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        held.also_held_by([agent.pid])
        holder, mtime = lock.read(tmp_path)  # type: ignore[misc]
        assert [pid for pid, _ in holder.also] == [agent.pid]
        assert lock.stale_reason(holder, mtime) is None  # the supervisor's pid alone is gone
        # The dead supervisor's heartbeat stopped too: the live agent still holds the lock.
        assert lock.stale_reason(holder, mtime, now=mtime + 10 * lock.STALE_S) is None
        reused = _with_other_start(holder)  # the agent's pid, another process by now
        assert lock.stale_reason(reused, mtime) == f"pid {holder.pid} on this host is gone"
        with pytest.raises(UserError, match="in use by job first"):
            lock.acquire(tmp_path, job="second", purpose="train")
    finally:
        agent.communicate(b"", timeout=30)
    holder, mtime = lock.read(tmp_path)  # type: ignore[misc]
    assert lock.stale_reason(holder, mtime) == f"pid {holder.pid} on this host is gone"
