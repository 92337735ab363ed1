"""The supervisor of one local run: `python -m trainmaster.backends.local.supervisor RUN_DIR`.

Started detached by `launch`, it starts the private etcd (if any) and one torchrun agent per
node, each in its own process group, waits for them, records exit codes and the final phase
in state.json, and stops etcd. SIGTERM (from `cancel`) is passed on to every agent's group;
a cancel recorded while it is still starting (no group to signal yet) is honoured at every
step of the start-up. If the supervisor itself is killed, the agents finish the run on their
own and whoever next reads the state (state.observed) records the end and stops the etcd.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainmaster import jobfile
from trainmaster.backends.local import rendezvous
from trainmaster.backends.local.launcher import agent_commands
from trainmaster.compile import cache, lock
from trainmaster.config import JobConfig
from trainmaster.launch.torchrun import AGENT_ENV, Rendezvous
from trainmaster.run import goodput, state
from trainmaster.storage import RunPaths, Storage


def _signal_groups(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)


def _final_phase(run: RunPaths, st: state.RunState, codes: list[int], elastic: bool) -> str:
    if st.cancel_requested:
        return "cancelled"
    if all(c == 0 for c in codes):
        return "succeeded"
    # An elastic job may lose a node and still finish: the survivors' agents exit 0. Only a
    # summary this attempt wrote counts; one left by an earlier launch of the job does not.
    if elastic and any(c == 0 for c in codes) and state.summary_of_attempt(run.state, st):
        return "succeeded"
    return "failed"


def first_error(run: RunPaths) -> str | None:
    """The `error: ...` line a worker wrote last (bad input, a failed node preflight), of the
    lowest rank that wrote one: the one line `status` shows for a failed job. The newest, since
    rank logs append across restarts and launches of the job."""
    logs = sorted(
        run.logs.glob("rank*.log"), key=lambda p: int(p.stem[4:]) if p.stem[4:].isdigit() else 0
    )
    for log in logs:
        with log.open(encoding="utf-8", errors="replace") as f:
            errors = [line for line in f if line.startswith("error: ")]
        if errors:
            return errors[-1].removeprefix("error: ").strip()
    return None


class Cancelled(Exception):
    """`cancel` asked for the end while the supervisor was still starting the run."""


class CancelWatch:
    """Raises Cancelled once state.json records a cancel. The file is parsed again only when it
    was replaced since the last look (every write is an atomic replace: a new inode): one parse
    per started node of a file that grows with the node count made starting n agents O(n^2),
    ~30 s at 1,024 nodes (measured in the scale work, docs/architecture.md 5: 15)."""

    def __init__(self, run: RunPaths) -> None:
        self.path, self.seen = run.state, (-1, -1, -1)
        self.reads = 0

    def check(self) -> None:
        st = os.stat(self.path)
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self.seen:
            return
        self.seen, self.reads = stamp, self.reads + 1
        if state.read(self.path).cancel_requested:
            raise Cancelled


def _stop(etcd: subprocess.Popen[bytes] | None) -> None:
    """Stop the private etcd; a cleanup that fails must not lose the run's final phase."""
    if etcd is None:
        return
    try:
        etcd.terminate()
        etcd.wait(timeout=30)
    except Exception:  # noqa: BLE001 - still running after 30 s, or already gone: kill it
        with contextlib.suppress(Exception):
            etcd.kill()
            etcd.wait(timeout=5)


def cache_env(cfg: JobConfig, storage: Path) -> dict[str, str]:
    """A compile job's cache settings (compile/cache.py), the same on every node."""
    folder = Storage(storage).cache_dir(cfg.train.cacheset)
    kind = cache.mechanism(cfg)
    for sub in cache.dirs_to_make(kind, folder):
        sub.mkdir(parents=True, exist_ok=True)
    # TMPDIR is the trainer's to set (it does): torchrun's own temporary folders stay in /tmp.
    settings = {k: v for k, v in cache.env(kind, folder).items() if k != "TMPDIR"}
    return {**settings, cache.CACHE_ENV: str(folder)}


def _hold_cache_lock(cfg: JobConfig, storage: Path) -> lock.CacheLock | None:
    """The cacheset lock that `launch` took and handed over: held (heartbeat) until the end."""
    token = os.environ.get(cache.LOCK_ENV)
    if not cfg.train.compile or not token:
        return None
    held = lock.adopt(Storage(storage).cache_dir(cfg.train.cacheset), token)
    if held is not None:
        held.start_heartbeat()
    return held


def supervise(run_dir: Path) -> int:
    run = RunPaths(run_dir)
    st = state.read(run.state)
    cfg = jobfile.load(run.job_toml)
    etcd: subprocess.Popen[bytes] | None = None
    # A fresh --rdzv-id per launch (backends/local/launcher.py); state files of older versions have none.
    rdzv = Rendezvous(
        st.rendezvous["backend"],
        st.rendezvous["endpoint"],
        run_id=st.rendezvous.get("run_id") or None,
    )
    agents: list[subprocess.Popen[bytes]] = []

    def on_term(signum: int, _frame: object) -> None:
        state.update(run.state, cancel_requested=True)
        _signal_groups([a.pid for a in agents], signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    storage = Path(st.storage)
    held = _hold_cache_lock(cfg, storage)
    codes: list[int] = []
    try:
        # `cancel` of a pending run finds no process group to signal: it only records the
        # request, so every step of the start-up looks for it before starting anything more.
        watch = CancelWatch(run)
        watch.check()
        if st.private_etcd:
            etcd, endpoint = rendezvous.start_private_etcd(
                run.dir / "etcd", run.logs / "etcd.log", timeout_s=30.0
            )
            rdzv = Rendezvous(rdzv.backend, endpoint, run_id=rdzv.run_id)
            state.update(
                run.state,
                etcd_pid=etcd.pid,
                etcd_start=state.start_time(etcd.pid),
                rendezvous=st.rendezvous | {"endpoint": endpoint},
            )
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **AGENT_ENV}
        # All nodes share this machine's cores: without a limit every worker starts one thread
        # per core and they fight (torchrun only sets this when nproc_per_node > 1).
        workers = cfg.job.nnodes * cfg.job.nproc_per_node
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
        if cfg.train.compile:
            env |= cache_env(cfg, storage)
        # The launching shell's folder: a custom entrypoint runs from there (like TorchX local_cwd).
        workdir = st.workdir or os.getcwd()
        # One launch time for state.json and the trainers' goodput (summary.json), so that
        # summary and `report` measure startup from the same instant.
        launched = time.time()
        env[goodput.LAUNCHED_AT_ENV] = repr(launched)
        for i, cmd in enumerate(agent_commands(cfg, rdzv, run, storage, workdir)):
            watch.check()
            with (run.logs / f"node{i}.log").open("ab") as log:
                agents.append(
                    subprocess.Popen(
                        cmd,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=workdir,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                        env={**env, "TRAINMASTER_NODE_INDEX": str(i)},
                    )
                )
        if held is not None:  # a killed supervisor must not free the cache its workers use
            held.also_held_by([a.pid for a in agents])
        nodes = [
            n.model_copy(update={"pid": a.pid, "start_time": state.start_time(a.pid)})
            for n, a in zip(st.nodes, agents, strict=True)
        ]
        now = state.update(run.state, phase="running", started_at=launched, nodes=nodes)
        # Read under the same lock as the write: a cancel recorded before it saw no agents to
        # signal, so they are signalled here; a cancel after it finds them in state.json.
        if now.cancel_requested:
            _signal_groups([a.pid for a in agents], signal.SIGTERM)
        codes = [a.wait() for a in agents]
    except Cancelled:
        _signal_groups([a.pid for a in agents], signal.SIGTERM)
        codes = [a.wait() for a in agents]
    except Exception as exc:  # record why, then let the traceback reach supervisor.log
        _signal_groups([a.pid for a in agents], signal.SIGKILL)
        state.update(run.state, phase="failed", finished_at=time.time(), message=str(exc))
        raise
    finally:
        _stop(etcd)
        if held is not None:
            with contextlib.suppress(Exception):
                held.release()
    final = state.read(run.state)
    nodes = [
        n.model_copy(update={"exit_code": c}) for n, c in zip(final.nodes, codes, strict=False)
    ]
    if len(codes) < len(final.nodes):  # cancelled before every agent started
        nodes += final.nodes[len(codes) :]
    elastic = bool(cfg.job.min_nnodes and cfg.job.min_nnodes < cfg.job.nnodes)
    phase = _final_phase(run, final, codes, elastic)
    why = {"message": first_error(run) or final.message} if phase == "failed" else {}
    state.update(run.state, phase=phase, nodes=nodes, finished_at=time.time(), **why)
    return 0 if phase == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1])))
