"""What the builders must get right, beyond the schemas: EFA layout, AMIs, ports, names, pins."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.cluster.conftest import REAL_CALLER_CIDR, p5_config, trn1_config
from trainmaster.cluster import addons, cloudformation, eksctl, fsx, image, spec, versions
from trainmaster.errors import ConfigError

EFA_CASES = [  # (instance type, workers per node, EFA interfaces = network cards)
    ("trn1.32xlarge", 32, 8),
    ("trn1n.32xlarge", 32, 16),
    ("trn2.48xlarge", 64, 16),
    ("p4d.24xlarge", 8, 4),
    ("p5.48xlarge", 8, 32),
]


def spec_of(instance: str, workers: int) -> spec.ClusterSpec:
    return spec.resolve(
        trn1_config(
            f'kubernetes.instance_type="{instance}"',
            f"job.nproc_per_node={workers}",
            "train.global_batch_size=65536",
            'train.device="auto"',  # the node type's own path (xla, neuron or cuda)
        )
    )


def launch_data(s: spec.ClusterSpec) -> dict[str, Any]:
    lt: dict[str, Any] = cloudformation.template(s)["Resources"]["NodeLaunchTemplate"]
    return dict(lt["Properties"]["LaunchTemplateData"])


@pytest.mark.parametrize(("instance", "workers", "cards"), EFA_CASES)
def test_one_efa_interface_per_network_card(instance: str, workers: int, cards: int) -> None:
    nics = launch_data(spec_of(instance, workers))["NetworkInterfaces"]
    assert [(n["NetworkCardIndex"], n["DeviceIndex"]) for n in nics] == [(0, 0)] + [
        (card, 1) for card in range(1, cards)
    ]
    assert all(n["InterfaceType"] == "efa" for n in nics)
    assert all(
        n["Groups"] == [{"Ref": "NodeSecurityGroup"}, {"Ref": "ClusterSecurityGroup"}] for n in nics
    )


def test_without_efa_no_interfaces_and_no_placement_group() -> None:
    s = spec.resolve(
        trn1_config(
            'kubernetes.instance_type="trn1.2xlarge"',
            "job.nproc_per_node=2",
            "train.global_batch_size=64",
        )
    )
    data = launch_data(s)
    assert "NetworkInterfaces" not in data and "Placement" not in data
    assert "PlacementGroup" not in cloudformation.template(s)["Resources"]
    assert "text/cloud-boothook" not in cloudformation.user_data(s)


def test_launch_template_basics() -> None:
    s = spec.resolve(trn1_config())
    data = launch_data(s)
    assert data["MetadataOptions"] == {
        "HttpEndpoint": "enabled",
        "HttpTokens": "required",
        "HttpPutResponseHopLimit": 1,
    }
    assert data["InstanceType"] == "trn1.32xlarge"
    assert data["Placement"] == {"GroupName": {"Ref": "PlacementGroup"}}
    assert "IamInstanceProfile" not in data  # managed node groups refuse one
    params = cloudformation.template(s)["Parameters"]
    assert (
        params["NodeImageId"]["Default"]
        == "/aws/service/eks/optimized-ami/1.36/amazon-linux-2023/x86_64/neuron/recommended/image_id"
    )
    gpu = cloudformation.template(spec.resolve(p5_config()))["Parameters"]["NodeImageId"]["Default"]
    assert (
        gpu
        == "/aws/service/eks/optimized-ami/1.36/amazon-linux-2023/x86_64/nvidia/recommended/image_id"
    )


def test_user_data_joins_with_nodeadm_and_installs_pinned_efa() -> None:
    text = cloudformation.user_data(spec.resolve(trn1_config()))
    assert "kind: NodeConfig" in text and "apiServerEndpoint: ${ClusterEndpoint}" in text
    assert "--register-with-taints=aws.amazon.com/neuron=true:NoSchedule" in text
    assert "--node-labels=trainmaster.io/role=accelerator" in text
    assert versions.EFA_INSTALLER_URL in text and "efa-installer.amazonaws.com" in text
    assert "bootstrap.sh" not in text  # AL2 only
    gpu = cloudformation.user_data(spec.resolve(p5_config()))
    assert "nvidia.com/gpu=true:NoSchedule" in gpu and "nvidia.com/gpu.present=true" in gpu


def test_lustre_and_efa_security_group_rules() -> None:
    res = cloudformation.template(spec.resolve(trn1_config()))["Resources"]
    rules = [
        r["Properties"]
        for r in res.values()
        if r["Type"].startswith("AWS::EC2::SecurityGroupIngress")
    ]
    lustre = {
        (r["FromPort"], r["ToPort"], r["SourceSecurityGroupId"]["Ref"])
        for r in rules
        if r["GroupId"] == {"Ref": "LustreSecurityGroup"}
    }
    assert lustre == {
        (lo, hi, peer)
        for lo, hi in ((988, 988), (1018, 1023))
        for peer in ("LustreSecurityGroup", "NodeSecurityGroup", "ClusterSecurityGroup")
    }
    self_rules = [
        r
        for r in res.values()
        if r["Properties"].get("GroupId") == {"Ref": "NodeSecurityGroup"}
        and r["Properties"].get("IpProtocol") == "-1"
    ]
    kinds = sorted(r["Type"] for r in self_rules)
    assert kinds == ["AWS::EC2::SecurityGroupEgress", "AWS::EC2::SecurityGroupIngress"]


def test_nodegroup_shape() -> None:
    s = spec.resolve(trn1_config("cluster.nodes=3"))
    ng = eksctl.nodegroup_config(s)["managedNodeGroups"][0]
    assert (ng["minSize"], ng["desiredCapacity"], ng["maxSize"]) == (3, 3, 3)
    assert ng["availabilityZones"] == ["us-west-2d"] and ng["privateNetworking"] is True
    assert ng["launchTemplate"] == {"id": "@LAUNCH_TEMPLATE_ID@"}
    assert ng["taints"] == [
        {"key": "aws.amazon.com/neuron", "value": "true", "effect": "NoSchedule"}
    ]
    assert "instanceType" not in ng  # the launch template's
    cluster = eksctl.cluster_config(s)
    assert cluster["iam"]["withOIDC"] is True and cluster["availabilityZones"] == [
        "us-west-2d",
        "us-west-2b",
    ]
    assert cluster["managedNodeGroups"][0]["labels"] == {"trainmaster.io/role": "system"}


def test_fsx_role_is_least_privilege() -> None:
    sa = eksctl.fsx_irsa_config(spec.resolve(trn1_config()))["iam"]["serviceAccounts"][0]
    actions = {
        a
        for st in sa["attachPolicy"]["Statement"]
        for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])
    }
    assert "fsx:CreateFileSystem" in actions and "fsx:DeleteFileSystem" in actions
    assert not any(a.endswith("*") for a in actions)
    assert "attachPolicyARNs" not in sa


def test_addons_follow_the_job() -> None:
    cfg = trn1_config(
        'kubernetes.queue="research"',
        'kubernetes.pvc="team-claim"',
        'kubernetes.namespace="ml"',
        'kubernetes.mount="/mnt/fsx"',
    )
    s = spec.resolve(cfg)
    assert addons.queue(s)["metadata"]["name"] == "research"
    assert "capability" not in addons.queue(s)["spec"]
    claim = fsx.claim(s)
    assert (claim["metadata"]["name"], claim["metadata"]["namespace"]) == ("team-claim", "ml")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    deployment, service = addons.tensorboard(s)
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--logdir") + 1] == "/mnt/fsx/runs"
    assert service["spec"]["type"] == "ClusterIP"
    _, etcd, server, client, _ = addons.etcd(s)
    assert {server["metadata"]["name"], client["metadata"]["name"]} == {
        "etcd-server",
        "etcd-client",
    }
    assert etcd["metadata"]["namespace"] == "trainmaster-etcd"  # not the job's: 12.9c
    container = etcd["spec"]["template"]["spec"]["containers"][0]
    assert "--enable-v2" in container["command"]
    assert re.fullmatch(r"quay\.io/coreos/etcd:v3\.5\.\d+", container["image"])


def test_device_plugins_tolerate_the_accelerator_taint() -> None:
    s = spec.resolve(trn1_config())
    tolerated = {t["key"] for t in addons.efa_values(s)["tolerations"]}
    assert "aws.amazon.com/neuron" in tolerated
    neuron = addons.neuron_values(s)
    assert {t["key"] for t in neuron["devicePlugin"]["tolerations"]} >= {"aws.amazon.com/neuron"}
    # Neuron's node problem detector with recovery on, through the documented IRSA
    assert neuron["npd"]["enabled"] and neuron["npd"]["nodeRecovery"]["enabled"]
    gpu = spec.resolve(p5_config())
    assert "nvidia.com/gpu" in {t["key"] for t in addons.nvidia_values(gpu)["tolerations"]}


def test_dockerfiles_are_pinned_and_install_torch_first() -> None:
    files = image.dockerfiles()
    for flavour in image.FLAVOURS:
        text = files[f"Dockerfile.{flavour}"]
        # the base is a build argument (a mirror's may replace it) whose default is the pin
        base = re.search(r"^ARG BASE=(\S+)\nFROM --platform=linux/amd64 \$\{BASE\}$", text, re.M)
        assert base and ":" in base.group(1) and "latest" not in base.group(1)
        if flavour != "neuron":  # pip installs torch from TORCH_INDEX_URL, by default the pin's
            index = re.search(r"^ARG TORCH_INDEX_URL=(\S+)$", text, re.M)
            assert index and index.group(1) in versions.TORCH_INDEX.values()
            assert f'"torch=={versions.TORCH_VERSION}" --index-url "$TORCH_INDEX_URL"' in text
        for spec_ in re.findall(r'"([A-Za-z0-9_.-]+)([=<>!~]=?[^"]*)?"', text):
            assert spec_[1].startswith("=="), spec_
        assert "python-etcd==" in text and "tensorboard==" in text
        project = text.index(image.SOURCE_DIR + " \\")
        if flavour != "neuron":
            assert text.index(f'"torch=={versions.TORCH_VERSION}"') < project
    assert files["Dockerfile.neuron.dockerignore"].startswith("#")


def test_cuda_image_finds_the_ofi_nccl_plugin_where_ubuntu_installs_it() -> None:
    """12.3: on Ubuntu the EFA installer puts aws-ofi-nccl under lib/x86_64-linux-gnu; with
    lib/ alone on LD_LIBRARY_PATH NCCL falls back to TCP sockets."""
    text = image.dockerfiles()["Dockerfile.cuda"]
    path = re.search(r"LD_LIBRARY_PATH=(\S+)", text)
    assert path and path.group(1).split(":")[0] == "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu"
    assert "/opt/amazon/ofi-nccl/lib:" not in text
    # the build fails when the plugin is not where LD_LIBRARY_PATH looks
    assert "ls /opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-ofi*.so" in text


def _resolve(*overrides: str, cidr: str | None = "203.0.113.7/32") -> spec.ClusterSpec:
    return spec.resolve(trn1_config(*overrides), cidr_lookup=lambda: cidr)


def test_api_endpoint_is_public_only_to_the_callers_address() -> None:
    """12.9a: eksctl's default endpoint is public to 0.0.0.0/0."""
    s = _resolve()
    vpc = eksctl.cluster_config(s)["vpc"]
    assert vpc == {
        "clusterEndpoints": {"privateAccess": True, "publicAccess": True},
        "publicAccessCIDRs": ["203.0.113.7/32"],
    }
    assert "203.0.113.7/32" in s.endpoint_note and "update-cluster-endpoints" in s.endpoint_note


def test_api_endpoint_cidrs_from_the_job_file() -> None:
    listed = _resolve('cluster.public_access_cidrs=["198.51.100.0/24"]', cidr=None)  # no look-up
    assert eksctl.cluster_config(listed)["vpc"]["publicAccessCIDRs"] == ["198.51.100.0/24"]
    assert listed.endpoint_note == ""


def test_no_endpoint_open_to_everyone_when_the_address_is_unknown() -> None:
    """Unknown address: refuse (never 0.0.0.0/0); eksctl cannot create a private-only endpoint."""
    with pytest.raises(ConfigError, match="could not learn this machine's public IP") as err:
        _resolve(cidr=None)
    assert err.value.where == "cluster.public_access_cidrs"
    with pytest.raises(
        ConfigError, match="cannot create a cluster with a private-only API endpoint"
    ):
        _resolve("cluster.public_access_cidrs=[]")


def test_caller_cidr_is_none_without_an_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spec, "CHECKIP_URL", "http://127.0.0.1:9/")  # the discard port: refused
    assert REAL_CALLER_CIDR() is None


def test_pods_cannot_reach_the_node_role_through_imds() -> None:
    """12.9b: hop limit 2 lets a pod's request reach IMDS and take the node role."""
    for s in (_resolve(), spec.resolve(p5_config(), cidr_lookup=lambda: "203.0.113.7/32")):
        meta = launch_data(s)["MetadataOptions"]
        assert meta["HttpPutResponseHopLimit"] == 1 and meta["HttpTokens"] == "required"
        [system] = eksctl.cluster_config(s)["managedNodeGroups"]
        assert system["disablePodIMDS"] is True and system["disableIMDSv1"] is True


def test_etcd_has_its_own_namespace_and_only_trainmasters_pods_reach_it() -> None:
    """12.9c: etcd without auth in `default`, open to every pod of the cluster."""
    from trainmaster.backends.kubernetes.volcano import DEFAULT_ETCD, labels
    from trainmaster.cluster import upsteps

    s = _resolve()
    objs = {(o["kind"], o["metadata"]["name"]): o for o in addons.etcd(s)}
    assert ("Namespace", "trainmaster-etcd") in objs
    assert all(
        o["metadata"].get("namespace") == "trainmaster-etcd"
        for (kind, _), o in objs.items()
        if kind != "Namespace"
    )
    assert (
        f"{objs['Service', 'etcd-server']['metadata']['name']}.trainmaster-etcd.svc:2379"
        == DEFAULT_ETCD
    )
    policy = objs["NetworkPolicy", "etcd-clients"]["spec"]
    etcd_pods = objs["Deployment", "etcd-server"]["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"] == etcd_pods and policy["policyTypes"] == [
        "Ingress"
    ]
    [rule] = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 2379}]
    [peer] = rule["from"]  # one entry: the label, in any namespace (not "any pod OR any namespace")
    assert peer["namespaceSelector"] == {}
    wanted = peer["podSelector"]["matchLabels"]
    assert wanted == {"app.kubernetes.io/managed-by": "trainmaster"}
    assert wanted.items() <= labels("bert", "train").items()  # the job's pods carry it
    # the network policy agent that enforces it is on
    cni, _monitoring = eksctl.cluster_config(s)["addons"]
    assert (
        cni["name"] == "vpc-cni" and '"enableNetworkPolicy": "true"' in cni["configurationValues"]
    )
    etcd_step = next(st for st in upsteps.up_steps(s) if st.id == "etcd")
    assert all(
        "--namespace trainmaster-etcd" in c
        for c in etcd_step.commands[1:] + (etcd_step.check or "",)
    )


def test_kubelet_and_containerd_use_the_instance_store() -> None:
    """12.6: emptyDir scratch (TMPDIR) and image layers on the NVMe, not the root EBS volume."""
    import yaml

    for s in (_resolve(), spec.resolve(p5_config(), cidr_lookup=lambda: "203.0.113.7/32")):
        text = cloudformation.user_data(s)
        part = text.split("Content-Type: application/node.eks.aws\n", 1)[1].split("--==BOUNDARY==")[
            0
        ]
        node_config = yaml.safe_load(part.replace("${", "").replace("}", ""))
        assert node_config["kind"] == "NodeConfig"
        assert node_config["spec"]["instance"] == {"localStorage": {"strategy": "RAID0"}}


def test_launch_template_targets_a_capacity_reservation() -> None:
    """12.10: On-Demand Capacity Reservation: targeted, on-demand market."""
    s = _resolve('cluster.capacity_reservation_id="cr-0123456789abcdef0"')
    data = launch_data(s)
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}
    }
    assert "InstanceMarketOptions" not in data
    assert "instanceMarketOptions" not in eksctl.nodegroup_config(s)["managedNodeGroups"][0]


def test_launch_template_targets_a_capacity_block() -> None:
    s = spec.resolve(
        p5_config('cluster.capacity_block_id="cr-0fedcba9876543210"'),
        cidr_lookup=lambda: "203.0.113.7/32",
    )
    data = launch_data(s)
    assert data["CapacityReservationSpecification"]["CapacityReservationTarget"] == {
        "CapacityReservationId": "cr-0fedcba9876543210"
    }
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert eksctl.nodegroup_config(s)["managedNodeGroups"][0]["instanceMarketOptions"] == {
        "marketType": "capacity-block"
    }


def test_no_capacity_reservation_by_default() -> None:
    data = launch_data(_resolve())
    assert "CapacityReservationSpecification" not in data and "InstanceMarketOptions" not in data


# --- issue 30: what the generated objects meet on a real cluster ------------------------------


def test_capacity_block_node_group_names_its_reservation() -> None:
    """30.1: eksctl (since 0.205.0) refuses instanceMarketOptions without capacityReservation
    (pkg/apis/eksctl.io/v1alpha5/validation.go, validateNodeGroupBase)."""
    from tests.cluster import schemas

    s = spec.resolve(
        p5_config('cluster.capacity_block_id="cr-0fedcba9876543210"'),
        cidr_lookup=lambda: "203.0.113.7/32",
    )
    cfg = eksctl.nodegroup_config(s)
    ng = cfg["managedNodeGroups"][0]
    assert ng["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert ng["capacityReservation"] == {
        "capacityReservationTarget": {"capacityReservationID": "cr-0fedcba9876543210"}
    }
    schemas.validate_eksctl(cfg)


@pytest.mark.parametrize(
    "capacity",
    [
        'cluster.capacity_reservation_id="cr-0123456789abcdef0"',
        'cluster.capacity_block_id="cr-0fedcba9876543210"',
    ],
)
def test_no_new_placement_group_around_a_reservation(capacity: str) -> None:
    """30.1: a reservation serves a cluster placement group only when it was created in it (EC2
    User Guide, "Use Capacity Reservations with cluster placement groups", Limitations); the
    group the template would create is new, so no reservation can be in it."""
    s = spec.resolve(p5_config(capacity), cidr_lookup=lambda: "203.0.113.7/32")
    assert "PlacementGroup" not in cloudformation.template(s)["Resources"]
    data = launch_data(s)
    assert "Placement" not in data and len(data["NetworkInterfaces"]) == 32


def test_custom_ami_nodes_carry_the_node_group_labels_eksctl_waits_for() -> None:
    """30.4: eksctl waits for nodes labelled alpha.eksctl.io/nodegroup-name=<ng> (types.go
    ListOptions); EKS applies it, and eks.amazonaws.com/nodegroup, only to its own AMIs."""
    text = cloudformation.user_data(spec.resolve(trn1_config()))
    [flag] = [line for line in text.splitlines() if "--node-labels=" in line]
    labels = dict(kv.split("=", 1) for kv in flag.split("--node-labels=", 1)[1].split(","))
    assert labels["alpha.eksctl.io/nodegroup-name"] == "trn1-32xlarge"
    assert labels["eks.amazonaws.com/nodegroup"] == "trn1-32xlarge"
    assert labels["trainmaster.io/role"] == "accelerator"


def test_efa_boothook_installs_only_a_missing_kernel_module() -> None:
    """30.6: the EKS AL2023 accelerated AMIs install EFA with --minimal (no fi_info); the host
    needs the kernel module only, the containers bring libfabric."""
    text = cloudformation.user_data(spec.resolve(trn1_config()))
    hook = text.split("text/cloud-boothook", 1)[1].split("--==BOUNDARY==", 1)[0]
    assert "fi_info" not in hook
    assert "modinfo efa" in hook
    assert "efa_installer.sh -y --minimal" in hook and " -g" not in hook


def test_stage_pod_fits_a_system_node() -> None:
    """30.10: the system nodes are m6i.large (2 vCPU, 8 GiB; less is allocatable)."""
    from tests.backends.kubernetes.test_volcano import job_cfg
    from trainmaster.backends.kubernetes import stage

    pod = stage.build_stage_pod(job_cfg("trn1-32xl"), "s3://bucket/wiki.tar", "wiki")
    res = pod["spec"]["containers"][0]["resources"]
    cpu = res["requests"]["cpu"]
    millis = int(cpu[:-1]) if cpu.endswith("m") else int(cpu) * 1000
    assert millis <= 1000 and res["requests"]["memory"] in ("512Mi", "1Gi", "2Gi")
    assert res["limits"]["memory"] in ("1Gi", "2Gi", "4Gi")  # below an m6i.large's allocatable


def test_the_queue_takes_its_weight_and_capability_from_the_job() -> None:
    from tests.cluster.schemas import validate_queue

    cfg = trn1_config(
        "kubernetes.queue_weight=4",
        'kubernetes.queue_capability={ "aws.amazon.com/neuron" = "64", cpu = "1000" }',
    )
    q = addons.queue(spec.resolve(cfg))
    assert q["spec"]["weight"] == 4
    assert q["spec"]["capability"] == {"aws.amazon.com/neuron": "64", "cpu": "1000"}
    validate_queue(q)  # Volcano's Queue CRD accepts it


@pytest.mark.parametrize(
    ("cap", "message"),
    [
        ('{ "aws.amazon.com/neuron" = "16" }', "less than one gang of this job needs (2 x 16)"),
        ('{ "vpc.amazonaws.com/efa" = "8" }', "less than one gang of this job needs (2 x 8)"),
        ('{ "aws.amazon.com/neuron" = "lots" }', "not a whole number"),
    ],
)
def test_a_queue_too_small_for_one_gang_is_refused(cap: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        spec.resolve(trn1_config(f"kubernetes.queue_capability={cap}"))
    assert err.value.where == "kubernetes.queue_capability"
