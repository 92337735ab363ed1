"""The local backend: N torchrun agents on this machine, one process group per node.

`launch` checks everything it can before starting anything (storage writable, job name free,
rendezvous usable, shards present), writes runs/JOB/job.toml and state.json, and starts a
detached supervisor (backends/local/supervisor.py, in a fork of the CLI: detach.py) that owns
the agents, records how they end, and outlives the launching shell.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainmaster import files
from trainmaster.backends.local import detach, netns, rendezvous
from trainmaster.backends.local.agents import agent_commands, rdzv_id
from trainmaster.compile import cache, lock
from trainmaster.compile import precompile as compile_precompile
from trainmaster.config import JobConfig, jobfile
from trainmaster.errors import UserError
from trainmaster.launch import entry
from trainmaster.launch.torchrun import Rendezvous
from trainmaster.run import checkpoints, state
from trainmaster.run import processes as procs
from trainmaster.storage import SHARD_GLOB, RunPaths, Storage, dataset_path


@dataclass(frozen=True)
class Plan:
    """What a local launch will start (printed by --dry-run)."""

    run: RunPaths
    rdzv: Rendezvous
    private_etcd: bool
    commands: list[list[str]]
    compile_note: str | None = None  # train.compile: "compile cache warm (CACHESET)" or cold
    lock_wait_s: float = 0.0  # how long start() waits for the cacheset's lock
    purpose: str = "train"  # train | precompile (precompile replaces the cache's fingerprint)


def _rendezvous(cfg: JobConfig, run: RunPaths) -> tuple[Rendezvous, bool]:
    r = cfg.rendezvous
    if cfg.job.network == "netns":
        netns.check()
        if r.backend != "c10d" or r.endpoint is not None:
            raise UserError(
                'job.network = "netns" runs the c10d store in node 0\'s namespace: use '
                'rendezvous.backend = "c10d" with no rendezvous.endpoint',
                where="rendezvous",
            )
        net = netns.plan(run.dir, cfg.job.nnodes)
        return Rendezvous("c10d", f"{net.address(0)}:{netns.C10D_PORT}"), False
    if r.backend == "c10d":
        if r.endpoint is None:
            return Rendezvous("c10d", f"{rendezvous.LOOPBACK}:{rendezvous.free_port()}"), False
        host, port = rendezvous.split_endpoint(r.endpoint, "rendezvous.endpoint")
        if rendezvous.port_in_use(host, port):
            raise UserError(
                f"port {port} on {host} is in use; free it or leave rendezvous.endpoint "
                "unset for a free port",
                where="rendezvous.endpoint",
            )
        return Rendezvous("c10d", r.endpoint), False
    if r.endpoint is None:
        rendezvous.etcd_binary()  # installed? (says how to install it when not)
        return Rendezvous(r.backend, "<private etcd>"), True
    rendezvous.split_endpoint(r.endpoint, "rendezvous.endpoint")
    rendezvous.check_etcd(r.endpoint, deadline_s=min(float(r.timeout), 30.0))
    return Rendezvous(r.backend, r.endpoint), False


def check_shards(cfg: JobConfig, store: Storage) -> None:
    folder = dataset_path(store, cfg.data.dataset)
    shards = sorted(folder.glob(SHARD_GLOB))
    world = cfg.derived.world_size
    if not shards:
        raise UserError(
            f"no {SHARD_GLOB} shards in {folder}; make them with "
            f"`trainmaster data prepare --builtin pydoc --storage {store.root}`",
            where="data.dataset",
        )
    if len(shards) < world:
        raise UserError(
            f"{len(shards)} shards in {folder} for {world} workers; every worker reads "
            f"its own shard: prepare at least {world} (data prepare --shards {world})",
            where="data.dataset",
        )


def plan(cfg: JobConfig, store: Storage, *, resume: bool = False, precompile: bool = False) -> Plan:
    """Every check that needs no side effect; raises UserError before anything starts.

    A compile job's cacheset must hold this job's graphs or none (compile/precompile.expect):
    a fingerprint of another job shape is refused here, naming the differing fields.
    """
    run = RunPaths(store.run_dir(cfg.job.name))
    if run.state.exists():
        current = state.observed(run.state)
        if current.phase in ("pending", "running"):
            raise UserError(
                f"job {cfg.job.name} is {current.phase}; see `trainmaster status "
                f"{cfg.job.name}` or cancel it first",
                where="job.name",
            )
        live = state.live_processes(current)
        if live:  # e.g. a cancelled run whose agents still exit: two copies would share the folder
            raise UserError(
                f"job {cfg.job.name} is {current.phase} but its processes "
                f"{', '.join(map(str, live))} are still running; wait for them to "
                f"exit or `trainmaster cancel {cfg.job.name}`",
                where="job.name",
            )
        if not resume:
            raise UserError(
                f"job {cfg.job.name} exists ({run.dir}, {current.phase}); pass --resume "
                "to continue it from its last checkpoint, or choose another job.name",
                where="job.name",
            )
    if cfg.job.builtin:  # a custom entrypoint reads what it likes (docs/architecture.md 3.8)
        check_shards(cfg, store)
        # Checkpoints of other settings: refused here, before any process starts (every worker
        # would refuse them too, each after its start-up). Not a precompile's: its run starts
        # afresh, its old folder removed first (local backend.py, runner.remove_previous).
        last = None if precompile else checkpoints.latest(run.checkpoints)
        if last is not None:
            checkpoints.check_owner(
                last,
                config_hash=cfg.derived.config_hash,
                job=cfg.job.name,
                folder=run.checkpoints,
                legacy=cfg.derived.legacy_config_hash,
            )
    entry.check_local(cfg, Path.cwd())
    note = None
    if cfg.train.compile and not precompile:
        note = compile_precompile.expect(cfg, store).message
    rdzv, private = _rendezvous(cfg, run)
    # The id is chosen here, so that --dry-run shows the command that start() runs.
    rdzv = dataclasses.replace(rdzv, run_id=rdzv_id(cfg.job.name))
    return Plan(
        run,
        rdzv,
        private,
        agent_commands(cfg, rdzv, run, store.root),
        compile_note=note,
        purpose="precompile" if precompile else "train",
    )


def _take_cache_lock(
    cfg: JobConfig, store: Storage, p: Plan, on_wait: Callable[[lock.Holder], None] | None
) -> lock.CacheLock | None:
    """One job at a time per cacheset: the lock, then (it may have changed while we waited)
    the fingerprint again."""
    if not cfg.train.compile:
        return None
    held = lock.acquire(
        store.cache_dir(cfg.train.cacheset),
        job=cfg.job.name,
        purpose=p.purpose,
        wait_s=p.lock_wait_s,
        on_wait=on_wait,
    )
    try:
        if p.purpose == "train":
            compile_precompile.expect(cfg, store)
    except BaseException:
        held.release()
        raise
    return held


def start(
    cfg: JobConfig, store: Storage, p: Plan, on_wait: Callable[[lock.Holder], None] | None = None
) -> state.RunState:
    """Write the run folder and start the supervisor; return the recorded state.

    A compile job first takes its cacheset's lock (waiting up to p.lock_wait_s) and hands it
    to the supervisor, which holds it until the job ends.
    """
    held = _take_cache_lock(cfg, store, p, on_wait)
    try:
        return _start(cfg, store, p, held)
    except BaseException:
        if held is not None:
            held.release()
        raise


def _start(cfg: JobConfig, store: Storage, p: Plan, held: lock.CacheLock | None) -> state.RunState:
    run = p.run
    run.dir.mkdir(parents=True, exist_ok=True)
    run.logs.mkdir(exist_ok=True)
    run.job_toml.write_text(jobfile.render(cfg, f"resolved job {cfg.job.name} (written by launch)"))
    st = state.RunState(
        job=cfg.job.name,
        backend="local",
        config_hash=cfg.derived.config_hash,
        nnodes=cfg.job.nnodes,
        nproc_per_node=cfg.job.nproc_per_node,
        rendezvous={
            "backend": p.rdzv.backend,
            "endpoint": p.rdzv.endpoint,
            "run_id": p.rdzv.run_id or rdzv_id(cfg.job.name),
        },
        storage=str(store.root.resolve()),
        private_etcd=p.private_etcd,
        workdir=str(Path.cwd()),
        nodes=[
            state.NodeState(index=i, log=str(run.logs / f"node{i}.log"))
            for i in range(cfg.job.nnodes)
        ],
    )
    files.write_atomic(run.state, st.model_dump_json(indent=2))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if held is not None:
        env[cache.LOCK_ENV] = held.holder.token
    with (run.logs / "supervisor.log").open("ab") as log:
        pid = detach.supervisor(run.dir, log, env)  # a fork of this CLI when it can
    if held is not None:
        held.hand_over(pid)
    return state.update(run.state, supervisor_pid=pid, supervisor_start=state.start_time(pid))


def cancel(run: RunPaths, grace_s: float = 10.0) -> state.RunState:
    """SIGTERM every node's process group, SIGKILL what is left after the grace period.

    The trainer checkpoints atomically, so whatever a signal interrupts, the last complete
    checkpoint stays loadable. A run that has ended is left as it is: its pids may belong to
    other processes by now, so only a pid whose recorded start time matches is ever signalled.
    """
    current = state.observed(run.state)
    if current.phase in state.FINAL:
        return current
    st = state.update(run.state, cancel_requested=True)
    groups = state.live_agents(st) + (
        [st.etcd_pid] if st.etcd_pid and state.pid_alive(st.etcd_pid, st.etcd_start) else []
    )
    workers = [w.pid for w in procs.workers(st)]  # own sessions: not in the agents' groups
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        live = [g for g in groups if state.pid_alive(g)]
        for pgid in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
        left = [w for w in workers if state.pid_alive(w)]
        if sig == signal.SIGKILL:  # the agents forward SIGTERM; whatever is left goes now
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        end = time.monotonic() + wait
        while any(state.pid_alive(p) for p in live + left) and time.monotonic() < end:
            time.sleep(0.1)  # waiting for processes to exit after a signal (bounded)
    # The supervisor records the end when it sees its agents exit; if it is gone, record it here.
    if not state.supervisor_alive(st):
        state.stop_etcd(st)
        return state.update(run.state, phase="cancelled", finished_at=time.time())
    end = time.monotonic() + 10.0
    while state.read(run.state).phase not in state.FINAL and time.monotonic() < end:
        time.sleep(0.1)
    return state.update(run.state, phase="cancelled", finished_at=time.time())
