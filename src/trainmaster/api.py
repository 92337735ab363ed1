"""The Python API that the CLI is a thin layer over; scripts can use it directly.

    from trainmaster import api
    cfg = api.load_job("job.toml", ["train.batch_size=8"])
    print(api.describe(cfg)["derived"]["grad_accum"])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainmaster import jobfile
from trainmaster.compile import lock
from trainmaster.config import JobConfig
from trainmaster.errors import UserError
from trainmaster.launch import local, state
from trainmaster.monitor import runinfo
from trainmaster.presets import JOB_PRESETS
from trainmaster.storage import Storage, dataset_path

__all__ = ["JOB_PRESETS", "cancel_job", "describe", "init_job", "job_status", "launch", "load_job",
           "plan_launch", "preset_job", "render_job", "start_launch"]


def load_job(path: str | Path, overrides: list[str] | None = None) -> JobConfig:
    """Read, override and validate a job file (ConfigError on any problem)."""
    return jobfile.load(path, overrides)


def preset_job(name: str, overrides: list[str] | None = None) -> JobConfig:
    return jobfile.preset(name, overrides)


def render_job(cfg: JobConfig, title: str) -> str:
    return jobfile.render(cfg, title)


def init_job(preset: str, overrides: list[str] | None = None) -> str:
    """The text of a commented job file for a preset (what `trainmaster init` writes)."""
    cfg = preset_job(preset, overrides)
    return render_job(cfg, f"trainmaster job file (preset {preset}); see README 'The job file'")


def describe(cfg: JobConfig, storage: str | None = None) -> dict[str, Any]:
    """Resolved values, derived values and the hash, as plain data (`config show --json`)."""
    d = cfg.derived
    root = Storage.at(storage, cfg.job.storage)
    inst = dataclasses.asdict(d.instance)
    return {
        "config": cfg.model_dump(mode="json"),
        "derived": {
            "world_size": d.world_size,
            "min_world_size": d.min_world_size,
            "grad_accum": d.grad_accum,
            "tokens_per_step": d.tokens_per_step,
            "model": {k: cfg.model.size(k) for k in
                      ("num_layers", "hidden_size", "num_heads", "intermediate_size")},
            "instance": inst,
            "storage": str(root.root),
            "dataset_path": str(dataset_path(root, cfg.data.dataset)),
            "config_hash": d.config_hash,
        },
    }


def plan_launch(cfg: JobConfig, storage: str | None, *, resume: bool = False
                ) -> tuple[Storage, local.Plan]:
    """Check a local job and everything it needs (storage, name, rendezvous, shards); start nothing."""
    if cfg.job.backend != "local":
        raise UserError("this function plans local jobs; use --backend local, or "
                        "trainmaster.launch.volcano / .kubernetes for a cluster", where="job.backend")
    store = Storage.at(storage, cfg.job.storage)
    store.ensure_writable()
    return store, local.plan(cfg, store, resume=resume)


def start_launch(cfg: JobConfig, store: Storage, plan: local.Plan,
                 on_wait: Callable[[lock.Holder], None] | None = None) -> state.RunState:
    """Start what plan_launch checked; a compile job first takes its cacheset's lock, waiting
    up to plan.lock_wait_s (on_wait is told who holds it)."""
    return local.start(cfg, store, plan, on_wait=on_wait)


def launch(path: str | Path, overrides: list[str] | None = None, storage: str | None = None,
           *, resume: bool = False) -> state.RunState:
    """Start a job locally and return at once; follow it with `status`."""
    cfg = load_job(path, overrides)
    store, plan = plan_launch(cfg, storage, resume=resume)
    return start_launch(cfg, store, plan)


def cancel_job(job: str, storage: str | None = None, grace_s: float = 10.0) -> state.RunState:
    run = runinfo.run_paths(Storage.at(storage), job)
    return local.cancel(run, grace_s)


def job_status(job: str, storage: str | None = None) -> runinfo.Status:
    return runinfo.status(Storage.at(storage), job)
