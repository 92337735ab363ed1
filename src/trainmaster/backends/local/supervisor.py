"""The supervisor of one local run: `python -m trainmaster.backends.local.supervisor RUN_DIR`.

Started detached by `launch`, it starts the private etcd (if any) and one torchrun agent per
node, each in its own process group, waits for them, records exit codes and the final phase
in state.json, and stops etcd. SIGTERM (from `cancel`) is passed on to every agent's group;
a cancel recorded while it is still starting (no group to signal yet) is honoured at every
step of the start-up. If the supervisor itself is killed, the agents finish the run on their
own and whoever next reads the state (state.observed) records the end and stops the etcd.

A lost node is not a failed job (the local twin of Volcano's RestartJob): when a node's agent
dies by a signal (the instance died) or exits on a rendezvous or store error (the c10d store
lived in a lost agent: its peers cannot go on), the supervisor stops the other nodes and starts
the whole gang again under a new rendezvous id (and, for c10d on a free port, a new port), up
to job.max_retries times; the workers resume from the last checkpoint. An elastic job goes on
with the nodes it has instead (torchrun re-forms the group) and the supervisor starts the lost
node's agent again, which rejoins at the next rendezvous round (rejoin.py), unless the c10d
store went with the lost node: then it is a job retry as above.

A worker that dies at exit after the run completed (torch 2.13 at times aborts a gloo worker
so) leaves its agent waiting in a restart rendezvous for nodes that have finished: the
supervisor stops the agents and counts the job as succeeded, with a warning (completion.py).

Shaped like torch's elastic agent (torch/distributed/elastic/agent/server/api.py,
SimpleElasticAgent._invoke_run): set up once (etcd, network, the agents' environment), then a
short loop over attempts, each a Gang (gang.py: start, wait -> outcome, stop), and at the end
ending.py's verdict, a pure function of what was seen, written to state.json.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainmaster.backends.local import completion, netns, rejoin, rendezvous
from trainmaster.backends.local.agents import agent_commands, rdzv_id
from trainmaster.backends.local.ending import ending
from trainmaster.backends.local.gang import Cancel, Gang, signal_groups
from trainmaster.compile import cache, lock
from trainmaster.config import JobConfig, jobfile
from trainmaster.launch.torchrun import AGENT_ENV, Rendezvous
from trainmaster.monitor import exporter
from trainmaster.run import goodput, state
from trainmaster.run import metrics as runlog
from trainmaster.run.goodput import JOB_RETRIES_ENV
from trainmaster.storage import RunPaths, Storage


def _last_step(run: RunPaths) -> int | None:
    rows = [r for r in runlog.read_jsonl(run.metrics) if isinstance(r.get("step"), int)]
    return int(rows[-1]["step"]) if rows else None


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
    except Exception:  # still running after 30 s, or already gone: kill it
        with contextlib.suppress(Exception):
            etcd.kill()
            etcd.wait(timeout=5)


def _fresh(cfg: JobConfig, rdzv: Rendezvous) -> Rendezvous:
    """The rendezvous of a job retry: a new id (the old one may be closed or half-joined) and,
    for c10d on a port we chose, a new free port (the old one may linger in TIME_WAIT or still
    be held by a dying agent)."""
    endpoint = rdzv.endpoint
    if cfg.job.network == "netns":  # node 0's address; the next port (the old may linger)
        host, _, port = endpoint.rpartition(":")
        endpoint = f"{host}:{int(port) + 1}"
    elif rdzv.backend == "c10d" and cfg.rendezvous.endpoint is None:
        endpoint = f"{rendezvous.LOOPBACK}:{rendezvous.free_port()}"
    return Rendezvous(rdzv.backend, endpoint, run_id=rdzv_id(cfg.job.name))


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


def agent_env(cfg: JobConfig, storage: Path) -> dict[str, str]:
    """What every node's agent runs with (the attempt adds JOB_RETRIES_ENV)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **AGENT_ENV}
    # All nodes share this machine's cores: without a limit every worker starts one thread
    # per core and they fight (torchrun only sets this when nproc_per_node > 1).
    workers = cfg.job.nnodes * cfg.job.nproc_per_node
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    if cfg.train.compile:
        env |= cache_env(cfg, storage)
    return env


def _started(run: RunPaths, st: state.RunState, gang: Gang, rdzv: Rendezvous, launched: float,
             cancel: Cancel) -> None:  # fmt: skip
    """Record the attempt's agents. Read under the same lock as the write: a cancel recorded
    before it saw no agents to signal, so they are signalled here; a later one finds them in
    state.json."""
    nodes = [
        n.model_copy(update={"pid": a.pid, "start_time": state.start_time(a.pid),
                             "exit_code": None})
        for n, a in zip(st.nodes, gang.agents, strict=True)
    ]  # fmt: skip
    rdzv_now = st.rendezvous | {"endpoint": rdzv.endpoint, "run_id": rdzv.run_id or ""}
    now = state.update(run.state, phase="running", started_at=launched, nodes=nodes,
                       rendezvous=rdzv_now)  # fmt: skip
    if now.cancel_requested:
        cancel.requested = True
        signal_groups([a.pid for a in gang.agents], signal.SIGTERM)


def supervise(run_dir: Path) -> int:
    run = RunPaths(run_dir)
    st = state.read(run.state)
    cfg = jobfile.load(run.job_toml)
    etcd: subprocess.Popen[bytes] | None = None
    # A fresh --rdzv-id per launch (backends/local/agents.py); state files of older versions have none.
    rdzv = Rendezvous(
        st.rendezvous["backend"],
        st.rendezvous["endpoint"],
        run_id=st.rendezvous.get("run_id") or None,
    )
    agents: list[subprocess.Popen[bytes]] = []  # the attempt's, for the SIGTERM handler
    net: netns.Network | None = None
    cancel = Cancel()

    def on_term(signum: int, _frame: object) -> None:
        cancel.requested = True
        state.update(run.state, cancel_requested=True)
        signal_groups([a.pid for a in agents], signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    storage = Path(st.storage)
    held = _hold_cache_lock(cfg, storage)
    elastic = bool(cfg.job.min_nnodes and cfg.job.min_nnodes < cfg.job.nnodes)
    codes: list[int] = []
    end: completion.EndWatch | None = None
    # /metrics for Prometheus while the job lives, on a free port named in the run folder
    metrics = exporter.serve_in_background(run, st.job, lambda: state.observed(run.state).phase)
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
        env = agent_env(cfg, storage)
        # The launching shell's folder: a custom entrypoint runs from there (like TorchX local_cwd).
        workdir = st.workdir or os.getcwd()
        if cfg.job.network == "netns":
            net = netns.plan(run.dir, cfg.job.nnodes)
            netns.up(net)
            env["GLOO_SOCKET_IFNAME"] = netns.IFNAME  # not the host name's address
        # One launch time for state.json and the trainers' goodput (summary.json), so that
        # summary and `report` measure startup from the same instant.
        launched = time.time()
        env[goodput.LAUNCHED_AT_ENV] = repr(launched)
        retries = rejoins_used = 0
        while True:
            env[JOB_RETRIES_ENV] = str(retries)
            commands = agent_commands(cfg, rdzv, run, storage, workdir)
            gang = Gang(run, commands, dict(env), workdir, held, agents)
            gang.start(watch.check)
            _started(run, st, gang, rdzv, launched, cancel)
            rejoins = None
            if elastic:
                last = functools.partial(_last_step, run)
                rejoins = rejoin.Rejoins(
                    run.state, cfg.job.max_retries, gang.start_node, last, rejoins_used
                )
            store_lost = functools.partial(rejoin.store_lost, cfg, rdzv)
            builtin = cfg.job.builtin
            end = completion.EndWatch(run, builtin, gang.offsets, launched, cfg.job.nproc_per_node)
            codes, lost = gang.wait(cancel, rejoins, store_lost, end)
            rejoins_used = rejoins.used if rejoins is not None else 0
            if lost is None:
                break
            node, why = lost
            step = _last_step(run)
            at = f" at step {step}" if step is not None else ""
            if retries >= cfg.job.max_retries:
                codes = gang.stop()
                state.update(run.state, message=f"node {node} lost{at} ({why}); no job retry left "
                             f"({retries}/{cfg.job.max_retries} used, job.max_retries)")  # fmt: skip
                break
            retries += 1
            note = f"node {node} lost{at} ({why}); job retry {retries}/{cfg.job.max_retries}"
            print(f"trainmaster supervisor: {note}", flush=True)
            gang.stop()
            goodput.record(run.timeline, "job_retry", t=time.time(), node=node, step=step, why=why)
            state.update(run.state, job_retries=retries, message=note)
            watch.check()
            rdzv = _fresh(cfg, rdzv)
    except Cancelled:
        signal_groups([a.pid for a in agents], signal.SIGTERM)
        codes = [a.wait() for a in agents]
    except Exception as exc:  # record why, then let the traceback reach supervisor.log
        signal_groups([a.pid for a in agents], signal.SIGKILL)
        state.update(run.state, phase="failed", finished_at=time.time(), message=str(exc))
        raise
    finally:
        metrics.stop()
        _stop(etcd)
        if net is not None:
            netns.down(net)
        if held is not None:
            with contextlib.suppress(Exception):
                held.release()
    final = state.read(run.state)
    verdict = ending(
        final,
        codes,
        elastic=elastic,
        stuck=end.stuck if end is not None else [],
        barrier=end.barrier if end is not None else [],
        attempt_summary=state.summary_of_attempt(run.state, final),
        first_error=functools.partial(first_error, run),
    )
    extra = {"message": verdict.message} if verdict.message is not None else {}
    state.update(run.state, phase=verdict.phase, nodes=verdict.nodes, finished_at=time.time(),
                 **extra)  # fmt: skip
    return 0 if verdict.phase == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1])))
