"""The Python API that the CLI is a thin layer over; scripts can use it directly.

    from trainmaster import api
    cfg = api.load_job("job.toml", ["train.batch_size=8"])
    print(api.describe(cfg)["derived"]["grad_accum"])

    target = api.Target(backend="local", storage="./data")
    backend = api.backend(target, cfg)        # the one place a backend is chosen
    dry = backend.plan(cfg)                   # every check; dry.render() is what --dry-run prints
    job = backend.submit(dry).job
    print(backend.handle(job), backend.status(job).phase)   # local://NAME succeeded

Helpers for your own training script (log_metrics and the like) are in trainmaster.worker,
which imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from trainmaster.backends.base import BACKEND_NAMES, Backend, JobRef, Target, parse_job
from trainmaster.backends.kubernetes.backend import KubernetesBackend, KubernetesOptions
from trainmaster.backends.local.backend import LocalBackend, LocalOptions
from trainmaster.config import JobConfig, jobfile
from trainmaster.config.presets import JOB_PRESETS
from trainmaster.errors import UserError
from trainmaster.storage import Storage, dataset_path
from trainmaster.worker import log_metrics as log_metrics  # scripts written for 0.1 import it here

__all__ = [
    "BACKENDS",
    "JOB_PRESETS",
    "Backend",
    "LaunchOptions",
    "Target",
    "backend",
    "backend_for_job",
    "backend_name",
    "describe",
    "init_job",
    "load_job",
    "load_job_for",
    "log_metrics",
    "preset_job",
    "render_job",
]


def load_job(path: str | Path, overrides: list[str] | None = None) -> JobConfig:
    """Read, override and validate a job file (ConfigError on any problem)."""
    return jobfile.load(path, overrides)


@dataclass(frozen=True)
class LaunchOptions:
    """What `launch` and `precompile` say that only one backend understands; each backend's
    factory takes what is its own and refuses what it cannot honour."""

    resume: bool = False  # local: continue a run that exists (Kubernetes jobs always resume)
    image: str | None = None  # kubernetes: the training image, else kubernetes.image


def _local(target: Target, launch: LaunchOptions) -> Backend:
    if launch.image:
        raise UserError(
            "the local backend runs this machine's Python, not an image; --image is "
            "for --backend kubernetes",
            where="--image",
        )
    return LocalBackend(LocalOptions(storage=target.storage, resume=launch.resume))


def _kubernetes(target: Target, launch: LaunchOptions) -> Backend:
    return KubernetesBackend(
        KubernetesOptions(
            kubeconfig=target.kubeconfig,
            context=target.context,
            namespace=target.namespace,
            image=launch.image,
        )
    )


# The backends by name. Tests may register a fake one under a name: everything goes through it.
BACKENDS: dict[str, Callable[[Target, LaunchOptions], Backend]] = {
    "local": _local,
    "kubernetes": _kubernetes,
}
BACKEND_ENV = "TRAINMASTER_BACKEND"


def backend_name(target: Target, cfg: JobConfig | None = None) -> str:
    """--backend, else the job file's job.backend (commands that read one), else
    $TRAINMASTER_BACKEND, else local."""
    value = (
        target.backend
        or (cfg.job.backend if cfg is not None else None)
        or os.environ.get(BACKEND_ENV)
        or "local"
    )
    if value not in BACKEND_NAMES:
        raise UserError(
            f"unknown backend {value!r}; use {' or '.join(BACKEND_NAMES)}", where="--backend"
        )
    return value


def backend(
    target: Target, cfg: JobConfig | None = None, launch: LaunchOptions | None = None
) -> Backend:
    """The backend a command talks to: chosen here, once; nothing else asks which it is.
    With a job file, its job.storage stands in for a missing --storage (so that `launch
    --follow` watches the folder the job runs in)."""
    if cfg is not None and target.storage is None and cfg.job.storage:
        target = dataclasses.replace(target, storage=cfg.job.storage)
    return BACKENDS[backend_name(target, cfg)](target, launch or LaunchOptions())


def backend_for_job(target: Target, job: str) -> tuple[Backend, str]:
    """(the backend, the job's name) for a command's JOB argument: a handle that `launch`
    printed (local://JOB, kubernetes://NAMESPACE/JOB) names its backend and namespace, so a
    cluster job needs no --backend after launch; a bare name goes by the options."""
    ref: JobRef = parse_job(job)
    if ref.backend and target.backend and ref.backend != target.backend:
        raise UserError(
            f"{job!r} is a {ref.backend} job, but --backend says {target.backend}",
            where="--backend",
        )
    if ref.namespace and target.namespace and ref.namespace != target.namespace:
        raise UserError(
            f"{job!r} is in namespace {ref.namespace}, but --namespace says {target.namespace}",
            where="--namespace",
        )
    target = dataclasses.replace(
        target, backend=ref.backend or target.backend, namespace=ref.namespace or target.namespace
    )
    return backend(target), ref.job


def load_job_for(path: str | Path, overrides: list[str] | None, target: Target) -> JobConfig:
    """A job file as the global options place it: --backend sets job.backend, --namespace
    kubernetes.namespace (after the file's values and --set)."""
    extra = [f'job.backend="{backend_name(target)}"'] if target.backend else []
    extra += [f'kubernetes.namespace="{target.namespace}"'] if target.namespace else []
    return load_job(path, [*(overrides or []), *extra])


def script_job(
    script: str,
    args: list[str],
    *,
    nnodes: int = 1,
    nproc_per_node: int = 1,
    name: str | None = None,
    overrides: list[str] | None = None,
) -> JobConfig:
    """A job for a script without a job file (`launch train.py --nnodes 2 -- ARGS`), as TorchX's
    `dist.ddp --script` gives: local, c10d, the script as entrypoint. The name is the script's
    stem plus a short random suffix, so that running the same command again is a new job."""
    if name is None:
        stem = re.sub(r"[^a-z0-9-]+", "-", Path(script).stem.lower()).strip("-")
        stem = (stem if stem[:1].isalpha() else f"job-{stem}").rstrip("-")[:32].rstrip("-")
        name = f"{stem}-{secrets.token_hex(3)}"
    data: dict[str, Any] = {
        "job": {"name": name, "backend": "local", "nnodes": nnodes,
                "nproc_per_node": nproc_per_node, "entrypoint": script, "args": list(args)},
        "rendezvous": {"backend": "c10d"},
    }  # fmt: skip
    return jobfile.validate(jobfile.apply_overrides(data, overrides or []), where=script)


def script_job_text(cfg: JobConfig) -> str:
    """The sections a script job sets, as TOML: the start of its own job file."""
    job = cfg.job.model_dump(
        include={"name", "backend", "nnodes", "nproc_per_node", "entrypoint", "args"}
    )
    return tomli_w.dumps({"job": job, "rendezvous": {"backend": cfg.rendezvous.backend}})


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
            "model": {
                k: cfg.model.size(k)
                for k in ("num_layers", "hidden_size", "num_heads", "intermediate_size")
            },
            "instance": inst,
            "storage": str(root.root),
            "dataset_path": str(dataset_path(root, cfg.data.dataset)),
            "config_hash": d.config_hash,
        },
    }


# --- Kubernetes-only commands (node, data stage, cluster status): the CLI reaches the backend
# through here too, so that no command imports a backend package (the import contract) --------


def _cluster(target: Target) -> Any:
    from trainmaster.backends.kubernetes.client import connect

    return connect(target.kubeconfig, target.context, target.namespace)


def node_marks(target: Target) -> list[Any]:
    """The nodes a training pod or the node watcher marked unhealthy (nodemark.Mark each)."""
    from trainmaster.backends.kubernetes import nodemark

    return nodemark.marks(_cluster(target))


def clear_node_mark(target: Target, node: str) -> bool:
    from trainmaster.backends.kubernetes import nodemark

    return nodemark.clear(_cluster(target), node)


def stage_pod(cfg: JobConfig, src: str, name: str, *, image: str | None, public: bool) -> Any:
    """The short-lived pod that copies a dataset onto the claim (backends/kubernetes/stage.py)."""
    from trainmaster.backends.kubernetes import stage

    return stage.build_stage_pod(cfg, src, name, image=image, no_sign_request=public)


def stage_yaml(pod: Any) -> str:
    from trainmaster.backends.kubernetes.volcano import render_yaml

    return render_yaml([pod])


def run_stage(target: Target, cfg: JobConfig, pod: Any, on_line: Callable[[str], None]) -> str:
    """Run the stage pod to its end; the dataset's path on the claim, verified there."""
    from trainmaster.backends.kubernetes import stage

    where = dataclasses.replace(target, namespace=cfg.kubernetes.namespace)
    return str(stage.run_stage(_cluster(where), pod, on_line=on_line))


def cluster_status(plan: Any, kubeconfig: str | None, context: str | None) -> Any:
    """What of a plan exists in AWS and in the cluster (cluster/status.py, the cluster's side
    from backends/kubernetes/clusterinfo.py)."""
    import functools

    from trainmaster.backends.kubernetes import clusterinfo
    from trainmaster.cluster.status import gather

    return gather(plan, functools.partial(clusterinfo.fill, kubeconfig=kubeconfig, context=context))
