"""The resolved cluster: every name and number the plan's files share, checked once.

The job file's [cluster] section says what is wanted (name, region, version, type, nodes,
zones); this module fills in the defaults (type from kubernetes.instance_type, nodes from
job.nnodes, zones from an AWS look-up), derives the names of everything the plan creates, and
refuses, with the field to change, what AWS or EKS would refuse later and slower.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

from trainmaster import __version__, catalog
from trainmaster.cluster import eks_versions
from trainmaster.config import JobConfig
from trainmaster.errors import ConfigError
from trainmaster.naming import is_dns1123_label, is_dns1123_subdomain

# Derived IAM role names ("<cluster>-fsx-csi", 64 at most) and CloudFormation stack names
# ("eksctl-<cluster>-nodegroup-<group>", 128) must fit: 40 characters leave room for both.
CLUSTER_NAME_MAX = 40
_CLUSTER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]*[A-Za-z0-9]$|^[A-Za-z]$")
SYSTEM_INSTANCE_TYPE = "m6i.large"  # add-ons: Volcano, etcd, FSx CSI controller, TensorBoard
SYSTEM_NODES = 2
ROLE_LABEL = "trainmaster.io/role"  # "system" or "accelerator" on every node
ECR_REPOSITORY = "trainmaster"
STORAGE_CLASS = "fsx-sc"
CLAIM_SIZE = "1200Gi"  # the smallest FSx for Lustre file system (1.2 TiB)

# EC2 resource ids: the prefix and 8 (older) or 17 hexadecimal digits, e.g. cr-0123456789abcdef0.
_CAPACITY_ID = re.compile(r"^cr-(?:[0-9a-f]{8}|[0-9a-f]{17})$")
CHECKIP_URL = "https://checkip.amazonaws.com"  # AWS's what-is-my-IP service: answers "a.b.c.d\n"
# eksctl cannot create a cluster whose endpoint is private only ("it prevents eksctl from being
# able to join the worker nodes to the cluster": https://docs.aws.amazon.com/eks/latest/eksctl/
# vpc-cluster-access.html), so the plan always has a public endpoint, open to named CIDRs only.
PRIVATE_LATER = (
    "to make the endpoint private only once the cluster is up, run `eksctl utils "
    "update-cluster-endpoints --cluster NAME --private-access=true "
    "--public-access=false --approve` (then kubectl works from inside the VPC only)"
)

ZoneLookup = Callable[[str, str], list[str]]
CidrLookup = Callable[[], str | None]


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    region: str
    kubernetes_version: str
    instance: catalog.InstanceType
    nodes: int
    zones: tuple[str, ...]  # the cluster's; zones[0] is the accelerator node group's
    namespace: str
    queue: str
    pvc: str
    mount: str
    image_repository: str = ECR_REPOSITORY
    image_tag: str = ""
    # who may reach the public API endpoint (never 0.0.0.0/0); endpoint_note tells the user
    public_access_cidrs: tuple[str, ...] = ()
    endpoint_note: str = ""
    capacity_reservation_id: str | None = None  # an ODCR or, with capacity_block, a Capacity Block
    capacity_block: bool = False
    spot: bool = False  # the accelerator node group on EC2 Spot (eksctl `spot: true`)
    queue_weight: int = 1
    queue_capability: tuple[tuple[str, str], ...] = ()  # kubernetes.queue_capability, in order
    workspace: str | None = (
        None  # kubernetes.workspace: image/Dockerfile.workspace (cluster/image.py)
    )
    data_buckets: tuple[str, ...] = ()
    results_bucket: str | None = (
        None  # cluster.results_bucket: runs/ exported to S3 (servicesteps.py)  # cluster.data_buckets: read by `data stage` (IRSA)
    )
    service_account: str = "default"  # the training pods' (kubernetes.service_account): nodeguard
    monitoring: bool = False  # cluster.monitoring: Prometheus, Grafana, exporters (monitoring.py)

    @property
    def accelerator_zone(self) -> str:
        return self.zones[0]

    @property
    def flavour(self) -> str:
        """Training-image flavour: neuron, cuda or cpu."""
        return _flavour(self.instance)

    @property
    def nodegroup(self) -> str:
        return self.instance.name.replace(".", "-")  # trn1.32xlarge -> trn1-32xlarge

    @property
    def system_nodegroup(self) -> str:
        return "system"

    @property
    def stack_name(self) -> str:
        return f"{self.name}-accelerator-nodes"

    @property
    def fsx_role_name(self) -> str:
        return f"{self.name}-fsx-csi"

    @property
    def s3_role_name(self) -> str:
        return f"{self.name}-s3-read"

    @property
    def taint_key(self) -> str:
        resource = self.instance.device_resource
        assert resource is not None  # checked in resolve()
        return resource

    @property
    def efa(self) -> bool:
        return self.instance.efa_interfaces > 0

    @property
    def accelerator_labels(self) -> dict[str, str]:
        labels = {ROLE_LABEL: "accelerator"}
        if self.instance.device_kind == "cuda":
            # the NVIDIA device plugin chart's default node affinity (no NFD on EKS)
            labels["nvidia.com/gpu.present"] = "true"
        return labels


def _check_name(name: str) -> None:
    if len(name) > CLUSTER_NAME_MAX:
        raise ConfigError(
            f"{name!r} has {len(name)} characters; use at most {CLUSTER_NAME_MAX} "
            "(IAM role and CloudFormation stack names are derived from it)",
            where="cluster.name",
        )
    if not _CLUSTER_NAME.match(name) or "--" in name:
        raise ConfigError(
            f"{name!r} is not a valid EKS cluster name: start with a letter, then "
            "letters, digits and single '-', ending with a letter or digit",
            where="cluster.name",
        )


def _check_zones(zones: list[str], region: str) -> None:
    for zone in zones:
        if not re.fullmatch(rf"{re.escape(region)}[a-z]", zone):
            raise ConfigError(
                f"{zone!r} is not an availability zone of {region} (e.g. {region}a)",
                where="cluster.zones",
            )
    if len(set(zones)) != len(zones):
        raise ConfigError("a zone is listed twice", where="cluster.zones")
    if len(zones) < 2:
        raise ConfigError(
            "EKS needs at least two zones; list two or more (the first one holds "
            "the accelerator nodes), or leave it empty to look them up",
            where="cluster.zones",
        )


def _check_cidrs(cidrs: list[str]) -> tuple[str, ...]:
    """EKS takes IPv4 CIDR blocks only (CreateCluster VpcConfigRequest.publicAccessCidrs:
    https://docs.aws.amazon.com/eks/latest/APIReference/API_VpcConfigRequest.html)."""
    out: list[str] = []
    for cidr in cidrs:
        try:
            net = ipaddress.IPv4Network(cidr, strict=True)
        except ValueError as exc:
            raise ConfigError(
                f"{cidr!r} is not an IPv4 CIDR block ({exc}), e.g. 203.0.113.7/32",
                where="cluster.public_access_cidrs",
            ) from exc
        if net.prefixlen == 0:
            raise ConfigError(
                "0.0.0.0/0 opens the API endpoint to the whole internet; list the "
                "networks you work from",
                where="cluster.public_access_cidrs",
            )
        out.append(str(net))
    if len(set(out)) != len(out):
        raise ConfigError("a CIDR is listed twice", where="cluster.public_access_cidrs")
    return tuple(out)


def caller_cidr() -> str | None:
    """The planning machine's public IPv4 address as a /32, or None when it cannot be learnt
    (offline, a proxy that refuses it): then the job file must name the CIDRs."""
    import urllib.request

    try:
        with urllib.request.urlopen(CHECKIP_URL, timeout=5) as answer:  # noqa: S310 (fixed https URL)
            text = answer.read(64).decode("ascii", "replace").strip()
        return f"{ipaddress.IPv4Address(text)}/32"
    except (OSError, ValueError):
        return None


def _endpoint_access(cidrs: list[str] | None, lookup: CidrLookup) -> tuple[tuple[str, ...], str]:
    """The CIDRs that may reach the public API endpoint, and a line for the user about them."""
    if cidrs is not None:
        checked = _check_cidrs(cidrs)
        if not checked:
            raise ConfigError(
                "eksctl cannot create a cluster with a private-only API endpoint; "
                f"list the CIDRs you work from ({PRIVATE_LATER})",
                where="cluster.public_access_cidrs",
            )
        return checked, ""
    found = lookup()
    if found is None:
        raise ConfigError(
            f"could not learn this machine's public IP ({CHECKIP_URL}) to open the "
            "EKS API endpoint to it alone; list the CIDRs you work from, e.g. "
            '["203.0.113.7/32"]',
            where="cluster.public_access_cidrs",
        )
    return (found,), (
        f"the EKS API endpoint is public to {found} only (this machine's address); "
        f"set cluster.public_access_cidrs for other networks; {PRIVATE_LATER}"
    )


def _check_capability(cap: dict[str, str], inst: catalog.InstanceType, gang: int) -> None:
    """A queue capped below one gang's devices never runs the job: Volcano keeps it Pending.
    Checked for the node's devices and EFA interfaces (whole numbers); cpu and memory caps
    depend on the pod sizes of the Kubernetes backend and are left to Volcano."""
    need = {inst.device_resource: inst.devices, catalog.EFA: inst.efa_interfaces}
    for resource, per_node in need.items():
        value = cap.get(resource or "")
        if value is None or not per_node:
            continue
        if not value.isdigit():
            raise ConfigError(f"{resource}: {value!r} is not a whole number of devices",
                              where="kubernetes.queue_capability")  # fmt: skip
        if int(value) < per_node * gang:
            raise ConfigError(
                f"{resource} {value} is less than one gang of this job needs "
                f"({gang} x {per_node}); Volcano would keep the job Pending",
                where="kubernetes.queue_capability",
            )


def _capacity(reservation: str | None, block: str | None) -> tuple[str | None, bool]:
    if reservation is not None and block is not None:
        raise ConfigError(
            "set either cluster.capacity_reservation_id or cluster.capacity_block_id, not both",
            where="cluster.capacity_block_id",
        )
    for field, value in (
        ("cluster.capacity_reservation_id", reservation),
        ("cluster.capacity_block_id", block),
    ):
        if value is not None and not _CAPACITY_ID.match(value):
            raise ConfigError(
                f"{value!r} is not a capacity reservation id (cr- and 17 hexadecimal "
                "digits, e.g. cr-0123456789abcdef0)",
                where=field,
            )
    return (block, True) if block is not None else (reservation, False)


def lookup_zones(region: str, instance_type: str) -> list[str]:
    """The accelerator zone (offered there, first by name), then a second zone for EKS."""
    from trainmaster.cluster import aws
    from trainmaster.errors import UserError

    try:
        offered = aws.offered_zones(region, instance_type)
        usable = aws.usable_zones(region)
        system = set(aws.offered_zones(region, SYSTEM_INSTANCE_TYPE))
    except UserError as exc:
        raise UserError(f"{exc} (or list the zones in cluster.zones to plan without AWS)") from exc
    candidates = [z for z in offered if z in usable]
    if not candidates:
        raise ConfigError(
            f"{instance_type} is not offered in {region}; pick a region that offers "
            "it (e.g. us-east-1, us-west-2 for Trainium) or another instance type",
            where="cluster.region",
        )
    first = candidates[0]
    others = [z for z in usable if z != first and z in system]
    if not others:
        raise ConfigError(
            f"{region} has no second zone for the EKS control plane; pick another region",
            where="cluster.region",
        )
    # Prefer a second zone that also offers the type (room to move the node group later).
    others.sort(key=lambda z: (z not in offered, z))
    return [first, others[0]]


def resolve(
    cfg: JobConfig, zone_lookup: ZoneLookup | None = None, cidr_lookup: CidrLookup | None = None
) -> ClusterSpec:
    """Defaults filled in, names derived, bad input refused (ConfigError naming the field)."""
    c, k = cfg.cluster, cfg.kubernetes
    _check_name(c.name)
    eks_versions.check(c.kubernetes_version)  # standard or extended support today, else refused
    type_field = "cluster.instance_type" if c.instance_type else "kubernetes.instance_type"
    inst = catalog.get(c.instance_type or k.instance_type, where=type_field)
    if inst.device_resource is None:
        raise ConfigError(
            f"{inst.name!r} is not an accelerator instance type; use one of "
            f"{', '.join(n for n, t in catalog.CATALOG.items() if t.devices)}",
            where=type_field,
        )
    nodes = c.nodes if c.nodes is not None else cfg.job.nnodes
    if nodes < 1:
        raise ConfigError(f"{nodes} nodes; a cluster needs at least 1", where="cluster.nodes")
    if nodes < cfg.job.nnodes:
        raise ConfigError(
            f"{nodes} nodes, but the job needs job.nnodes = {cfg.job.nnodes}: "
            "Volcano would never schedule its gang",
            where="cluster.nodes",
        )
    for field, value in (("kubernetes.queue", k.queue), ("kubernetes.pvc", k.pvc)):
        if not is_dns1123_subdomain(value):
            raise ConfigError(
                f"{value!r} is not a valid Kubernetes name (lower-case letters, "
                "digits, '-' and '.')",
                where=field,
            )
    if not is_dns1123_label(k.namespace):
        raise ConfigError(f"{k.namespace!r} is not a valid namespace", where="kubernetes.namespace")
    if not PurePosixPath(k.mount).is_absolute():
        raise ConfigError(f"{k.mount!r} is not an absolute path", where="kubernetes.mount")
    if c.zones:
        _check_zones(list(c.zones), c.region)
        zones = list(c.zones)
    else:
        zones = (zone_lookup or lookup_zones)(c.region, inst.name)
    capacity_id, block = _capacity(c.capacity_reservation_id, c.capacity_block_id)
    if c.spot and capacity_id is not None:
        # a reservation or a block is capacity bought ahead; Spot is capacity EC2 can take back
        raise ConfigError(
            "cluster.spot runs the nodes on Spot capacity, which a capacity reservation or "
            "block is not; drop one of them",
            where="cluster.spot",
        )
    cidrs, note = _endpoint_access(c.public_access_cidrs, cidr_lookup or caller_cidr)
    repo, tag = image_reference(k.image, c.region, _flavour(inst))
    _check_capability(k.queue_capability, inst, cfg.job.min_nnodes or cfg.job.nnodes)
    return ClusterSpec(
        name=c.name,
        region=c.region,
        kubernetes_version=c.kubernetes_version,
        instance=inst,
        nodes=nodes,
        zones=tuple(zones),
        namespace=k.namespace,
        service_account=k.service_account or "default",
        queue=k.queue,
        queue_weight=k.queue_weight,
        queue_capability=tuple(k.queue_capability.items()),
        pvc=k.pvc,
        mount=k.mount,
        image_repository=repo,
        image_tag=tag,
        public_access_cidrs=cidrs,
        endpoint_note=note,
        capacity_reservation_id=capacity_id,
        capacity_block=block,
        spot=c.spot,
        workspace=k.workspace,
        data_buckets=tuple(c.data_buckets),
        results_bucket=c.results_bucket,
        monitoring=c.monitoring,
    )


def _flavour(inst: catalog.InstanceType) -> str:
    # trn1: the frozen PyTorch/XLA DLC; Trn2/Trn3: TorchNeuron (cluster/versions.py)
    return {"xla": "neuron", "neuron": "torchneuron", "cuda": "cuda", "cpu": "cpu"}[
        inst.device_kind
    ]


def image_reference(image: str | None, region: str, flavour: str) -> tuple[str, str]:
    """ECR repository and tag to push: those of kubernetes.image when it names this region's
    ECR, else `trainmaster:<version>-<flavour>`."""
    default = (ECR_REPOSITORY, f"{__version__}-{flavour}")
    if not image:
        return default
    m = re.fullmatch(
        rf"\d{{12}}\.dkr\.ecr\.{re.escape(region)}\.amazonaws\.com/([a-z0-9._/-]+):([\w.-]+)", image
    )
    return (m.group(1), m.group(2)) if m else default
