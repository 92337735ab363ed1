"""The accelerator nodes' CloudFormation template: launch template, EFA, security groups, role.

What eksctl cannot express for a managed node group is here (as in the tutorial's
cfn/eks_*_ng_stack.yaml), with its faults fixed:

- One launch template for the plan's instance type, with one EFA interface per network card,
  laid out as AWS documents it: card 0 device 0 (the primary interface), every other card
  device 1. trn1.32xlarge 8 cards, trn1n/trn2 16, p5 32 (the catalog's efa_interfaces).
- A cluster placement group (none with a capacity reservation: _placement_group); the node
  security group with the all-traffic rules *to and from itself* that EFA's OS-bypass
  traffic needs (CIDR rules do not match it). No SSH from
  0.0.0.0/0: nodes are reached with SSM Session Manager (AmazonSSMManagedInstanceCore on the
  node role). Every interface also joins the EKS cluster security group, which the control
  plane and the system node group use, so jobs reach CoreDNS, etcd and the API server.
- The Lustre security group: TCP 988 and 1018-1023 (FSx for Lustre's ports; the tutorial
  opened only 988) from itself, the node group and the cluster security group, and back.
- The node role for the managed node group (EKS makes its instance profile: a launch template
  of a managed node group may not name one, so the template has none).
- IMDSv2 only (HttpTokens required) with hop limit 1: a pod's request crosses one more hop and
  is dropped, so pods cannot take the node role's credentials. Host-network daemons (VPC CNI,
  kubelet's image pulls) still reach it; what pods need from AWS they get through IRSA (the FSx
  CSI controller's role; S3 for `data stage` through kubernetes.service_account). The FSx CSI
  node pods (not host-network) fall back to the Kubernetes API for their instance data when
  IMDS does not answer (kubernetes-sigs/aws-fsx-csi-driver pkg/cloud/metadata.go,
  NewMetadataService); the controller has its region in the Helm values (fsx.py).
- The instance-store NVMe (trn1.32xlarge 4 x 1900 GB, p5.48xlarge 8 x 3.84 TB) as one RAID0
  array holding kubelet's and containerd's folders (nodeadm `localStorage`), so emptyDir
  scratch (TMPDIR) and image layers are node-local NVMe, not the root EBS volume.
- With cluster.capacity_reservation_id / capacity_block_id: the launch template targets that
  On-Demand Capacity Reservation or Capacity Block (InsufficientInstanceCapacity otherwise
  stops many trn1/p5 launches).
- The current EKS-optimised AL2023 accelerated AMI (Neuron or NVIDIA) through its public SSM
  parameter, and AL2023's nodeadm NodeConfig as user data, with the node's labels and taints
  set at registration, so no pod lands there before they apply. The EFA kernel module is
  installed from the official, pinned installer (`--minimal`) only when the AMI lacks it (no
  `pop` typo). The EKS AL2023 accelerated AMIs install EFA with `--minimal`, which has no
  `fi_info` (amazon-eks-ami templates/al2023/provisioners/install-efa.sh), so the boot hook
  looks for the module (`modinfo efa`), not for `fi_info`: otherwise it ran the full installer
  on every boot (a DKMS rebuild, version drift, an internet dependency, and on trn1
  efa-nv-peermem, which cannot load there).
"""

from __future__ import annotations

from typing import Any

from trainmaster.cluster import versions
from trainmaster.cluster.spec import ClusterSpec

Ref = dict[str, Any]
LUSTRE_PORTS = ((988, 988), (1018, 1023))
ROOT_VOLUME_GIB = 500  # the tutorial's: compile caches, images and logs live on the node


def ref(name: str) -> Ref:
    return {"Ref": name}


def sub(text: str) -> Ref:
    return {"Fn::Sub": text}


def network_interfaces(spec: ClusterSpec) -> list[dict[str, Any]]:
    groups = [ref("NodeSecurityGroup"), ref("ClusterSecurityGroup")]
    return [
        {
            "Description": f"EFA on network card {card}",
            "NetworkCardIndex": card,
            "DeviceIndex": 0 if card == 0 else 1,
            "InterfaceType": "efa",
            "Groups": groups,
            "DeleteOnTermination": True,
        }
        for card in range(spec.instance.efa_interfaces)
    ]


def user_data(spec: ClusterSpec) -> str:
    """MIME multi-part: a boot hook for EFA, then nodeadm's NodeConfig (Fn::Sub template).

    `instance.localStorage.strategy: RAID0`: nodeadm stripes every instance-store NVMe into one
    array (mounted at /mnt/k8s-disks) and bind-mounts /var/lib/kubelet (emptyDir volumes live
    there), /var/lib/containerd and /var/log/pods onto it. eksctl has no field for this on a node
    group with its own launch template; source: github.com/awslabs/amazon-eks-ami
    nodeadm/doc/api.md (InstanceOptions, LocalStorageOptions, LocalStorageStrategy RAID0).
    """
    # The node group's labels that EKS applies to nodes of its own AMIs only: with a custom AMI
    # (ours, from the launch template) kubelet must set them, or `eksctl create nodegroup` waits
    # for nodes labelled alpha.eksctl.io/nodegroup-name=<ng> until it times out (eksctl
    # pkg/apis/eksctl.io/v1alpha5/types.go NodeGroupNameLabel, EKSNodeGroupNameLabel and
    # ListOptions; defaults.go setDefaultNodeLabels). Neither prefix is one NodeRestriction keeps
    # from kubelets (kubernetes.io, k8s.io).
    node_labels = spec.accelerator_labels | {
        "alpha.eksctl.io/nodegroup-name": spec.nodegroup,
        "eks.amazonaws.com/nodegroup": spec.nodegroup,
    }
    labels = ",".join(f"{k}={v}" for k, v in node_labels.items())
    taint = f"{spec.taint_key}=true:NoSchedule"
    efa = (
        ""
        if not spec.efa
        else f"""--==BOUNDARY==
Content-Type: text/cloud-boothook; charset="us-ascii"

#!/bin/bash
# The EFA kernel module {versions.EFA_INSTALLER_VERSION}, only when the AMI lacks it; once per instance.
# The host needs the module alone: the containers bring libfabric (and aws-ofi-nccl).
if ! modinfo efa >/dev/null 2>&1; then
  cloud-init-per once efa_download curl -fsSL --retry 5 -o /tmp/aws-efa-installer.tar.gz {versions.EFA_INSTALLER_URL}
  cloud-init-per once efa_extract tar -xf /tmp/aws-efa-installer.tar.gz -C /tmp
  cloud-init-per once efa_install sh -c 'cd /tmp/aws-efa-installer && ./efa_installer.sh -y --minimal'
fi

"""
    )
    return f"""MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="==BOUNDARY=="

{efa}--==BOUNDARY==
Content-Type: application/node.eks.aws

apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  cluster:
    name: ${{ClusterName}}
    apiServerEndpoint: ${{ClusterEndpoint}}
    certificateAuthority: ${{ClusterCertificateAuthority}}
    cidr: ${{ClusterServiceCidr}}
  instance:
    localStorage:
      strategy: RAID0
  kubelet:
    flags:
      - --node-labels={labels}
      - --register-with-taints={taint}

--==BOUNDARY==--
"""


def _parameters(spec: ClusterSpec) -> dict[str, Any]:
    return {
        "ClusterName": {"Type": "String", "Description": "EKS cluster name"},
        "ClusterEndpoint": {
            "Type": "String",
            "Description": "aws eks describe-cluster: cluster.endpoint",
        },
        "ClusterCertificateAuthority": {
            "Type": "String",
            "Description": "aws eks describe-cluster: cluster.certificateAuthority.data",
        },
        "ClusterServiceCidr": {
            "Type": "String",
            "Default": "10.100.0.0/16",
            "Description": "aws eks describe-cluster: cluster.kubernetesNetworkConfig.serviceIpv4Cidr",
        },
        "ClusterSecurityGroup": {
            "Type": "AWS::EC2::SecurityGroup::Id",
            "Description": "aws eks describe-cluster: cluster.resourcesVpcConfig.clusterSecurityGroupId",
        },
        "VpcId": {"Type": "AWS::EC2::VPC::Id", "Description": "the cluster's VPC"},
        "NodeImageId": {
            "Type": "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>",
            "Default": versions.ami_parameter(spec.kubernetes_version, spec.instance.neuron),
            "Description": "SSM parameter of the EKS-optimised AL2023 accelerated AMI",
        },
    }


def _sg_rule(
    kind: str,
    group: str,
    description: str,
    *,
    protocol: str = "-1",
    ports: tuple[int, int] | None = None,
    peer: str,
) -> dict[str, Any]:
    props: dict[str, Any] = {
        "GroupId": ref(group),
        "Description": description,
        "IpProtocol": protocol,
    }
    if ports:
        props |= {"FromPort": ports[0], "ToPort": ports[1]}
    peer_key = "SourceSecurityGroupId" if kind == "Ingress" else "DestinationSecurityGroupId"
    props[peer_key] = ref(peer)
    return {"Type": f"AWS::EC2::SecurityGroup{kind}", "Properties": props}


def _security_groups(spec: ClusterSpec) -> dict[str, Any]:
    tags = [{"Key": sub("kubernetes.io/cluster/${ClusterName}"), "Value": "owned"}]
    res: dict[str, Any] = {
        "NodeSecurityGroup": {
            "Type": "AWS::EC2::SecurityGroup",
            "Properties": {
                "GroupDescription": "trainmaster accelerator nodes (EFA: all traffic within the group)",
                "VpcId": ref("VpcId"),
                "Tags": tags,
            },
        },
        "NodeSelfIngress": _sg_rule(
            "Ingress",
            "NodeSecurityGroup",
            "EFA and NCCL/CCOM between nodes",
            peer="NodeSecurityGroup",
        ),
        "NodeSelfEgress": _sg_rule(
            "Egress", "NodeSecurityGroup", "EFA between nodes (OS bypass)", peer="NodeSecurityGroup"
        ),
        "LustreSecurityGroup": {
            "Type": "AWS::EC2::SecurityGroup",
            "Properties": {
                "GroupDescription": "trainmaster FSx for Lustre (TCP 988, 1018-1023)",
                "VpcId": ref("VpcId"),
                "Tags": tags,
            },
        },
    }
    peers = (
        ("Self", "LustreSecurityGroup"),
        ("Nodes", "NodeSecurityGroup"),
        ("Cluster", "ClusterSecurityGroup"),
    )
    for low, high in LUSTRE_PORTS:
        suffix = f"{low}" if low == high else f"{low}to{high}"
        for label, peer in peers:
            res[f"Lustre{label}Ingress{suffix}"] = _sg_rule(
                "Ingress",
                "LustreSecurityGroup",
                f"Lustre from {label.lower()}",
                protocol="tcp",
                ports=(low, high),
                peer=peer,
            )
        for label, group in peers[1:]:
            res[f"{label}FromLustreIngress{suffix}"] = _sg_rule(
                "Ingress",
                group,
                "Lustre servers to clients",
                protocol="tcp",
                ports=(low, high),
                peer="LustreSecurityGroup",
            )
    return res


def _launch_template(spec: ClusterSpec) -> dict[str, Any]:
    data: dict[str, Any] = {
        "InstanceType": spec.instance.name,
        "ImageId": ref("NodeImageId"),
        "BlockDeviceMappings": [
            {
                "DeviceName": "/dev/xvda",
                "Ebs": {
                    "VolumeSize": ROOT_VOLUME_GIB,
                    "VolumeType": "gp3",
                    "Encrypted": True,
                    "DeleteOnTermination": True,
                },
            }
        ],
        # hop limit 1: IMDS answers the host only, not pods behind the VPC CNI's extra hop
        # (https://docs.aws.amazon.com/eks/latest/best-practices/identity-and-access-management.html,
        # "Restrict access to the instance profile assigned to the worker node")
        "MetadataOptions": {
            "HttpEndpoint": "enabled",
            "HttpTokens": "required",
            "HttpPutResponseHopLimit": 1,
        },
        "TagSpecifications": [
            {
                "ResourceType": "instance",
                "Tags": [
                    {"Key": "Name", "Value": sub(f"${{ClusterName}}-{spec.nodegroup}")},
                    {"Key": "trainmaster.io/cluster", "Value": ref("ClusterName")},
                ],
            }
        ],
        "UserData": {"Fn::Base64": sub(user_data(spec))},
    }
    if spec.capacity_reservation_id:
        # An ODCR, or a Capacity Block: the latter also needs MarketType capacity-block in the
        # template (https://docs.aws.amazon.com/eks/latest/userguide/capacity-blocks-mng.html;
        # AWS::EC2::LaunchTemplate LaunchTemplateData CapacityReservationSpecification,
        # InstanceMarketOptions).
        data["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": spec.capacity_reservation_id}
        }
        if spec.capacity_block:
            data["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
    if spec.efa:
        data["NetworkInterfaces"] = network_interfaces(spec)
        if _placement_group(spec):
            data["Placement"] = {"GroupName": ref("PlacementGroup")}
    else:
        data["SecurityGroupIds"] = [ref("NodeSecurityGroup"), ref("ClusterSecurityGroup")]
    return {"Type": "AWS::EC2::LaunchTemplate", "Properties": {"LaunchTemplateData": data}}


def _placement_group(spec: ClusterSpec) -> bool:
    """A new cluster placement group for EFA nodes, unless they launch into a reservation.

    A Capacity Reservation serves a cluster placement group only when it was created in that
    group ("To reserve capacity in a placement group, you must create the Capacity Reservation
    in the placement group": EC2 User Guide, "Use Capacity Reservations with cluster placement
    groups", Limitations), and the group here is new, so no reservation can be in it; instances
    of a Capacity Block are placed together in an EC2 UltraCluster anyway (EC2 API Reference,
    CapacityBlock)."""
    return spec.efa and not spec.capacity_reservation_id


def template(spec: ClusterSpec) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if _placement_group(spec):
        resources["PlacementGroup"] = {
            "Type": "AWS::EC2::PlacementGroup",
            "Properties": {"Strategy": "cluster"},
        }
    resources |= _security_groups(spec)
    resources["NodeInstanceRole"] = {
        "Type": "AWS::IAM::Role",
        "Properties": {
            "AssumeRolePolicyDocument": {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Principal": {"Service": ["ec2.amazonaws.com"]},
                        "Action": ["sts:AssumeRole"],
                    }
                ],
            },
            "ManagedPolicyArns": [
                sub(f"arn:${{AWS::Partition}}:iam::aws:policy/{p}")
                for p in (
                    "AmazonEKSWorkerNodePolicy",
                    "AmazonEKS_CNI_Policy",
                    "AmazonEC2ContainerRegistryReadOnly",
                    "AmazonSSMManagedInstanceCore",
                )
            ],
            "Path": "/",
        },
    }
    resources["NodeLaunchTemplate"] = _launch_template(spec)
    outputs = {
        "LaunchTemplateId": {
            "Description": "launch template of the accelerator node group",
            "Value": ref("NodeLaunchTemplate"),
        },
        "NodeInstanceRoleArn": {
            "Description": "role of the accelerator nodes",
            "Value": {"Fn::GetAtt": ["NodeInstanceRole", "Arn"]},
        },
        "NodeSecurityGroup": {
            "Description": "security group of the accelerator nodes",
            "Value": ref("NodeSecurityGroup"),
        },
        "LustreSecurityGroup": {
            "Description": "security group of FSx for Lustre",
            "Value": ref("LustreSecurityGroup"),
        },
    }
    return {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": (
            f"trainmaster: {spec.nodes} x {spec.instance.name} nodes of EKS cluster "
            f"{spec.name} (launch template, EFA, security groups, node role)"
        ),
        "Parameters": _parameters(spec),
        "Resources": resources,
        "Outputs": outputs,
    }
