"""What the supervisor starts on each node of a local run, and under which rendezvous id.

Both sides use it: the launcher (its plan shows the commands, and it draws the first launch's id)
and the supervisor (it starts the agents, and draws a new id for every job retry).
"""

from __future__ import annotations

import secrets
import sys
import time
from pathlib import Path

from trainmaster.backends.local import netns
from trainmaster.config import JobConfig
from trainmaster.launch import agent
from trainmaster.launch.torchrun import Rendezvous, command
from trainmaster.storage import RunPaths


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
