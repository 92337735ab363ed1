"""The job file's [kubernetes] and [cluster] sections: where a cluster job runs, and the EKS
cluster `cluster plan` makes for it (docs/architecture.md 3.2). Part of JobConfig (config/job.py)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from trainmaster.config.base import (
    S3_BUCKET,
    S3_READER,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Section,
)


class KubernetesSection(Section):
    namespace: str = Field(
        "default",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="namespace of the Volcano Job",
    )
    queue: str = Field(
        "trainmaster", min_length=1, description="Volcano queue (created by `cluster up`)"
    )
    image: str | None = Field(
        None,
        description="training image, e.g. ACCOUNT.dkr.ecr.REGION.amazonaws.com/trainmaster:TAG",
    )
    instance_type: str = Field(
        "trn1.32xlarge", description="node type the pods run on (see the catalog)"
    )
    pvc: str = Field("fsx-claim", description="PersistentVolumeClaim of the shared storage")
    mount: str = Field("/data", description="where the shared storage is mounted in the pods")
    tolerations: list[dict[str, str]] = Field(
        default_factory=list, description="extra tolerations (device taints are added for you)"
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="extra node labels to match"
    )
    node_lost_after_s: PositiveInt = Field(
        60,
        description="seconds a training pod stays bound to a node that stopped answering (NotReady or unreachable) before it is evicted and Volcano restarts the gang elsewhere (Kubernetes' default: 300); trainmaster's node watcher then takes the node out of service, so pods the node cannot confirm gone do not hold the gang",
    )
    peer_lost_after_s: NonNegativeInt = Field(
        10,
        description="seconds the pods of a multi-node job wait for a node whose heartbeat on the shared storage stopped while the job made no progress, before they end their command (a fixed-size job's pods, so that Volcano restarts the gang at once, well before Kubernetes says the node is NotReady; an elastic job's workers, which go on without it): run/peers.py; 0: off",
    )
    stop_grace_s: PositiveInt = Field(
        90,
        description="seconds a training pod has after SIGTERM (a drain, a Spot notice, an eviction, `cancel`) to checkpoint its current step and leave before it is killed: the pod's terminationGracePeriodSeconds (Kubernetes' default: 30); with cluster.spot it must stay under the two-minute notice",
    )
    cpu: PositiveFloat | None = Field(
        None,
        description="CPUs of a training container (requests = limits); unset: the whole node of kubernetes.instance_type less what the node reserves, as the catalog gives it; set it for a node type smaller than the catalog's (e.g. the generic `cpu` type, 32 vCPU)",
    )
    memory_gib: PositiveInt | None = Field(
        None,
        description="memory of a training container in GiB (requests = limits; /dev/shm is an eighth of it); unset: the node's, as for cpu",
    )
    service_account: str | None = Field(None, description="service account of the pods")
    priority_class: str | None = Field(
        None,
        description="PriorityClass of the Volcano Job and its pods (it must exist: kubectl create priorityclass NAME --value N); Volcano orders and preempts jobs by it",
    )
    queue_weight: PositiveInt = Field(
        1,
        description="the Volcano queue's weight (`cluster plan`): its share of the cluster against other queues",
    )
    queue_capability: dict[str, str] = Field(
        default_factory=dict,
        description='the most the Volcano queue may hold, e.g. { "aws.amazon.com/neuron" = "64" } (`cluster plan`); empty: no cap',
    )
    workspace: str | None = Field(
        None,
        description="your code for a custom job.entrypoint: this local folder is built into an image FROM the training image (COPY to /workspace; `cluster plan` writes image/Dockerfile.workspace), pushed, and named in kubernetes.image; nothing is copied into pods at run time",
    )


class ClusterSection(Section):
    name: str = Field(
        "trainmaster", pattern=r"^[A-Za-z][A-Za-z0-9-]{0,99}$", description="EKS cluster name"
    )
    region: str = Field("us-west-2", pattern=r"^[a-z]{2}(-[a-z]+)+-\d$", description="AWS region")
    kubernetes_version: str = Field(
        # the newest in EKS standard support with Neuron and NVIDIA AL2023 AMIs (checked
        # 2026-12-06; cluster/eks_versions.py, whose test keeps the two equal)
        "1.36",
        pattern=r"^1\.\d+$",
        description="EKS Kubernetes version (standard or extended support)",
    )
    instance_type: str | None = Field(
        None, description="accelerator node type; unset = kubernetes.instance_type"
    )
    nodes: PositiveInt | None = Field(None, description="accelerator nodes; unset = job.nnodes")
    zones: list[str] = Field(
        default_factory=list,
        description="availability zones; empty = looked up where the type is offered",
    )
    price_per_hour: PositiveFloat | None = Field(
        None, description="override the catalog's on-demand price (USD per node-hour)"
    )
    public_access_cidrs: list[str] | None = Field(
        None,
        description="CIDRs that may reach the EKS API endpoint; unset = this machine's public IP/32, looked up by `cluster plan`",
    )
    capacity_reservation_id: str | None = Field(
        None,
        description="On-Demand Capacity Reservation (cr-...) the accelerator nodes launch into",
    )
    capacity_block_id: str | None = Field(
        None, description="Capacity Block for ML (cr-...) the accelerator nodes launch into"
    )
    spot: bool = Field(
        False,
        description="the accelerator node group runs on EC2 Spot (eksctl's `spot: true`): cheaper, but a node can be reclaimed with a two-minute notice. EKS drains a managed node at the notice (and at a rebalance recommendation), the pods checkpoint and leave within kubernetes.stop_grace_s, and Volcano restarts the gang on nodes left or new; `estimate --spot` prices it; not with capacity_reservation_id or capacity_block_id",
    )
    data_buckets: list[str] = Field(
        default_factory=list,
        description=f"S3 buckets `data stage` reads: `cluster plan` gives the service account {S3_READER} read-only access to them (IRSA), and `data stage` uses it",
    )

    results_bucket: str | None = Field(
        None,
        pattern=S3_BUCKET,
        description="S3 bucket (in cluster.region) that keeps the runs: `cluster plan` links runs/ on the FSx file system to s3://BUCKET/CLUSTER/runs/ (a data repository association exporting every change), and `cluster down` exports once more before it deletes the file system; unset: `cluster down` needs --discard-data",
    )

    monitoring: bool = Field(
        False,
        description="`cluster plan` adds the monitoring stack: kube-prometheus-stack (Prometheus, Grafana, Alertmanager), a PodMonitor for every job's /metrics, alert rules, the job dashboard, and the device exporter (neuron-monitor or NVIDIA's dcgm-exporter)",
    )

    @field_validator("data_buckets")
    @classmethod
    def _buckets(cls, value: list[str]) -> list[str]:
        for bucket in value:
            if not re.fullmatch(S3_BUCKET, bucket):
                raise ValueError(f"{bucket!r} is not an S3 bucket name (3-63 of a-z 0-9 . -)")
        return value
