"""The parts of a training pod that come from the node type: resources, environment, placement.

Pure functions of the catalog entry and the config, shared by the Volcano Job builder and the
data-stage pod. Why each is what it is (the whole node, Guaranteed QoS, a bounded /dev/shm,
node-local scratch, no privilege but IPC_LOCK for EFA), with the upstream sources:
docs/architecture.md, "The training pod" (3.7).
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from trainmaster import catalog, storage
from trainmaster.backends.kubernetes.names import NODE_LOST_TAINTS
from trainmaster.compile import cache
from trainmaster.config import JobConfig
from trainmaster.launch import torchrun

CONFIG_DIR = "/etc/trainmaster"  # where the job's ConfigMap (job.toml) is mounted
STORAGE_VOLUME = "storage"
CONFIG_VOLUME = "job-config"
SHM_VOLUME = "dshm"
SHM_MAX_GIB = 64
SCRATCH_VOLUME = "scratch"
SCRATCH_DIR = "/tmp"  # TMPDIR and HOME: node-local, writable under a read-only root filesystem
# The containers' working directory too: tools write beside themselves, e.g. neuronx-cc's
# --logfile defaults to "log-neuron-cc.txt" in the current directory (aws-neuron-sdk docs,
# compiler/neuronx-cc/api-reference-guide/neuron-compiler-cli-reference-guide.rst).
WORKING_DIR = SCRATCH_DIR


def cpu_limit(inst: catalog.InstanceType) -> int:
    return inst.vcpu - max(2, inst.vcpu // 16)


# EFA's libfabric provider puts its bounce buffers in huge pages (ofiwg/libfabric
# prov/efa/docs/overview.md), and AWS's EKS EFA manifests request them: hugepages-2Mi 5120Mi
# (aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/kubernetes/
# nccl-tests.yaml). Pre-allocated huge pages leave the node's allocatable memory, so the pod's
# memory shrinks by as much.
HUGEPAGES = "hugepages-2Mi"
HUGEPAGES_GIB = 5


def memory_limit_gib(inst: catalog.InstanceType, cfg: JobConfig | None = None) -> int:
    if cfg is not None and cfg.kubernetes.memory_gib:
        return cfg.kubernetes.memory_gib
    return int(inst.memory_gib * 0.9) - (HUGEPAGES_GIB if inst.efa_interfaces else 0)


def shm_gib(inst: catalog.InstanceType, cfg: JobConfig | None = None) -> int:
    return max(1, min(SHM_MAX_GIB, memory_limit_gib(inst, cfg) // 8))


def _cpu(inst: catalog.InstanceType, cfg: JobConfig | None) -> str:
    if cfg is not None and cfg.kubernetes.cpu:
        return f"{cfg.kubernetes.cpu:g}"
    return str(cpu_limit(inst))


def resources(inst: catalog.InstanceType, cfg: JobConfig | None = None) -> dict[str, Any]:
    """requests == limits for everything (Guaranteed QoS; extended resources require it); cpu
    and memory from kubernetes.cpu / memory_gib where the job sets them."""
    res: dict[str, str] = {"cpu": _cpu(inst, cfg), "memory": f"{memory_limit_gib(inst, cfg)}Gi"}
    if inst.device_resource is not None:
        res[inst.device_resource] = str(inst.devices)
    if inst.efa_interfaces:
        res[catalog.EFA] = str(inst.efa_interfaces)
        res[HUGEPAGES] = f"{HUGEPAGES_GIB * 1024}Mi"
    return {"requests": dict(res), "limits": dict(res)}


def tolerations(cfg: JobConfig, inst: catalog.InstanceType | None) -> list[dict[str, str]]:
    """Device taints that accelerator node groups carry, then the job's own."""
    tols = []
    kinds = [inst.device_resource] if inst else [catalog.NEURON, catalog.NVIDIA_GPU]
    for resource in kinds:
        if resource is not None:
            tols.append({"key": resource, "operator": "Exists", "effect": "NoSchedule"})
    if inst is None or inst.efa_interfaces:
        tols.append({"key": catalog.EFA, "operator": "Exists", "effect": "NoSchedule"})
    return tols + [dict(t) for t in cfg.kubernetes.tolerations]


def node_lost_tolerations(cfg: JobConfig) -> list[dict[str, Any]]:
    """How long a training pod waits on a lost node before it is evicted (NoExecute only: the
    NoSchedule twins of these taints keep a restarted gang off the node)."""
    return [
        {
            "key": key,
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": cfg.kubernetes.node_lost_after_s,
        }
        for key in NODE_LOST_TAINTS
    ]


def node_selector(cfg: JobConfig, inst: catalog.InstanceType) -> dict[str, str]:
    # The generic "cpu" catalog entry is not an EC2 type: CPU jobs select nodes by the job's
    # node_selector only (e.g. a node group label).
    sel = {} if inst.name == "cpu" else {"node.kubernetes.io/instance-type": inst.name}
    return sel | dict(cfg.kubernetes.node_selector)


def cache_dir(cfg: JobConfig) -> PurePosixPath:
    # docs/architecture.md 3.3: STORAGE/cache/CACHESET, ONE cache shared by all nodes (the
    # tutorial's per-node caches compiled every graph once per node).
    return PurePosixPath(cfg.kubernetes.mount, storage.CACHES, cfg.train.cacheset)


def security_context(inst: catalog.InstanceType | None) -> dict[str, Any]:
    """The container's securityContext (module docstring: what the devices need and why)."""
    caps: dict[str, list[str]] = {"drop": ["ALL"]}
    if inst is not None and inst.efa_interfaces:
        caps["add"] = ["IPC_LOCK"]
    return {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": caps,
    }


def scratch_env() -> dict[str, str]:
    # HOME too: ~/.cache (pip, torch hub, triton, aws cli) must be writable on a read-only root.
    return {"TMPDIR": SCRATCH_DIR, "HOME": SCRATCH_DIR}


def uses_cache(cfg: JobConfig) -> bool:
    """Whether the pods compile into the shared cacheset (and so take its lock)."""
    return cache.mechanism(cfg, environ={}) != "inductor" or cfg.train.compile


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def worker_grace_s(cfg: JobConfig) -> int:
    """Seconds the workers have to save and exit after SIGTERM: the pod's grace
    (kubernetes.stop_grace_s, its terminationGracePeriodSeconds) less torchrun's own exit."""
    return max(1, cfg.kubernetes.stop_grace_s - 5)


def env(
    cfg: JobConfig, inst: catalog.InstanceType, *, precompile: bool = False
) -> list[dict[str, Any]]:
    """Environment of a training container: the device stack's network and cache settings.

    The compile cache's settings come from compile/cache.py, as for the local launcher and the
    trainer. Neuron compiles every graph whether or not train.compile is set, so its cache is
    always configured; torch.compile's only for compile jobs. `precompile` adds what the
    precompile job's wrapper (neuron_parallel_compile) reads."""
    plain: dict[str, str] = {
        "TRAINMASTER_STORAGE": cfg.kubernetes.mount,
        "PYTHONUNBUFFERED": "1",
        **torchrun.AGENT_ENV,
        # torchrun gives its workers this long after the pod's SIGTERM before it SIGKILLs them
        # (torch 2.13 reads it; trn1's torch 2.9 keeps a fixed 30 s); its default 30 would cut a save
        # short inside a longer grace. A few seconds are left for torchrun's own exit.
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(worker_grace_s(cfg)),
    }
    if inst.neuron:  # trn1 (XLA) and Trn2/Trn3 (TorchNeuron) alike
        plain |= {
            "FI_PROVIDER": "efa",
            "FI_EFA_USE_DEVICE_RDMA": "1",
            "FI_EFA_FORK_SAFE": "1",  # else "Multi-node support will be disabled" on AL2 kernels
            "CCOM_SOCKET_IFNAME": "eth0",
            "NEURON_RT_RESET_CORES": "1",
        }
        if cfg.train.precision == "bf16":
            plain["NEURON_RT_STOCHASTIC_ROUNDING_EN"] = "1"
        if not inst.efa_interfaces:  # trn1.2xlarge: one node, no EFA
            for key in ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_FORK_SAFE"):
                plain.pop(key)
    elif inst.device_kind == "cuda":
        plain |= {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "eth0"}
        if inst.efa_interfaces:
            plain |= {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}
    else:
        plain["GLOO_SOCKET_IFNAME"] = "eth0"
    kind = cache.mechanism(cfg, environ={})
    if uses_cache(cfg):
        plain |= (cache.precompile_env if precompile else cache.env)(kind, cache_dir(cfg))
    plain |= scratch_env()  # after the cache's settings: scratch is node-local, never on FSx
    out: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in plain.items()]
    return out + [
        _field("POD_NAME", "metadata.name"),
        _field("POD_IP", "status.podIP"),
        _field("NODE_NAME", "spec.nodeName"),
    ]


def scratch_volume() -> dict[str, Any]:
    # No medium: the node's ephemeral storage (the kubelet root, on instance-store NVMe on the
    # accelerator node groups), deleted with the pod. No sizeLimit: compiler work folders are
    # large, and exceeding a limit evicts the whole gang.
    return {"name": SCRATCH_VOLUME, "emptyDir": {}}


def scratch_mount() -> dict[str, Any]:
    return {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_DIR}


def volumes(cfg: JobConfig, *, config_map: str | None, shm_size_gib: int) -> list[dict[str, Any]]:
    vols: list[dict[str, Any]] = [
        {"name": STORAGE_VOLUME, "persistentVolumeClaim": {"claimName": cfg.kubernetes.pvc}},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_size_gib}Gi"}},
        scratch_volume(),
    ]
    if config_map is not None:
        vols.append({"name": CONFIG_VOLUME, "configMap": {"name": config_map}})
    return vols


def volume_mounts(cfg: JobConfig, *, config_map: bool) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": STORAGE_VOLUME, "mountPath": cfg.kubernetes.mount},
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
        scratch_mount(),
    ]
    if config_map:
        mounts.append({"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True})
    return mounts
