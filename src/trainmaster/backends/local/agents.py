"""What the supervisor starts on each node of a local run: the command, its environment, and
the rendezvous it joins.

Both sides use it: the launcher (its plan shows the commands, and it draws the first launch's id)
and the supervisor (it starts the agents with agent_env, and draws a new rendezvous for every
job retry: fresh).
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from pathlib import Path

from trainmaster.backends.local import netns, rendezvous
from trainmaster.compile import cache
from trainmaster.config import JobConfig
from trainmaster.launch import agent
from trainmaster.launch.torchrun import AGENT_ENV, Rendezvous, command
from trainmaster.storage import RunPaths, Storage


def agent_commands(
    cfg: JobConfig, rdzv: Rendezvous, run: RunPaths, storage: Path, workdir: str | None = None
) -> list[list[str]]:
    cmd = command(
        cfg,
        rdzv,
        job_file=str(run.job_toml.resolve()),
        storage=str(storage.resolve()),
        python=sys.executable,
        workdir=workdir or str(Path.cwd()),
        module=agent.MODULE,  # torchrun, its imports without the collector (launch/agent.py)
    )
    if cfg.job.network == "netns":  # each node in its own network namespace (netns.py)
        net = netns.plan(run.dir, cfg.job.nnodes)
        return [net.wrap(i, cmd) for i in range(cfg.job.nnodes)]
    return [cmd for _ in range(cfg.job.nnodes)]


def rdzv_id(job: str) -> str:
    """--rdzv-id of one launch: torch's etcd handler closes a rendezvous when its agents exit
    and keeps the closed key for 2 h (CONST_RUNID_SUBROOT_TTL = 7200 and EtcdRendezvousHandler
    .shutdown -> set_closed in torch/distributed/elastic/rendezvous/etcd_rendezvous.py), so a
    relaunch under the same id fails with RendezvousClosedError. Unique per launch, the same
    for every node of it (the supervisor hands this one value to every agent)."""
    return f"{job}-{time.strftime('%Y%m%d%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


def fresh(cfg: JobConfig, rdzv: Rendezvous) -> Rendezvous:
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
