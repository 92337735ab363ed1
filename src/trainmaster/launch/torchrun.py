"""The one torchrun command line that every backend runs (docs/architecture.md 1).

A pure function of the job config and of where the rendezvous is: the local backend runs it
once per node as a process group on this machine, the Kubernetes backend once per pod. Keeping
one builder means a job debugged locally is the job the cluster runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from trainmaster.config import JobConfig
from trainmaster.launch import agent, entry

# The trainer's entry point (python -m trainmaster.train); torchrun starts it on every worker.
TRAIN_MODULE = "trainmaster.train"

# What runs a node's agent: torchrun itself (the pods: users recognise it there) or, locally,
# the same torchrun through launch/agent.py (its imports without the garbage collector). Whatever
# finds an agent by its command line looks for either.
TORCHRUN_MODULE = agent.TORCHRUN
AGENT_MODULES = (TORCHRUN_MODULE, agent.MODULE)

# The environment of every torchrun agent, on every backend. Since torch 2.5 the c10d
# rendezvous shares one TCPStore, started once by the first rank-0 agent, with the workers of
# every restart, and keys are not scoped per attempt: after a worker dies, the restarted
# workers can read their peers' addresses from the previous attempt and fail, or wait forever
# in init_process_group (pytorch/pytorch#135712; seen here as a job that hung after a kill).
# Opting out gives each rendezvous round a fresh store hosted by the rank-0 worker.
AGENT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@dataclass(frozen=True)
class Rendezvous:
    """Where the agents meet: backend and host:port (resolved by the backend)."""

    backend: str  # c10d | etcd | etcd-v2
    endpoint: str
    # --rdzv-id: unique per submission and per job-level retry, equal on every node of one
    # attempt (docs/architecture.md 5: 12.1). None = the job name: only a local state.json written
    # before per-attempt ids has none.
    run_id: str | None = None


def nnodes_arg(cfg: JobConfig) -> str:
    """`N`, or `MIN:MAX` for an elastic job (the job goes on with fewer nodes)."""
    lo, hi = cfg.job.min_nnodes or cfg.job.nnodes, cfg.job.nnodes
    return str(hi) if lo == hi else f"{lo}:{hi}"


def torchrun_args(cfg: JobConfig, rdzv: Rendezvous) -> list[str]:
    """Arguments of `python -m torch.distributed.run`, without the program."""
    args = [
        f"--nnodes={nnodes_arg(cfg)}",
        f"--nproc-per-node={cfg.job.nproc_per_node}",
        f"--rdzv-backend={rdzv.backend}",
        f"--rdzv-endpoint={rdzv.endpoint}",
        f"--rdzv-id={rdzv.run_id or cfg.job.name}",
        f"--rdzv-conf={rdzv_conf(cfg)}",
        f"--max-restarts={cfg.job.max_restarts}",
        # Tee every worker's output (prefixed with its local rank) into the agent's stream:
        # the node log locally, the pod log on Kubernetes.
        "--tee=3",
        # Seconds between health checks of the workers; a dead worker is noticed this fast.
        "--monitor-interval=1",
    ]
    return args


def rdzv_conf(cfg: JobConfig) -> str:
    """--rdzv-conf: key=value pairs, built by name (torchrun parses them into RendezvousParameters)."""
    conf = {"join_timeout": cfg.rendezvous.timeout, "timeout": cfg.rendezvous.timeout}
    if cfg.rendezvous.backend == "c10d":
        # The agents' TCPStore client gives up after read_timeout (default 60 s: torch
        # distributed/elastic/rendezvous/c10d_rendezvous_backend.py _create_tcp_store;
        # pytorch#107021). On Kubernetes the other pods start as soon as pod 0's name resolves,
        # before pod 0 (still pulling its image, or waiting for a cacheset's lock) hosts the
        # store: give them as long as the rendezvous itself.
        conf["read_timeout"] = cfg.rendezvous.timeout
    if cfg.job.min_nnodes and cfg.job.min_nnodes != cfg.job.nnodes:
        # Wait a little for late nodes after the minimum has joined, so that a full start
        # does not begin with fewer nodes only because one pod was slower.
        conf["last_call_timeout"] = 5
    return ",".join(f"{k}={v}" for k, v in conf.items())


def program_args(
    cfg: JobConfig, *, job_file: str, storage: str, workdir: str | None = None
) -> list[str]:
    """The worker program: the built-in trainer (job.args appended), or a custom job.entrypoint
    through launch/entry.py's shim, which gives it the run folder's environment and files.
    workdir: where a custom script's relative path and modules are found (default: here)."""
    if cfg.job.builtin:
        return ["-m", TRAIN_MODULE, "--job", job_file, "--storage", storage, *cfg.job.args]
    return entry.program_args(
        cfg, job_file=job_file, storage=storage, workdir=workdir or os.getcwd()
    )


def command(
    cfg: JobConfig,
    rdzv: Rendezvous,
    *,
    job_file: str,
    storage: str,
    python: str = "python3",
    workdir: str | None = None,
    module: str = TORCHRUN_MODULE,
) -> list[str]:
    """The full command line of one node's agent; module: one of AGENT_MODULES, the same
    arguments either way (the local backend passes agent.MODULE)."""
    return [
        python,
        "-m",
        module,
        *torchrun_args(cfg, rdzv),
        *program_args(cfg, job_file=job_file, storage=storage, workdir=workdir),
    ]
