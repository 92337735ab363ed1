"""`cluster status`: what of the plan exists, from AWS (boto3) and the cluster (kubernetes client).

The answer users of the tutorial needed most is per node: does it offer its accelerators and EFA
interfaces (allocatable aws.amazon.com/neuron, vpc.amazonaws.com/efa, nvidia.com/gpu)? A job
that asks for them on a node whose device plugin is missing waits forever in Pending
("Insufficient aws.amazon.com/neuron", docs/architecture.md 5: tutorial 6.5). AWS answers come
first; the cluster's only when it is ACTIVE (backends/kubernetes/clusterinfo.py), and a failure
to reach it is reported, not raised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainmaster import catalog
from trainmaster.cluster import aws, nodeguard
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
    ready = nodeguard.ready_condition(status.get("conditions"))[0] == "True"
    alloc = status.get("allocatable", {}) or {}
    return Node(
        name=meta.get("name", "?"),
        instance_type=labels.get("node.kubernetes.io/instance-type", "?"),
        zone=labels.get("topology.kubernetes.io/zone", "?"),
        role=labels.get(ROLE_LABEL, "-"),
        ready=ready,
        allocatable={r: str(alloc[r]) for r in RESOURCES if r in alloc},
    )


def gather(plan: LoadedPlan, kube: Callable[[LoadedPlan, Status], None] | None = None) -> Status:
    """AWS first; then, once the cluster is ACTIVE, `kube` fills in what the cluster itself says
    (the Kubernetes backend's clusterinfo.fill: this layer does not talk to Kubernetes)."""
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
    st.file_systems = aws.file_systems(
        region, c["name"], st.cluster.get("resourcesVpcConfig", {}).get("vpcId")
    )
    if kube is not None and st.cluster.get("status") == "ACTIVE":
        kube(plan, st)
    return st
