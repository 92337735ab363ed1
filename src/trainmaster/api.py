"""The Python API that the CLI is a thin layer over; scripts can use it directly.

    from trainmaster import api
    cfg = api.load_job("job.toml", ["train.batch_size=8"])
    print(api.describe(cfg)["derived"]["grad_accum"])

    target = api.Target(backend="local", storage="./data")
    backend = api.backend(target, cfg)        # the one place a backend is chosen
    dry = backend.plan(cfg)                   # every check; dry.render() is what --dry-run prints
    print(backend.submit(dry).job, backend.status(cfg.job.name).phase)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainmaster import jobfile
from trainmaster.backends.base import BACKEND_NAMES, Backend, Target
from trainmaster.backends.kubernetes.backend import KubernetesBackend
from trainmaster.backends.local import launcher as local
from trainmaster.backends.local.backend import LocalBackend
from trainmaster.compile import lock
from trainmaster.config import JobConfig
from trainmaster.errors import UserError
from trainmaster.monitor import runinfo
from trainmaster.presets import JOB_PRESETS
from trainmaster.run import state
from trainmaster.run.metrics import log_metrics as log_metrics  # for custom scripts (issue 13.1)
from trainmaster.storage import Storage, dataset_path

__all__ = ["BACKENDS", "JOB_PRESETS", "Backend", "Target", "backend", "backend_name", "cancel_job", "describe", "init_job", "job_status", "launch", "load_job", "load_job_for",
           "log_metrics", "plan_launch", "preset_job", "render_job", "start_launch"]


def load_job(path: str | Path, overrides: list[str] | None = None) -> JobConfig:
    """Read, override and validate a job file (ConfigError on any problem)."""
    return jobfile.load(path, overrides)


# The backends by name. Tests may register a fake one under a name: everything goes through it.
BACKENDS: dict[str, Callable[[Target], Backend]] = {"local": LocalBackend, "kubernetes": KubernetesBackend}
BACKEND_ENV = "TRAINMASTER_BACKEND"


def backend_name(target: Target, cfg: JobConfig | None = None) -> str:
    """--backend, else the job file's job.backend (commands that read one), else
    $TRAINMASTER_BACKEND, else local."""
    value = target.backend or (cfg.job.backend if cfg is not None else None) \
        or os.environ.get(BACKEND_ENV) or "local"
    if value not in BACKEND_NAMES:
        raise UserError(f"unknown backend {value!r}; use {' or '.join(BACKEND_NAMES)}", where="--backend")
    return value


def backend(target: Target, cfg: JobConfig | None = None) -> Backend:
    """The backend a command talks to: chosen here, once; nothing else asks which it is.
    With a job file, its job.storage stands in for a missing --storage (so that `launch
    --follow` watches the folder the job runs in)."""
    if cfg is not None and target.storage is None and cfg.job.storage:
        target = dataclasses.replace(target, storage=cfg.job.storage)
    return BACKENDS[backend_name(target, cfg)](target)


def load_job_for(path: str | Path, overrides: list[str] | None, target: Target) -> JobConfig:
    """A job file as the global options place it: --backend sets job.backend, --namespace
    kubernetes.namespace (after the file's values and --set)."""
    extra = [f'job.backend="{backend_name(target)}"'] if target.backend else []
    extra += [f'kubernetes.namespace="{target.namespace}"'] if target.namespace else []
    return load_job(path, [*(overrides or []), *extra])


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
                        "trainmaster.backends.kubernetes.volcano / .kubernetes for a cluster", where="job.backend")
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
