"""What the local control plane puts into its API server: Volcano's CRDs and webhook
configurations, its namespace, kwok's stages, and the fake nodes.

The Volcano and kwok files are upstream's own, copied by build.sh from the module zips into
SHARE (the cache folder next to the binaries): the CRDs from Volcano's Helm chart, the webhook
configurations from its installer (volcano-development.yaml), the scheduler configuration from
the chart, kwok's stages from its kustomize/stage folder. Only what cannot work on loopback is
changed here, each change said where it is made.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from trainmaster import catalog
from trainmaster.cluster.cloudformation import ROOT_VOLUME_GIB
from trainmaster.cluster.spec import ROLE_LABEL

VOLCANO_NAMESPACE = "volcano-system"
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")  # kwok manages only nodes that carry it
# On a pod of a node that kube_faults.lose() stopped: kwok does not complete its deletion.
LOST_POD = "trainmaster.io/test-node-lost"
MAX_PODS = 110  # the kubelet's default
# The EFA installer, which the EKS accelerated AMIs carry, reserves 2 MiB huge pages for
# libfabric's EFA provider ("If you have EFA installer installed on your instance, you should
# be able to see there are huge page reserved", ofiwg/libfabric issue 9739); EFA pods request
# them (backends/kubernetes/podspec.py HUGEPAGES). Without them an EFA node here would refuse
# every training pod with "overused hugepages-2Mi", which a real node does not.
EFA_HUGEPAGES_MI = 5128 * 2


# libyaml's loader when PyYAML has it: the pure-Python one takes seconds for Volcano's CRDs
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.load_all(path.read_text(), Loader=_LOADER) if doc]


def crds(share: Path) -> list[dict[str, Any]]:
    return [doc for f in sorted((share / "volcano" / "crd").glob("*.yaml")) for doc in load_all(f)]


def webhook_configurations(share: Path, url: str, ca: Path) -> list[dict[str, Any]]:
    """Volcano's installer points each webhook at its Service in volcano-system; here there are
    no Services that route anywhere, so each points at the webhook manager's loopback URL. The
    caBundle is set here too (vc-webhook-manager would patch it in, but only after the API
    server has already refused requests it could not verify)."""
    out = load_all(share / "volcano" / "webhooks.yaml")
    bundle = base64.b64encode(ca.read_bytes()).decode()
    for config in out:
        for hook in config["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": bundle}
    return out


def admission_paths(configs: list[dict[str, Any]]) -> list[str]:
    """The paths vc-webhook-manager must serve: exactly those configured (--enabled-admission)."""
    return sorted(
        {"/" + h["clientConfig"]["url"].split("/", 3)[3] for c in configs for h in c["webhooks"]}
    )


def kwok_stages(share: Path) -> str:
    """kwok's "fast" node and pod stages plus lease heartbeats. Its pod-delete stage completes
    every pod deletion, as a kubelet does; not on a node that is lost (kube_faults: a pod marked
    LOST_POD), where no kubelet is left to do it. Its pod-complete stage turns every
    Running pod owned by a "Job" into Succeeded at once, and a Volcano Job's pods are owned by a
    Job too (batch.volcano.sh): so completion is kept for batch/v1 Jobs only, and Volcano pods
    stay Running until a test sets their phase (kwok leaves a phase it did not set alone)."""
    stages = [doc for f in sorted((share / "kwok").glob("*.yaml")) for doc in load_all(f)]
    for stage in stages:
        if stage["metadata"]["name"] == "pod-delete":  # no kubelet ends a lost node's pods
            stage["spec"]["selector"]["matchExpressions"].append(
                {"key": f'.metadata.annotations["{LOST_POD}"]', "operator": "DoesNotExist"}
            )
        if stage["metadata"]["name"] == "pod-complete":
            stage["spec"]["selector"]["matchExpressions"].append(
                {
                    "key": ".metadata.ownerReferences.[].apiVersion",
                    "operator": "In",
                    "values": ["batch/v1"],
                }
            )
    return yaml.safe_dump_all(stages, sort_keys=False)


def check_shape(instance_type: str, nodes: int) -> str | None:
    """Why this node shape cannot be made, or None: accelerator types of the catalog only (the
    nodes are the accelerator node group's)."""
    types = sorted(n for n, t in catalog.CATALOG.items() if t.device_resource)
    if instance_type not in types:
        return f"instance type {instance_type!r}: use one of {', '.join(types)}"
    return None if nodes >= 1 else f"--nodes {nodes}: at least 1"


def _cpu_reserved_milli(vcpu: int) -> int:
    """kube-reserved CPU as the EKS AMIs compute it: 6% of the first core, 1% of the second,
    0.5% of the next two, 0.25% of the rest."""
    cores = [(1, 60), (1, 10), (2, 5), (max(0, vcpu - 4), 2.5)]
    left, total = vcpu, 0.0
    for n, milli in cores:
        take = min(left, n)
        total, left = total + take * milli, left - take
    return int(total)


def node(name: str, instance_type: str) -> dict[str, Any]:
    """A Node shaped like one of the accelerator node group's (cluster/cloudformation.py): the
    instance-type label EC2 nodes get, the node group's labels and its taint (the device
    resource, `=true:NoSchedule`), and the catalog's capacity. Allocatable is capacity less
    what the EKS AMI reserves (kube-reserved CPU above; 255Mi + 11Mi per pod of memory and
    100Mi of eviction threshold), so that a pod asking for more than a real node offers does not
    fit here either."""
    t = catalog.CATALOG[instance_type]
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": t.name,
        "topology.kubernetes.io/region": "local",
        "topology.kubernetes.io/zone": "local-a",
        "type": "kwok",
        ROLE_LABEL: "accelerator",
    }
    if t.device_kind == "cuda":
        labels["nvidia.com/gpu.present"] = "true"  # as ClusterSpec.accelerator_labels
    capacity = {
        "cpu": str(t.vcpu),
        "memory": f"{t.memory_gib}Gi",
        "pods": str(MAX_PODS),
        "ephemeral-storage": f"{ROOT_VOLUME_GIB}Gi",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": f"{EFA_HUGEPAGES_MI}Mi" if t.efa_interfaces else "0",
    }
    devices: dict[str, str] = {}
    if t.device_resource:
        devices[t.device_resource] = str(t.devices)
    if t.efa_interfaces:
        devices[catalog.EFA] = str(t.efa_interfaces)
    reserved_mi = 255 + 11 * MAX_PODS + 100
    huge_mi = EFA_HUGEPAGES_MI if t.efa_interfaces else 0
    allocatable = {
        **capacity,
        "cpu": f"{t.vcpu * 1000 - _cpu_reserved_milli(t.vcpu)}m",
        # the kubelet leaves pre-allocated huge pages out of allocatable memory
        "memory": f"{t.memory_gib * 1024 - reserved_mi - huge_mi}Mi",
    }
    spec: dict[str, Any] = {}
    if t.device_resource:
        spec["taints"] = [{"key": t.device_resource, "value": "true", "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]},
        },
        "spec": spec,
        "status": {"capacity": capacity | devices, "allocatable": allocatable | devices},
    }


def node_names(instance_type: str, count: int) -> list[str]:
    group = instance_type.replace(
        ".", "-"
    )  # as ClusterSpec.nodegroup: trn1.32xlarge -> trn1-32xlarge
    return [f"{group}-{i}" for i in range(count)]


# What `cluster up` lays for a job and a gang needs before it can be placed: the Volcano queue the
# presets name and the shared-storage claim, built by the cluster's own builders from the trn1
# preset (zones and API CIDRs given, so nothing asks AWS). FSx is not here: the claim is bound
# to a hostPath volume in the run folder standing in for it (no container reads it: kwok runs
# none). So README's job runs on `make kube-up` as written.
JOB_PRESET = "trn1-bert-large"
JOB_SETS = [
    'cluster.zones=["us-west-2a", "us-west-2b"]',
    'cluster.public_access_cidrs=["203.0.113.7/32"]',
]


def job_objects(storage: Path) -> list[dict[str, Any]]:
    from trainmaster.cluster import addons, fsx, spec
    from trainmaster.config import jobfile

    cluster = spec.resolve(jobfile.preset(JOB_PRESET, JOB_SETS))
    claim = fsx.claim(cluster)
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"{claim['metadata']['name']}-local",
            "labels": claim["metadata"]["labels"],
        },
        "spec": {
            "capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
            "accessModes": claim["spec"]["accessModes"],
            "storageClassName": claim["spec"]["storageClassName"],
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": str(storage), "type": "DirectoryOrCreate"},
            "claimRef": {
                "namespace": claim["metadata"]["namespace"],
                "name": claim["metadata"]["name"],
            },
        },
    }
    return [addons.queue(cluster), pv, claim]


def token_kubeconfig(admin: Path, token: str, out: Path, user: str) -> Path:
    """The admin kubeconfig with its user swapped for a bearer token (a service account's, or
    one bound to a pod): what a watcher or a pod's own process sees as its identity."""
    config = yaml.safe_load(admin.read_text())
    config["users"] = [{"name": user, "user": {"token": token}}]
    for ctx in config["contexts"]:
        ctx["context"]["user"] = user
    out.write_text(yaml.safe_dump(config))
    return out
