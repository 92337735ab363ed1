"""eksctl ClusterConfig files (eksctl.io/v1alpha5): the cluster, the accelerator node group, IRSA.

Three files, one per eksctl command, because their inputs exist at different times:

- `cluster.yaml` (`eksctl create cluster`): control plane, OIDC (for IRSA), the zones, and a
  small system node group for the add-ons. The tutorial ran Volcano, etcd and the CSI
  controller on the training nodes, next to the jobs; here the accelerator nodes are tainted
  and only jobs (and the per-node daemons) run there.
- `nodegroup.yaml` (`eksctl create nodegroup`): the managed accelerator node group, made from
  the CloudFormation stack's launch template. The launch template ID and the node role ARN
  exist only once that stack does, so the file holds the placeholders @LAUNCH_TEMPLATE_ID@
  and @NODE_ROLE_ARN@, which runbook.sh fills in from the stack's outputs just before use.
  `efaEnabled` is false on purpose: the launch template already carries the EFA interfaces,
  the placement group and the EFA security group, and with `efaEnabled: true` eksctl installs
  its own, unpinned EFA device plugin DaemonSet (named like the pinned Helm chart's, so the
  chart's install then fails). One zone, private subnets, min = desired = max = nodes.
- `fsx-irsa.yaml` (`eksctl create iamserviceaccount`): the FSx CSI controller's service
  account with an IAM role through IRSA and the driver's documented policy, not
  AmazonFSxFullAccess.
- `s3-irsa.yaml` (`eksctl create iamserviceaccount`, with cluster.data_buckets): the service
  account `data stage` runs its pod with (config.S3_READER, in the job's namespace), whose role
  may list and read those buckets and nothing else. Pods cannot reach the node's instance
  metadata (hop limit 1, cloudformation.py), so without it nothing gave them S3 credentials.
"""

from __future__ import annotations

from typing import Any

from trainmaster.cluster import versions
from trainmaster.cluster.addons import NPD_SERVICE_ACCOUNT
from trainmaster.cluster.spec import ROLE_LABEL, SYSTEM_INSTANCE_TYPE, SYSTEM_NODES, ClusterSpec
from trainmaster.config import S3_READER

API_VERSION = "eksctl.io/v1alpha5"
LAUNCH_TEMPLATE_ID = "@LAUNCH_TEMPLATE_ID@"
NODE_ROLE_ARN = "@NODE_ROLE_ARN@"
FSX_SERVICE_ACCOUNT = "fsx-csi-controller-sa"
FSX_NAMESPACE = "kube-system"

# kubernetes-sigs/aws-fsx-csi-driver docs/install.md, less what only S3-linked file systems
# need (the s3.data-source service-linked role, s3:ListBucket): our StorageClass links none.
FSX_CSI_POLICY: dict[str, Any] = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Action": "iam:CreateServiceLinkedRole",
            "Resource": "*",
            "Condition": {"StringLike": {"iam:AWSServiceName": ["fsx.amazonaws.com"]}},
        },
        {
            "Effect": "Allow",
            "Action": [
                "fsx:CreateFileSystem",
                "fsx:DeleteFileSystem",
                "fsx:DescribeFileSystems",
                "fsx:TagResource",
                "fsx:UpdateFileSystem",
            ],
            "Resource": ["*"],
        },
    ],
}


def _base(spec: ClusterSpec) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterConfig",
        "metadata": {
            "name": spec.name,
            "region": spec.region,
            "version": spec.kubernetes_version,
            "tags": {"trainmaster.io/cluster": spec.name},
        },
        "iam": {"withOIDC": True},
        "availabilityZones": list(spec.zones),
    }


def cluster_config(spec: ClusterSpec) -> dict[str, Any]:
    """`eksctl create cluster -f`: control plane + the system node group."""
    cfg = _base(spec)
    cfg["managedNodeGroups"] = [
        {
            "name": spec.system_nodegroup,
            "instanceType": SYSTEM_INSTANCE_TYPE,
            "amiFamily": "AmazonLinux2023",
            "minSize": SYSTEM_NODES,
            "desiredCapacity": SYSTEM_NODES,
            "maxSize": SYSTEM_NODES + 1,
            "privateNetworking": True,
            "volumeSize": 100,
            "volumeEncrypted": True,
            "disableIMDSv1": True,
            # no pod (but host-network ones) may use the node role: the add-ons here need no AWS
            # credentials but the FSx CSI controller's, which come through IRSA (fsx-irsa.yaml)
            "disablePodIMDS": True,
            "labels": {ROLE_LABEL: "system"},
            "tags": {"trainmaster.io/cluster": spec.name},
            "nodeRepairConfig": {"enabled": True},
        }
    ]
    # The API endpoint: public only to the job file's CIDRs (default: the planning machine's /32;
    # eksctl's default is 0.0.0.0/0), and private too, so nodes reach it inside the VPC. eksctl
    # cannot create a private-only one (spec.py). Fields: eksctl schema ClusterVPC.publicAccessCIDRs,
    # ClusterEndpoints (https://docs.aws.amazon.com/eks/latest/eksctl/vpc-cluster-access.html).
    cfg["vpc"] = {
        "clusterEndpoints": {"privateAccess": True, "publicAccess": True},
        "publicAccessCIDRs": list(spec.public_access_cidrs),
    }
    # The VPC CNI's network policy agent enforces the NetworkPolicy around etcd; without it
    # Kubernetes accepts the policy and nothing enforces it. configurationValues is a JSON string
    # (eksctl schema Addon.configurationValues); the key: "enableNetworkPolicy": "true", VPC CNI
    # 1.14+ on EKS 1.25+ (https://docs.aws.amazon.com/eks/latest/userguide/calico.html, "Configure
    # your cluster for Kubernetes network policies"; aws.amazon.com/blogs/containers/
    # amazon-vpc-cni-now-supports-kubernetes-network-policies/).
    # The node monitoring agent sets NodeConditions (AcceleratedHardwareReady: NVIDIA XID and DCGM,
    # Neuron errors; kernel, network, storage, runtime) that the node groups' auto repair acts
    # on (https://docs.aws.amazon.com/eks/latest/userguide/node-health.html). Its version is EKS's
    # default for the cluster version (versions.NODE_MONITORING_ADDON).
    cfg["addons"] = [
        {"name": "vpc-cni", "configurationValues": '{"enableNetworkPolicy": "true"}'},
        {"name": versions.NODE_MONITORING_ADDON},
    ]
    # who did what to the cluster (the tutorial kept no trail); the noisy api log stays off
    cfg["cloudWatch"] = {"clusterLogging": {"enableTypes": ["audit", "authenticator"]}}
    return cfg


def nodegroup_config(spec: ClusterSpec) -> dict[str, Any]:
    """`eksctl create nodegroup -f` (after the placeholders are filled in)."""
    cfg = _base(spec)
    cfg["managedNodeGroups"] = [
        {
            "name": spec.nodegroup,
            "launchTemplate": {"id": LAUNCH_TEMPLATE_ID},
            "iam": {"instanceRoleARN": NODE_ROLE_ARN},
            "minSize": spec.nodes,
            "desiredCapacity": spec.nodes,
            "maxSize": spec.nodes,
            "availabilityZones": [spec.accelerator_zone],
            "privateNetworking": True,
            "efaEnabled": False,
            "labels": spec.accelerator_labels,
            "taints": [{"key": spec.taint_key, "value": "true", "effect": "NoSchedule"}],
            "tags": {"trainmaster.io/cluster": spec.name},
            # EKS replaces or reboots a node the node monitoring agent reports unhealthy (GPU:
            # NVIDIA XID/DCGM, Neuron: device errors); eksctl schema NodeGroupNodeRepairConfig,
            # https://docs.aws.amazon.com/eks/latest/userguide/node-health.html. The job's pod on
            # it is lost and Volcano restarts the gang (node-loss handling).
            "nodeRepairConfig": {"enabled": True},
        }
    ]
    if spec.spot:
        # capacityType SPOT (eksctl schema ManagedNodeGroup.spot). The instance type stays the
        # launch template's. EKS turns on Capacity Rebalancing for a Spot node group and drains
        # a node at its rebalance recommendation or interruption notice (cordon, then evict):
        # the pods' SIGTERM, after which the trainer saves and leaves within
        # kubernetes.stop_grace_s, and Volcano restarts the gang. Nothing else to install.
        # https://docs.aws.amazon.com/eks/latest/userguide/managed-node-groups.html (capacity types)
        cfg["managedNodeGroups"][0]["spot"] = True
    if spec.capacity_block:
        # EKS creates a Capacity Block node group only with capacityType CAPACITY_BLOCK, from a
        # launch template that targets the block (cloudformation.py does); eksctl's field for it
        # is the node group's instanceMarketOptions (schema ManagedNodeGroup.instanceMarketOptions).
        # https://docs.aws.amazon.com/eks/latest/userguide/capacity-blocks-mng.html
        # eksctl (since 0.205.0) refuses instanceMarketOptions without capacityReservation:
        # "instanceMarketOptions cannot be set without capacityReservation" (eksctl
        # pkg/apis/eksctl.io/v1alpha5/validation.go, validateNodeGroupBase). With our own launch
        # template eksctl only validates it; the template targets the block itself.
        ng = cfg["managedNodeGroups"][0]
        ng["capacityReservation"] = {
            "capacityReservationTarget": {"capacityReservationID": spec.capacity_reservation_id}
        }
        ng["instanceMarketOptions"] = {"marketType": "capacity-block"}
    return cfg


def fsx_irsa_config(spec: ClusterSpec) -> dict[str, Any]:
    """`eksctl create iamserviceaccount -f`: the FSx CSI controller's role (IRSA)."""
    cfg = _base(spec)
    cfg["iam"]["serviceAccounts"] = [
        {
            "metadata": {"name": FSX_SERVICE_ACCOUNT, "namespace": FSX_NAMESPACE},
            "roleName": spec.fsx_role_name,
            "attachPolicy": FSX_CSI_POLICY,
        }
    ]
    return cfg


# Neuron's node problem detector and recovery (addons.neuron_values): the IAM policy and IRSA of
# aws-neuron-sdk deploy/infrastructure/problem-detector-irsa.rst, for the node group's Auto
# Scaling group, which exists only once the node group does (runbook placeholders).
NODE_ASG_ARN = "@NODE_ASG_ARN@"
NODE_ASG_NAME = "@NODE_ASG_NAME@"


def npd_policy() -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Action": [
                    "autoscaling:SetInstanceHealth",
                    "autoscaling:DescribeAutoScalingInstances",
                ],
                "Effect": "Allow",
                "Resource": NODE_ASG_ARN,
            },
            {
                "Action": ["ec2:DescribeInstances"],
                "Effect": "Allow",
                "Resource": "*",
                "Condition": {
                    "ForAllValues:StringEquals": {
                        "ec2:ResourceTag/aws:autoscaling:groupName": NODE_ASG_NAME
                    }
                },
            },
            {
                "Action": ["cloudwatch:PutMetricData"],
                "Effect": "Allow",
                "Resource": "*",
                "Condition": {"StringEquals": {"cloudwatch:Namespace": "NeuronHealthCheck"}},
            },
        ],
    }


def npd_irsa_config(spec: ClusterSpec) -> dict[str, Any]:
    """`eksctl create iamserviceaccount -f`: the Neuron NPD's service account (Neuron nodes)."""
    cfg = _base(spec)
    cfg["iam"]["serviceAccounts"] = [
        {
            "metadata": {"name": NPD_SERVICE_ACCOUNT, "namespace": versions.NEURON_NPD_NAMESPACE},
            "roleName": f"{spec.name}-neuron-npd"[:64],
            "attachPolicy": npd_policy(),
        }
    ]
    return cfg


def s3_read_policy(buckets: tuple[str, ...]) -> dict[str, Any]:
    """List and read the buckets, nothing else (what `s3 sync` and `s3 cp URL -` call)."""
    arns = [f"arn:aws:s3:::{b}" for b in buckets]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": arns},
            {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [f"{a}/*" for a in arns]},
        ],
    }


def s3_irsa_config(spec: ClusterSpec) -> dict[str, Any]:
    """`eksctl create iamserviceaccount -f`: `data stage`'s S3 reader (IRSA; eksctl creates the
    namespace when it is missing). Only with cluster.data_buckets."""
    cfg = _base(spec)
    cfg["iam"]["serviceAccounts"] = [
        {
            "metadata": {"name": S3_READER, "namespace": spec.namespace},
            "roleName": spec.s3_role_name,
            "attachPolicy": s3_read_policy(spec.data_buckets),
        }
    ]
    return cfg
