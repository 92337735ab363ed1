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
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from trainmaster import jobfile
from trainmaster.backends.local import completion, netns, rejoin, rendezvous
from trainmaster.backends.local.agents import agent_commands, rdzv_id
from trainmaster.compile import cache, lock
from trainmaster.config import JobConfig
from trainmaster.launch import entry
from trainmaster.launch.torchrun import AGENT_ENV, Rendezvous
from trainmaster.run import goodput, processes, state
from trainmaster.run import metrics as runlog
from trainmaster.run.goodput import JOB_RETRIES_ENV
from trainmaster.storage import RunPaths, Storage

# What a torchrun agent's log says when the rendezvous or its store is gone with a lost node
# (torch/distributed/elastic/rendezvous/api.py and c10d's error types).
STORE_LOST = ("RendezvousConnectionError", "RendezvousClosedError", "DistStoreError",
              "DistNetworkError")  # fmt: skip
POLL_S = 0.2


def lost_reason(log: Path, offset: int, code: int | None) -> str | None:
    """Why an ended agent counts as a lost node (None: it finished, or its workers failed)."""
    if code is None or code == 0:
        return None
    if code < 0:
        return signal.Signals(-code).name
    try:
        with log.open("rb") as f:
            f.seek(offset)
            tail = f.read()[-(256 << 10) :].decode("utf-8", "replace")
    except OSError:
        return None
    found = [m for m in STORE_LOST if m in tail]
    return f"rendezvous lost: {found[0]}" if found else None


def _last_step(run: RunPaths) -> int | None:
    rows = [r for r in runlog.read_jsonl(run.metrics) if isinstance(r.get("step"), int)]
    return int(rows[-1]["step"]) if rows else None


def _signal_groups(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)


def _final_phase(
    run: RunPaths, st: state.RunState, codes: list[int], elastic: bool, done: bool = False
) -> str:
    if st.cancel_requested:
        return "cancelled"
    if done or all(c == 0 for c in codes):  # done: the work finished (completion.py)
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


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


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


def _stop_nodes(agents: list[subprocess.Popen[bytes]], st: state.RunState, grace_s: float) -> None:
    """Stop what is left of a gang that lost a node: its workers at once (their collectives
    wait on a dead peer; the last checkpoint is complete on disk), then the agents."""
    for w in processes.workers(st):
        with contextlib.suppress(ProcessLookupError):
            os.kill(w.pid, signal.SIGKILL)
    _signal_groups([a.pid for a in agents if a.poll() is None], signal.SIGTERM)
    end = time.monotonic() + grace_s
    while any(a.poll() is None for a in agents) and time.monotonic() < end:
        time.sleep(POLL_S)  # waiting for processes to exit after a signal (bounded)
    _signal_groups([a.pid for a in agents if a.poll() is None], signal.SIGKILL)
    for a in agents:
        a.wait()


def _end_stuck(
    agents: list[subprocess.Popen[bytes]], run: RunPaths, stuck: list[completion.Stuck]
) -> list[int]:
    """Stop the agents that wait for a round that will not come (and those in their exit
    barrier, which waits for them), saying why: the run's work is done."""
    for s in stuck:
        print(f"trainmaster supervisor: {s.warning()}", flush=True)
        goodput.record(run.timeline, "worker_died_at_exit", t=time.time(), node=s.node, why=s.why)
    # An agent in the exit barrier sits in a C++ store wait that its SIGTERM handler cannot
    # interrupt: only the SIGKILL after the grace ends it, and nothing of it is lost (its
    # workers finished). A short grace, then.
    _stop_nodes(agents, state.read(run.state), grace_s=1.0)
    return [a.wait() for a in agents]


def _wait(
    agents: list[subprocess.Popen[bytes]], run: RunPaths, offsets: list[int],
    cancelled: list[bool], rejoins: rejoin.Rejoins | None, store_lost: Callable[[int], bool],
    end: completion.EndWatch,
) -> tuple[list[int], tuple[int, str] | None]:  # fmt: skip
    """Wait for every agent, or for the first lost node that ends this attempt: (exit codes so
    far, (node, why) or None). An elastic job (rejoins) loses a node by a signal and goes on,
    taking the node back (rejoin.py), unless the c10d store went with it. A run whose work is
    done while agents still wait (end.stuck) is ended here: they are stopped."""
    left_out: set[int] = set()  # lost nodes not taken back (no rejoin left): seen once
    while True:
        codes = [a.poll() for a in agents]
        waiting = set(rejoins.waiting) if rejoins is not None else set()
        if not cancelled[0] and end.check(codes, left_out | waiting):
            return _end_stuck(agents, run, end.stuck), None
        for i, code in enumerate(codes):
            if i in left_out:
                continue
            if rejoins is not None and i in rejoins.waiting and code is not None:
                rejoins.ended(i, code)
                left_out.add(i)
                continue
            why = None if cancelled[0] else lost_reason(run.logs / f"node{i}.log", offsets[i], code)
            if why is None:
                continue
            # `cancel` records itself, then signals the agents (and etcd) one by one, not this
            # process: an agent that ends now, killed or failing to reach a rendezvous whose
            # store went first, is cancelled, not lost: neither retried nor taken back.
            if state.read(run.state).cancel_requested:
                cancelled[0] = True
                continue
            if rejoins is None or code is None or code > 0 or store_lost(i):
                return [c if c is not None else -1 for c in codes], (i, why)
            rejoins.lost(i, why, agents)
            if agents[i].poll() is not None:
                left_out.add(i)
        if rejoins is not None:
            rejoins.poll()
        codes = [a.poll() for a in agents]
        if all(c is not None for c in codes):
            return [int(c) for c in codes if c is not None], None
        time.sleep(POLL_S)  # polling child processes of their own sessions


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
    net: netns.Network | None = None

    cancelled = [False]  # set by the handler: agents ending now are cancelled, not lost

    def on_term(signum: int, _frame: object) -> None:
        cancelled[0] = True
        state.update(run.state, cancel_requested=True)
        _signal_groups([a.pid for a in agents], signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    storage = Path(st.storage)
    held = _hold_cache_lock(cfg, storage)
    codes: list[int] = []
    end: completion.EndWatch | None = None
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
        if cfg.job.network == "netns":
            net = netns.plan(run.dir, cfg.job.nnodes)
            netns.up(net)
            env["GLOO_SOCKET_IFNAME"] = netns.IFNAME  # not the host name's address
        launched = time.time()
        env[goodput.LAUNCHED_AT_ENV] = repr(launched)
        elastic = bool(cfg.job.min_nnodes and cfg.job.min_nnodes < cfg.job.nnodes)
        retries = rejoins_used = 0
        while True:
            env[JOB_RETRIES_ENV] = str(retries)
            offsets = [_size(run.logs / f"node{i}.log") for i in range(cfg.job.nnodes)]
            agents[:] = []
            commands = agent_commands(cfg, rdzv, run, storage, workdir)

            def start(
                i: int, commands: list[list[str]] = commands, offsets: list[int] = offsets
            ) -> subprocess.Popen[bytes]:
                offsets[i] = _size(run.logs / f"node{i}.log")
                with (run.logs / f"node{i}.log").open("ab") as log:
                    agent = subprocess.Popen(
                        commands[i],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=workdir,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                        env={**env, entry.ENV_NODE_INDEX: str(i)},
                    )
                if held is not None:  # a killed supervisor must not free the cache its workers use
                    held.also_held_by([a.pid for a in agents] + [agent.pid])
                return agent

            for i in range(cfg.job.nnodes):
                watch.check()
                agents.append(start(i))
            nodes = [
                n.model_copy(update={"pid": a.pid, "start_time": state.start_time(a.pid),
                                     "exit_code": None})
                for n, a in zip(st.nodes, agents, strict=True)
            ]  # fmt: skip
            rdzv_now = st.rendezvous | {"endpoint": rdzv.endpoint, "run_id": rdzv.run_id or ""}
            now = state.update(run.state, phase="running", started_at=launched, nodes=nodes,
                               rendezvous=rdzv_now)  # fmt: skip
            # Read under the same lock as the write: a cancel recorded before it saw no agents to
            # signal, so they are signalled here; a cancel after it finds them in state.json.
            if now.cancel_requested:
                cancelled[0] = True
                _signal_groups([a.pid for a in agents], signal.SIGTERM)
            rejoins = None
            if elastic:
                last = functools.partial(_last_step, run)
                rejoins = rejoin.Rejoins(run.state, cfg.job.max_retries, start, last, rejoins_used)
            store_lost = functools.partial(rejoin.store_lost, cfg, rdzv)
            end = completion.EndWatch(
                run, entry.is_builtin(cfg), offsets, launched, cfg.job.nproc_per_node
            )
            codes, lost = _wait(agents, run, offsets, cancelled, rejoins, store_lost, end)
            rejoins_used = rejoins.used if rejoins is not None else 0
            if lost is None:
                break
            node, why = lost
            step = _last_step(run)
            at = f" at step {step}" if step is not None else ""
            if retries >= cfg.job.max_retries:
                _stop_nodes(agents, state.read(run.state), grace_s=10.0)
                codes = [a.wait() for a in agents]
                state.update(run.state, message=f"node {node} lost{at} ({why}); no job retry left "
                             f"({retries}/{cfg.job.max_retries} used, job.max_retries)")  # fmt: skip
                break
            retries += 1
            note = f"node {node} lost{at} ({why}); job retry {retries}/{cfg.job.max_retries}"
            print(f"trainmaster supervisor: {note}", flush=True)
            _stop_nodes(agents, state.read(run.state), grace_s=10.0)
            goodput.record(run.timeline, "job_retry", t=time.time(), node=node, step=step, why=why)
            state.update(run.state, job_retries=retries, message=note)
            watch.check()
            rdzv = _fresh(cfg, rdzv)
    except Cancelled:
        _signal_groups([a.pid for a in agents], signal.SIGTERM)
        codes = [a.wait() for a in agents]
    except Exception as exc:  # record why, then let the traceback reach supervisor.log
        _signal_groups([a.pid for a in agents], signal.SIGKILL)
        state.update(run.state, phase="failed", finished_at=time.time(), message=str(exc))
        raise
    finally:
        _stop(etcd)
        if net is not None:
            netns.down(net)
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
    stuck = end.stuck if end is not None else []
    for s in stuck:
        nodes[s.node] = nodes[s.node].model_copy(update={"note": s.note})
    for i in end.barrier if end is not None and stuck else []:  # their agents were stopped
        nodes[i] = nodes[i].model_copy(update={"note": completion.BARRIER_NOTE})
    phase = _final_phase(run, final, codes, elastic, done=bool(stuck))
    extra: dict[str, str] = {}
    if phase == "succeeded" and stuck:
        retried = f"; completed after {final.job_retries} job retry(s)" if final.job_retries else ""
        extra = {"message": "; ".join(s.warning() for s in stuck) + retried}
    elif phase == "failed":
        extra = {"message": first_error(run) or final.message}
    elif phase == "succeeded" and final.job_retries:  # keep the lost node's story in status
        extra = {"message": f"{final.message}; completed after {final.job_retries} job retry(s)"}
    elif phase == "succeeded" and any(n.note for n in nodes):  # an elastic job's lost nodes
        story = "; ".join(f"node {n.index} {n.note}" for n in nodes if n.note)
        on = sum(1 for c in codes if c == 0)
        extra = {"message": f"{story}; completed on {on} of {len(nodes)} nodes"}
    state.update(run.state, phase=phase, nodes=nodes, finished_at=time.time(), **extra)
    return 0 if phase == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1])))
