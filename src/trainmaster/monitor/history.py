"""How a run went, from what it left in its folder: metrics, timing, price basis.

Shared by `report`, `status`'s progress line and `tensorboard`. A run folder is found by name
under STORAGE/runs/; a kubernetes job's folder (on the cluster's shared storage, reached here
through --storage pointing at a copy or a mount of it) has no state.json, so metrics.jsonl or
job.toml are enough to recognise one.

Times per trainer process (metrics.jsonl's elapsed_s restarts with each) are run/segments.py's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from trainmaster import catalog
from trainmaster.config import JobConfig, jobfile
from trainmaster.errors import UserError
from trainmaster.monitor import runinfo
from trainmaster.run import segments, state
from trainmaster.storage import RunPaths, Storage


def find_run(store: Storage, job: str) -> RunPaths:
    """The run folder of JOB; UserError naming the known jobs when there is none."""
    run = RunPaths(store.run_dir(job))
    if run.state.exists() or run.metrics.exists() or run.job_toml.exists():
        return run
    known = runinfo.run_folders(store)
    raise UserError(
        f"no job {job!r} under {store.runs} (jobs: {', '.join(known) or 'none'}); "
        "check --storage or `trainmaster list`",
        where="JOB",
    )


def metrics_or_fail(run: RunPaths, job: str) -> list[dict[str, Any]]:
    rows = [r for r in runinfo.read_metrics(run.metrics) if isinstance(r, dict) and "step" in r]
    if not rows:
        raise UserError(
            f"job {job} has no metrics yet ({run.metrics.name} has no step): it has "
            f"not finished its first step; see `trainmaster status {job}`",
            where="JOB",
        )
    return rows


def wall_s(
    st: state.RunState | None,
    rows: list[dict[str, Any]],
    now: float | None = None,
    resumed: Iterable[int] = (),
) -> float:
    """Wall time of the run: launch to end (or now) when state.json says, else from metrics
    (each trainer process's time, `resumed` telling where one began: segments.py)."""
    if st is not None and st.started_at is not None:
        end = st.finished_at or (now if now is not None else time.time())
        return max(0.0, end - st.started_at)
    return segments.trained_s(rows, resumed)


def read_state(run: RunPaths) -> state.RunState | None:
    if not run.state.exists():
        return None
    try:
        return state.observed(run.state)
    except (OSError, ValueError):
        return None


def read_config(run: RunPaths) -> JobConfig | None:
    with contextlib.suppress(UserError):
        return jobfile.load(run.job_toml)
    return None


@dataclass(frozen=True)
class Price:
    """What one node-hour of the job costs, and where the figure comes from."""

    per_node_hour: float
    nodes: int
    instance: str
    source: str  # "catalog" | "cluster.price_per_hour"
    device: str = ""  # the accelerator rank 0 ran on, by name ("NVIDIA H200"), when it says

    @property
    def per_hour(self) -> float:
        return self.per_node_hour * self.nodes

    def cost(self, seconds: float) -> float:
        return self.per_hour * seconds / 3600.0

    def basis(self) -> str:
        on = f" with {self.device}" if self.device else ""
        return (
            f"{self.nodes} x {self.instance}{on} at ${self.per_node_hour:.2f}/node-hour "
            f"({self.source})"
        )


def price_of(cfg: JobConfig | None, nodes: int | None = None, device: str = "") -> Price | None:
    """Price per node-hour: [cluster] price_per_hour, else the catalog's for the job's node type.
    A local job runs on the generic CPU host, unless rank 0 ran on a GPU the catalog knows
    (device, by the driver's name): then its GPUs' share of that GPU's AWS instance type, e.g.
    1/8 of a p5e.48xlarge for one H200, so a local GPU run costs what the same GPUs would on
    AWS. None without a readable job file."""
    if cfg is None:
        return None
    inst: catalog.InstanceType = cfg.derived.instance
    n = nodes or cfg.job.nnodes
    if cfg.cluster.price_per_hour is not None:
        return Price(cfg.cluster.price_per_hour, n, inst.name, "cluster.price_per_hour", device)
    gpu = catalog.instance_for_device(device) if inst.accelerator == "cpu" and device else None
    if gpu is not None:
        used = min(cfg.job.nproc_per_node, gpu.devices)
        share = gpu.price_per_hour * used / gpu.devices
        return Price(
            share, n, f"{used}/{gpu.devices} of {gpu.name}", "catalog, by its GPUs", device
        )
    return Price(inst.price_per_hour, n, inst.name, "catalog", device)


def device_of(run: RunPaths) -> str:
    """The accelerator rank 0 ran on, from rank0.json ("" when it has none or does not say)."""
    rank0 = runinfo.read_json(run.rank0) or {}
    device = rank0.get("device")
    return device if isinstance(device, str) else ""
