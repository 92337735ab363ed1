"""`cluster status`: what of the plan exists, from AWS (boto3) and the cluster (kubernetes client).

The answer users of the tutorial needed most is per node: does it offer its accelerators and
EFA interfaces (allocatable aws.amazon.com/neuron, vpc.amazonaws.com/efa, nvidia.com/gpu)? A
job that asks for them on a node whose device plugin is missing waits forever in Pending
("Insufficient aws.amazon.com/neuron", reference 6.5). AWS answers come first; the cluster's
only when it is ACTIVE, and a failure to reach it is reported, not raised.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainmaster import catalog
from trainmaster.cluster import aws
from trainmaster.cluster.plan import LoadedPlan
from trainmaster.cluster.spec import ROLE_LABEL

RESOURCES = (catalog.NEURON, "aws.amazon.com/neuroncore", catalog.NVIDIA_GPU, catalog.EFA)


@dataclass(frozen=True)
class Node:
    name: str
    instance_type: str
    zone: str
    role: str
    ready: bool
    allocatable: dict[str, str]


@dataclass
class Status:
    cluster: dict[str, Any] | None = None
    nodegroups: list[dict[str, Any]] = field(default_factory=list)
    stack_status: str | None = None
    repository: str | None = None
    image_tags: list[str] = field(default_factory=list)
    image: str | None = None  # repo@sha256:... of the plan's tag, once pushed: what jobs should use
    file_systems: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    queue: bool | None = None
    claim_phase: str | None = None
    kube_error: str | None = None


def node_of(item: dict[str, Any]) -> Node:
    """One item of GET /api/v1/nodes."""
    meta, status = item.get("metadata", {}), item.get("status", {})
    labels = meta.get("labels", {}) or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions", []) or [])
    alloc = status.get("allocatable", {}) or {}
    return Node(name=meta.get("name", "?"),
                instance_type=labels.get("node.kubernetes.io/instance-type", "?"),
                zone=labels.get("topology.kubernetes.io/zone", "?"),
                role=labels.get(ROLE_LABEL, "-"), ready=ready,
                allocatable={r: str(alloc[r]) for r in RESOURCES if r in alloc})


def _kube(plan: LoadedPlan, st: Status, kubeconfig: str | None, context: str | None) -> None:
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config
    from kubernetes.client.exceptions import ApiException

    path = Path(kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
                or "~/.kube/config").expanduser()
    configuration = k8s.Configuration()
    try:
        k8s_config.load_kube_config(config_file=str(path), context=context,
                                    client_configuration=configuration, persist_config=False)
    except (k8s_config.ConfigException, OSError) as exc:
        st.kube_error = (f"cannot use {path} ({exc}); run `aws eks update-kubeconfig --name "
                         f"{plan.cluster['name']} --region {plan.cluster['region']}`")
        return
    c = plan.cluster
    endpoint = (st.cluster or {}).get("endpoint")
    if endpoint and configuration.host.rstrip("/") != str(endpoint).rstrip("/"):
        st.kube_error = (f"the kubeconfig context points at {configuration.host}, not cluster "
                         f"{c['name']}; run `aws eks update-kubeconfig --name {c['name']} "
                         f"--region {c['region']}` or pass --context")
        return
    with k8s.ApiClient(configuration) as api:
        core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
        try:
            nodes: Any = core.list_node(_preload_content=False, _request_timeout=20)
            st.nodes = sorted((node_of(i) for i in json.loads(nodes.data).get("items", [])),
                              key=lambda n: (n.role, n.name))
        except (ApiException, OSError, ValueError) as exc:
            st.kube_error = f"cannot list nodes: {getattr(exc, 'reason', None) or exc}"
            return
        try:
            custom.get_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues",
                                             c["queue"], _request_timeout=20)
            st.queue = True
        except ApiException as exc:
            st.queue = False if exc.status == 404 else None
        try:
            pvc: Any = core.read_namespaced_persistent_volume_claim(
                c["pvc"], c["namespace"], _preload_content=False, _request_timeout=20)
            st.claim_phase = json.loads(pvc.data).get("status", {}).get("phase")
        except ApiException as exc:
            st.claim_phase = "missing" if exc.status == 404 else None


def gather(plan: LoadedPlan, *, kubeconfig: str | None = None, context: str | None = None,
           kube: bool = True) -> Status:
    c, region = plan.cluster, plan.cluster["region"]
    st = Status(cluster=aws.eks_cluster(region, c["name"]))
    stack = aws.stack(region, c["stack"])
    st.stack_status = stack.get("StackStatus") if stack else None
    st.repository = aws.ecr_repository(region, c["image_repository"])
    if st.repository:
        st.image_tags = aws.ecr_image_tags(region, c["image_repository"])
        digest = aws.ecr_image_digest(region, c["image_repository"], c["image_tag"])
        st.image = f"{st.repository}@{digest}" if digest else None
    if st.cluster is None:
        st.file_systems = aws.file_systems(region, c["name"])  # left behind by a cluster now gone
        return st
    st.nodegroups = aws.eks_nodegroups(region, c["name"])
    st.file_systems = aws.file_systems(region, c["name"], st.cluster.get("resourcesVpcConfig", {}).get("vpcId"))
    if kube and st.cluster.get("status") == "ACTIVE":
        _kube(plan, st, kubeconfig, context)
    return st
