"""One job at a time per cacheset: the lock file STORAGE/cache/CACHESET/.lock.

Two jobs compiling into one cache at once corrupt it (the Neuron docs and the AWS tutorial warn
about it). The lock is a file created with O_CREAT | O_EXCL, which is atomic on a local disk,
NFS and Lustre (FSx), so it works across the nodes of a cluster, unlike flock on a Lustre mount
without `-o flock`. It holds who has it (pid, host, job, purpose, since) so that a waiting job
and `cache show` can name the holder. The file appears complete or not at all: the content is
written to a temp file first and hard-linked into place (link fails when the name exists, the
same guarantee as O_EXCL), so a contender never reads a just-created, still-empty lock and takes
it for a dead holder's.

A holder that dies leaves the file behind, so a lock is stale, and taken over, when
- its host is this host and neither its pid nor any of its `also` processes is alive (a killed
  launcher or supervisor; the local supervisor records its node agents as `also`, so a killed
  supervisor, whose heartbeat stops with it, does not free the cache while its workers still
  compile into it: while one of them lives the lock is held, heartbeat or not), or
- its heartbeat stopped: the holder touches the file every HEARTBEAT_S seconds, and a file
  untouched for STALE_S seconds belongs to a holder that is gone (another node, a deleted pod,
  a pid reused by another process).
Taking over renames the stale file away first (only one contender's rename succeeds), and puts
it back when it turns out to be a fresh lock that someone else took in between.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from trainmaster import files
from trainmaster.errors import UserError
from trainmaster.run.pids import pid_alive, start_time

FILE = ".lock"
HEARTBEAT_S = 30.0
STALE_S = 300.0
POLL_S = 0.25


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    job: str
    purpose: str  # precompile | train | clear
    since: float
    token: str
    # More processes of this host that keep the lock held, as (pid, pids.start_time): with the
    # start time a pid reused by an unrelated process does not hold the lock forever.
    also: tuple[tuple[int, int | None], ...] = ()

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"job {self.job} ({self.purpose}; pid {self.pid} on {self.host}, since {when})"


def path_of(cache_dir: Path) -> Path:
    return cache_dir / FILE


def read(cache_dir: Path) -> tuple[Holder, float] | None:
    """The holder and the file's last heartbeat (mtime); None when the cacheset is free."""
    path = path_of(cache_dir)
    try:
        raw = path.read_bytes()
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return None
    return _parse(raw), mtime


def _parse(raw: bytes) -> Holder:
    try:
        data = json.loads(raw)
        return Holder(
            pid=int(data["pid"]),
            host=str(data["host"]),
            job=str(data["job"]),
            purpose=str(data["purpose"]),
            since=float(data["since"]),
            token=str(data["token"]),
            also=tuple((int(p), None if t is None else int(t)) for p, t in data.get("also", ())),
        )
    except (ValueError, KeyError, TypeError):
        # Half-written by a holder that died between create and write: nobody owns it.
        return Holder(pid=0, host="?", job="?", purpose="?", since=0.0, token="")


def stale_reason(
    holder: Holder, mtime: float, *, now: float | None = None, stale_s: float = STALE_S
) -> str | None:
    """Why a lock is stale, or None while its holder may be alive."""
    now = time.time() if now is None else now
    if not holder.token:
        return "an unreadable lock file"
    if holder.host == socket.gethostname():
        if any(pid_alive(pid, started) for pid, started in holder.also):
            return None  # the workers' agents live: they may still be compiling into the cache
        if not pid_alive(holder.pid):
            return f"pid {holder.pid} on this host is gone"
    if now - mtime > stale_s:
        return f"no heartbeat for {now - mtime:.0f} s"
    return None


class CacheLock:
    """A lock this process holds (or hands over); release() removes it if it is still ours."""

    def __init__(self, cache_dir: Path, holder: Holder) -> None:
        self.cache_dir, self.holder = cache_dir, holder
        self.path = path_of(cache_dir)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def owned(self) -> bool:
        current = read(self.cache_dir)
        return current is not None and current[0].token == self.holder.token

    def hand_over(self, pid: int) -> None:
        """Record another process of this host (the supervisor) as the holder; same token."""
        self._rewrite(Holder(**{**asdict(self.holder), "pid": pid}))

    def also_held_by(self, pids: list[int]) -> None:
        """Processes of this host (the node agents) that keep the lock held when the holder's
        own pid is gone: their workers may still be compiling into the cache."""
        also = tuple((pid, start_time(pid)) for pid in pids)
        self._rewrite(Holder(**{**asdict(self.holder), "also": also}))

    def _rewrite(self, holder: Holder) -> None:
        self.holder = holder
        files.write_json(self.path, asdict(self.holder), indent=None)

    def start_heartbeat(self, every_s: float = HEARTBEAT_S) -> None:
        def beat() -> None:
            while not self._stop.wait(every_s):
                if self.owned():
                    with contextlib.suppress(OSError):
                        os.utime(self.path)

        self._thread = threading.Thread(target=beat, name="cache-lock-heartbeat", daemon=True)
        self._thread.start()

    def release(self) -> None:
        self._stop.set()
        if self.owned():
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


def _create(path: Path, holder: Holder) -> bool:
    """Put a complete lock file in place, or return False when one is there. Creating the
    lock itself and writing it after would show contenders an empty file for a moment."""
    tmp = path.with_name(f"{FILE}.{holder.token}.new")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.write(json.dumps(asdict(holder)))
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, path)  # atomic, and fails if the name exists (also over NFS and Lustre)
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return True


def _break(path: Path, seen: bytes) -> None:
    """Remove a stale lock file, unless it changed since it was judged stale."""
    grave = path.with_name(f"{FILE}.stale.{uuid.uuid4().hex}")
    try:
        os.rename(path, grave)
    except FileNotFoundError:
        return
    if grave.read_bytes() != seen:  # another contender replaced it meanwhile: give it back
        with contextlib.suppress(FileExistsError):
            os.link(grave, path)
    grave.unlink()


def acquire(
    cache_dir: Path,
    *,
    job: str,
    purpose: str,
    wait_s: float = 0.0,
    on_wait: Callable[[Holder], None] | None = None,
    stale_s: float = STALE_S,
    pid: int | None = None,
    reclaim_own_job: bool = False,
    token: str | None = None,
) -> CacheLock:
    """Take the cacheset's lock, waiting up to wait_s; UserError naming the holder after that.

    reclaim_own_job: a lock held under this job's name is taken over at once (a restarted
    Kubernetes job finds the lock its previous rank-0 pod left).
    token: the holder's token (default: a new one); the Kubernetes pods of one attempt know
    theirs in advance (backends/kubernetes/cache_hold.py), so rank 0 on any pod finds the lock is its job's.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = path_of(cache_dir)
    me = Holder(
        pid=pid or os.getpid(),
        host=socket.gethostname(),
        job=job,
        purpose=purpose,
        since=time.time(),
        token=token or uuid.uuid4().hex,
    )
    deadline = time.monotonic() + wait_s
    told: str | None = None
    while True:
        if _create(path, me):
            return CacheLock(cache_dir, me)
        try:
            raw, mtime = path.read_bytes(), path.stat().st_mtime
        except FileNotFoundError:
            continue  # released between our create and our read: try again at once
        holder = _parse(raw)
        if (reclaim_own_job and holder.job == job) or stale_reason(holder, mtime, stale_s=stale_s):
            _break(path, raw)
            continue
        if time.monotonic() >= deadline:
            waited = f" after waiting {wait_s:g} s" if wait_s > 0 else ""
            raise UserError(
                f"compile cache {cache_dir.name} is in use by {holder.describe()}{waited}; one job "
                "at a time may use a cacheset: wait for it (--wait-lock SECONDS), use another "
                "(--set train.cacheset=NAME), or cancel that job",
                where=str(path),
            )
        if on_wait is not None and told != holder.token:
            on_wait(holder)
            told = holder.token
        time.sleep(
            min(POLL_S, max(0.0, deadline - time.monotonic()))
        )  # polling another job's lock, bounded


def adopt(cache_dir: Path, token: str) -> CacheLock | None:
    """The lock a launcher handed to this process (by token); None if it is not there any more."""
    current = read(cache_dir)
    if current is None or current[0].token != token:
        return None
    return CacheLock(cache_dir, current[0])


def for_worker(
    cache_dir: Path,
    *,
    job: str,
    launcher_token: str | None,
    wait_s: float,
    on_wait: Callable[[Holder], None] | None = None,
) -> CacheLock | None:
    """Rank 0 of a compile job: None when its launcher holds the lock for it (the local
    supervisor passes its token), else the lock, taken here (Kubernetes, a trainer by hand)."""
    current = read(cache_dir)
    if launcher_token and current is not None and current[0].token == launcher_token:
        return None
    held = acquire(
        cache_dir, job=job, purpose="train", wait_s=wait_s, on_wait=on_wait, reclaim_own_job=True
    )
    held.start_heartbeat()
    return held
