"""Job config -> a gang-scheduled Volcano Job (batch.volcano.sh/v1alpha1) and its ConfigMaps.

A pure builder (docs/architecture.md 2): no API calls, no files. Every pod runs the torchrun
command line of the local backend (launch/torchrun.py); only where it runs differs. Why the gang,
the rendezvous and its id, the cache lock, the job file's copy and the restarts are built as they
are: docs/architecture.md, "The Volcano job" (3.7).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from typing import Any

from trainmaster import catalog, config, yamltext
from trainmaster.backends.kubernetes import names as k8s_names
from trainmaster.backends.kubernetes import podspec
from trainmaster.backends.kubernetes.names import API_VERSION
from trainmaster.backends.kubernetes.pod_script import (  # noqa: F401 - CACHE_HOLD, RDZV_ID_*: part of this API
    ANN_JOB_VERSION,
    ANN_PODGROUP,
    CACHE_HOLD,
    ENV_JOB_VERSION,
    ENV_PODGROUP,
    LOCK_WAIT_S,
    PUBLISH,
    RDZV_ID_BEGIN,
    RDZV_ID_END,
    TASK,
    annotation_env,
    lock_lines,
    rdzv_id_lines,
)
from trainmaster.cluster import progressguard
from trainmaster.compile import cache
from trainmaster.compile import precompile as pre_mod
from trainmaster.config import JobConfig, jobfile
from trainmaster.errors import UserError
from trainmaster.launch import entry
from trainmaster.launch.torchrun import Rendezvous, command
from trainmaster.monitor.exporter import METRICS_PORT
from trainmaster.storage import RunPaths, Storage

C10D_PORT = 29400
# The in-cluster etcd lives in its own namespace (cluster/addons.py), reached by its Service name.
DEFAULT_ETCD = "etcd-server.trainmaster-etcd.svc:2379"
LABEL_NAME, LABEL_MANAGED = "app.kubernetes.io/name", "app.kubernetes.io/managed-by"
LABEL_JOB, LABEL_KIND = "trainmaster.io/job", "trainmaster.io/kind"
MANAGED_SELECTOR = f"{LABEL_MANAGED}=trainmaster"
ANN_CONFIG_HASH, ANN_STORAGE = "trainmaster.io/config-hash", "trainmaster.io/storage"
_ID_MARK = "@TRAINMASTER_RDZV_ID@"  # stands for "$rdzv_id" in the torchrun line until rendered
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_ENDPOINT = re.compile(rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\]):([0-9]{{1,5}})")


def labels(job: str, kind: str) -> dict[str, str]:
    return {
        LABEL_NAME: "trainmaster",
        LABEL_MANAGED: "trainmaster",
        LABEL_JOB: job,
        LABEL_KIND: kind,
    }


def config_map_name(job: str) -> str:
    return f"{job}-config"  # not `<job>-svc`: that one is the svc plugin's


def rendezvous(cfg: JobConfig) -> Rendezvous:
    r, name = cfg.rendezvous, cfg.job.name
    if r.backend == "c10d":
        host = f"{k8s_names.pod_name(name, TASK, 0)}.{name}"
        return Rendezvous("c10d", r.endpoint or f"{host}:{C10D_PORT}")
    return Rendezvous(r.backend, r.endpoint or DEFAULT_ETCD)


def image_of(cfg: JobConfig, image: str | None) -> str:
    image = image or cfg.kubernetes.image
    if not image or not image.strip() or any(c.isspace() for c in image):
        raise UserError(
            "no training image: set kubernetes.image (e.g. --set kubernetes.image="
            "ACCOUNT.dkr.ecr.REGION.amazonaws.com/trainmaster:TAG)",
            where="kubernetes.image",
        )
    return image


def check_endpoint(endpoint: str | None, where: str = "rendezvous.endpoint") -> None:
    """host:port (a DNS name, an IPv4 or a [IPv6] address): the endpoint goes into the pod's
    shell script and torchrun's arguments, so nothing else gets through."""
    if endpoint is None:
        return
    m = _ENDPOINT.fullmatch(endpoint)
    if m is None or not 0 < int(m.group(1)) < 65536:
        raise UserError(
            f"{endpoint!r} is not host:port (e.g. etcd.example.internal:2379)", where=where
        )


def check_settings(cfg: JobConfig) -> None:
    k = cfg.kubernetes
    k8s_names.check_settings(
        queue=k.queue,
        pvc=k.pvc,
        namespace=k.namespace,
        mount=k.mount,
        service_account=k.service_account,
        node_selector=k.node_selector,
        tolerations=k.tolerations,
    )


def check(cfg: JobConfig, image: str | None) -> tuple[catalog.InstanceType, str]:
    """Every check that needs no cluster; UserError naming the field, before any API call."""
    # The job file's own cross-section checks (node type, workers per node, batch), as for a
    # kubernetes job: a config made for another backend, or copied past validation, gets them too.
    as_k8s = cfg.model_copy(update={"job": cfg.job.model_copy(update={"backend": "kubernetes"})})
    inst = config.derive(as_k8s).instance
    image = image_of(cfg, image)
    check_settings(cfg)
    check_endpoint(cfg.rendezvous.endpoint)
    k8s_names.check_job_name(cfg.job.name, TASK, cfg.job.nnodes)
    host = rendezvous(cfg).endpoint.rpartition(":")[0]
    if cfg.job.nnodes > 1 and (host == "localhost" or host.startswith("127.") or not host):
        default = "the job's own service" if cfg.rendezvous.backend == "c10d" else DEFAULT_ETCD
        raise UserError(
            f"{cfg.rendezvous.endpoint!r} is not reachable from other pods; leave it "
            f"unset on Kubernetes ({default} is used)",
            where="rendezvous.endpoint",
        )
    return inst, image


def container_script(
    cfg: JobConfig, rdzv: Rendezvous, wrapper: list[str], purpose: str = "train"
) -> str:
    """The pod's shell: run folder + job file, wait for the rendezvous name, exec torchrun.

    Every value from the config enters the script through shlex.quote; the rendezvous id is
    the one expansion, "$rdzv_id", in double quotes."""
    name, mount = cfg.job.name, cfg.kubernetes.mount
    run = RunPaths(Storage(Path(mount)).run_dir(name))
    q = shlex.quote
    job_toml, tmp = q(str(run.job_toml)), q(str(run.dir)) + '/.job.toml."$POD_NAME"'
    host = rdzv.endpoint.rpartition(":")[0]
    pod0 = k8s_names.pod_name(name, TASK, 0)
    own = (
        f' && {{ [ "$POD_NAME" != {q(pod0)} ] || [ "$ip" = "$POD_IP" ]; }}'
        if host == f"{pod0}.{name}"
        else ""
    )
    timeout = cfg.rendezvous.timeout
    # A custom job.entrypoint comes with the image: relative paths and -m modules are found in
    # its /workspace (kubernetes.workspace: cluster/image.py), never copied in at run time.
    torchrun = command(
        cfg,
        dataclasses.replace(rdzv, run_id=_ID_MARK),
        job_file=str(run.job_toml),
        storage=mount,
        python="python3",
        workdir=entry.WORKSPACE_DIR,
    )
    line = shlex.join([*wrapper, *torchrun])
    mark = shlex.quote(f"--rdzv-id={_ID_MARK}")
    if line.count(mark) != 1:  # pragma: no cover - torchrun.py renders --rdzv-id once
        raise AssertionError(f"--rdzv-id not found once in {line!r}")
    line = line.replace(mark, '"--rdzv-id=$rdzv_id"')
    publisher = ["python3", "-m", PUBLISH, "--run", str(run.dir), "--job", name]
    publisher += ["--namespace", cfg.kubernetes.namespace, "--nodes", str(cfg.job.nnodes)]
    publisher += ["--peer-lost-after-s", str(cfg.kubernetes.peer_lost_after_s)]
    if cfg.job.min_nnodes and cfg.job.min_nnodes < cfg.job.nnodes:
        publisher.append("--elastic")
    late = q(f"trainmaster: {host} did not resolve to the rendezvous host within {timeout} s")
    return (
        "\n".join(
            [
                "set -eu",
                f"mkdir -p {q(str(run.dir))}",
                f"cp {podspec.CONFIG_DIR}/job.toml {tmp}",
                f"mv -f {tmp} {job_toml}",
                "n=0",
                f"until ip=$(getent hosts {q(host)} | head -n 1 | cut -d' ' -f1) && [ -n \"$ip\" ]{own}; do",
                "  n=$((n + 1))",
                f'  if [ "$n" -ge {timeout} ]; then echo {late} >&2; exit 1; fi',
                "  sleep 1",
                "done",
                *rdzv_id_lines(name),
                *lock_lines(cfg, purpose),
                f"exec {shlex.join(publisher)} -- " + '"$@" ' + line,
            ]
        )
        + "\n"
    )


def _config_map(
    cfg: JobConfig, map_name: str, kind: str, data: dict[str, str], **more_labels: str
) -> dict[str, Any]:
    meta = {"name": map_name, "namespace": cfg.kubernetes.namespace}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**meta, "labels": {**labels(cfg.job.name, kind), **more_labels}},
        "data": data,
    }


def build_config_map(cfg: JobConfig, kind: str = "train") -> dict[str, Any]:
    """`<job>-config`: the resolved job file every pod copies into the run folder."""
    name = cfg.job.name
    text = jobfile.render(cfg, f"resolved job {name} (launch --backend kubernetes)")
    return _config_map(cfg, config_map_name(name), kind, {"job.toml": text})


def build_progress_map(cfg: JobConfig, kind: str = "train") -> dict[str, Any]:
    """`<job>-progress`, empty until rank 0's pod publishes into it (progressmap.py)."""
    name, key = cfg.job.name, progressguard.KEY
    label = {progressguard.LABEL: name}
    return _config_map(cfg, progressguard.map_name(name), kind, {key: ""}, **label)


def _build(
    cfg: JobConfig, image: str | None, kind: str, wrapper: list[str], priority_class: str | None
) -> dict[str, Any]:
    inst, image = check(cfg, image)
    name, job, k = cfg.job.name, cfg.job, cfg.kubernetes
    gang = job.min_nnodes or job.nnodes
    # A fixed-size gang restarts whole (a new rendezvous id); an elastic one replaces the pod
    # alone (the job version, so the rendezvous id, stays): the others train on, and the new
    # pod's agent joins them at a later round when a node can take it.
    whole = "RestartPod" if gang < job.nnodes else "RestartJob"
    action = whole if job.max_restarts else "TerminateJob"
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # a drain, a Spot notice or `cancel`: the trainer saves its step and leaves in this time
        "terminationGracePeriodSeconds": k.stop_grace_s,
        "containers": [
            {
                "name": "trainer",
                "image": image,
                "command": [
                    "/bin/sh",
                    "-c",
                    container_script(
                        cfg,
                        rendezvous(cfg),
                        wrapper,
                        "precompile" if kind == "precompile" else "train",
                    ),
                ],
                "env": podspec.env(cfg, inst, precompile=kind == "precompile")
                + [
                    annotation_env(ENV_PODGROUP, ANN_PODGROUP),
                    annotation_env(ENV_JOB_VERSION, ANN_JOB_VERSION),
                ],
                "ports": [{"name": "metrics", "containerPort": METRICS_PORT}],  # publish.py
                "resources": podspec.resources(inst, cfg),
                "volumeMounts": podspec.volume_mounts(cfg, config_map=True),
                "securityContext": podspec.security_context(inst),
                "workingDir": podspec.WORKING_DIR,
            }
        ],
        "volumes": podspec.volumes(
            cfg, config_map=config_map_name(name), shm_size_gib=podspec.shm_gib(inst, cfg)
        ),
    }
    pod_spec["tolerations"] = [*podspec.tolerations(cfg, inst), *podspec.node_lost_tolerations(cfg)]
    selector = podspec.node_selector(cfg, inst)
    if selector:
        pod_spec["nodeSelector"] = selector
    if k.service_account:
        pod_spec["serviceAccountName"] = k.service_account
    priority_class = priority_class or k.priority_class
    if priority_class:  # on the pods too: the default scheduler's preemption reads the pod's
        pod_spec["priorityClassName"] = priority_class
    spec: dict[str, Any] = {
        "schedulerName": "volcano",
        "queue": k.queue,
        "minAvailable": gang,
        # Volcano fails the job once RetryCount >= maxRetry, and RestartJob counts the restart it
        # asks for first (pkg/controllers/job/state/running.go RetryCount++, restarting.go): so
        # maxRetry N allows N - 1 restarts; + 1 makes job.max_restarts mean restarts.
        "maxRetry": job.max_restarts + 1,
        "plugins": {"svc": ["--publish-not-ready-addresses"], "env": []},
        "policies": [
            {"event": "PodEvicted", "action": action},
            {"event": "PodFailed", "action": action},
        ],
        "tasks": [
            {
                "name": TASK,
                "replicas": job.nnodes,
                "minAvailable": gang,
                "template": {"metadata": {"labels": labels(name, kind)}, "spec": pod_spec},
            }
        ],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    out = {
        "apiVersion": API_VERSION,
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": k.namespace,
            "labels": labels(name, kind),
            "annotations": {ANN_CONFIG_HASH: cfg.derived.config_hash, ANN_STORAGE: k.mount},
        },
        "spec": spec,
    }
    k8s_names.check_job(out)
    return out


def build_job(
    cfg: JobConfig, *, image: str | None = None, priority_class: str | None = None
) -> dict[str, Any]:
    """The training job: image from the argument, else kubernetes.image."""
    return _build(cfg, image, "train", [], priority_class)


def build_precompile_job(
    cfg: JobConfig, *, image: str | None = None, steps: int = pre_mod.DEFAULT_STEPS
) -> dict[str, Any]:
    """`<job>-precompile` (compile/precompile.py): the job itself, a few steps, compile on, with
    the precompile environment of compile/cache.py; on Neuron torchrun runs under
    neuron_parallel_compile."""
    pre = pre_mod.precompile_config(cfg, steps)
    wrapper = cache.precompile_command(cache.mechanism(pre, environ={}), [])
    return _build(pre, image, "precompile", wrapper, None)


def objects(
    cfg: JobConfig,
    *,
    image: str | None = None,
    precompile: bool = False,
    steps: int = pre_mod.DEFAULT_STEPS,
    priority_class: str | None = None,
) -> list[dict[str, Any]]:
    """Everything a launch creates, in creation order: the ConfigMaps (job file, progress), then
    the Job; with
    precompile, those of `<job>-precompile` (`steps` steps)."""
    if precompile:
        pre = pre_mod.precompile_config(cfg, steps)
        return [
            build_config_map(pre, "precompile"),
            build_progress_map(pre, "precompile"),
            build_precompile_job(cfg, image=image, steps=steps),
        ]
    return [
        build_config_map(cfg),
        build_progress_map(cfg),
        build_job(cfg, image=image, priority_class=priority_class),
    ]


def render_yaml(objs: list[dict[str, Any]]) -> str:
    """Every object as one YAML document (`launch --dry-run`; `kubectl apply -f -` takes it)."""
    return yamltext.dump(objs, width=100)
