"""`cluster status`: AWS through moto, the cluster through the real kubernetes client and a tiny API."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.cluster.conftest import tm_here, trn1_config
from trainmaster.backends.kubernetes import clusterinfo
from trainmaster.cluster import plan, status


def node(name: str, role: str, alloc: dict[str, str], ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {
                "node.kubernetes.io/instance-type": "trn1.32xlarge"
                if role == "accelerator"
                else "m6i.large",
                "topology.kubernetes.io/zone": "us-west-2d",
                "trainmaster.io/role": role,
            },
        },
        "status": {
            "allocatable": {"cpu": "127", **alloc},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


NODES = [
    node(
        "ip-10-0-1-1",
        "accelerator",
        {
            "aws.amazon.com/neuron": "16",
            "aws.amazon.com/neuroncore": "32",
            "vpc.amazonaws.com/efa": "8",
        },
    ),
    node("ip-10-0-1-2", "accelerator", {"vpc.amazonaws.com/efa": "8"}, ready=False),
    node("ip-10-0-2-1", "system", {}),
]


class _Api(BaseHTTPRequestHandler):
    routes: dict[str, tuple[int, dict[str, Any]]] = {
        "/api/v1/nodes": (200, {"kind": "NodeList", "apiVersion": "v1", "items": NODES}),
        "/apis/scheduling.volcano.sh/v1beta1/queues/trainmaster": (200, {"kind": "Queue"}),
        "/api/v1/namespaces/default/persistentvolumeclaims/fsx-claim": (
            200,
            {"kind": "PersistentVolumeClaim", "status": {"phase": "Bound"}},
        ),
    }

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        code, body = self.routes.get(
            self.path.split("?")[0],
            (
                404,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": "NotFound",
                    "code": 404,
                },
            ),
        )
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host = f"http://127.0.0.1:{server.server_address[1]}"
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": host}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    try:
        yield path, host
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def loaded(tmp_path: Path) -> plan.LoadedPlan:
    plan.write_plan(trn1_config(), tmp_path / "plan")
    return plan.load_plan(tmp_path / "plan")


def test_node_summary() -> None:
    n = status.node_of(NODES[0])
    assert (n.role, n.instance_type, n.zone, n.ready) == (
        "accelerator",
        "trn1.32xlarge",
        "us-west-2d",
        True,
    )
    assert n.allocatable == {
        "aws.amazon.com/neuron": "16",
        "aws.amazon.com/neuroncore": "32",
        "vpc.amazonaws.com/efa": "8",
    }
    assert status.node_of(NODES[1]).ready is False


def test_cluster_side(loaded: plan.LoadedPlan, kubeconfig: tuple[Path, str]) -> None:
    path, host = kubeconfig
    st = status.Status(cluster={"endpoint": host, "status": "ACTIVE"})
    clusterinfo.fill(loaded, st, str(path), None)
    assert st.kube_error is None
    assert [n.name for n in st.nodes] == ["ip-10-0-1-1", "ip-10-0-1-2", "ip-10-0-2-1"]
    assert st.queue is True and st.claim_phase == "Bound"


def test_a_kubeconfig_for_another_cluster_is_not_used(
    loaded: plan.LoadedPlan, kubeconfig: tuple[Path, str]
) -> None:
    st = status.Status(cluster={"endpoint": "https://ABC.gr7.us-west-2.eks.amazonaws.com"})
    clusterinfo.fill(loaded, st, str(kubeconfig[0]), None)
    assert (
        st.nodes == []
        and st.kube_error
        and "aws eks update-kubeconfig --name trainmaster-trn1" in st.kube_error
    )


def test_status_of_nothing(
    aws_env: None, loaded: plan.LoadedPlan, capsys: pytest.CaptureFixture[str]
) -> None:
    boto3.client("ecr", region_name="us-west-2").create_repository(repositoryName="trainmaster")
    code, out, err = tm_here(capsys, "cluster", "status", "--plan", str(loaded.dir))
    assert code == 0, err
    assert "trainmaster-trn1: not created" in out
    assert "trainmaster-trn1-accelerator-nodes: not created" in out
    assert ".dkr.ecr.us-west-2.amazonaws.com/trainmaster (tags: none)" in out
    assert f"tag {loaded.cluster['image_tag']} not pushed" in out


def test_status_prints_the_image_pinned_by_digest(
    aws_env: None, loaded: plan.LoadedPlan, capsys: pytest.CaptureFixture[str]
) -> None:
    """17.10: the tag is pushed again on every build; jobs get repo@sha256:..., not the tag."""
    ecr = boto3.client("ecr", region_name="us-west-2")
    uri = ecr.create_repository(repositoryName="trainmaster")["repository"]["repositoryUri"]
    ecr.put_image(
        repositoryName="trainmaster",
        imageTag=loaded.cluster["image_tag"],
        imageManifest='{"schemaVersion": 2, "mediaType": '
        '"application/vnd.docker.distribution.manifest.v2+json"}',
    )
    digest = ecr.describe_images(repositoryName="trainmaster")["imageDetails"][0]["imageDigest"]
    code, out, err = tm_here(capsys, "cluster", "status", "--plan", str(loaded.dir))
    assert code == 0, err
    assert f"--set kubernetes.image={uri}@{digest}" in out and digest.startswith("sha256:")
    assert status.gather(loaded).image == f"{uri}@{digest}"


def test_status_of_a_cluster(aws_env: None, loaded: plan.LoadedPlan) -> None:
    ec2 = boto3.client("ec2", region_name="us-west-2")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/24")["Subnet"]["SubnetId"]
    eks = boto3.client("eks", region_name="us-west-2")
    role = "arn:aws:iam::123456789012:role/eks"
    eks.create_cluster(
        name="trainmaster-trn1", roleArn=role, resourcesVpcConfig={"subnetIds": [subnet]}
    )
    eks.create_nodegroup(
        clusterName="trainmaster-trn1",
        nodegroupName="trn1-32xlarge",
        nodeRole=role,
        subnets=[subnet],
        scalingConfig={"minSize": 2, "maxSize": 2, "desiredSize": 2},
    )
    st = status.gather(loaded)
    assert st.cluster and st.cluster["name"] == "trainmaster-trn1"
    assert [ng["nodegroupName"] for ng in st.nodegroups] == ["trn1-32xlarge"]
    assert st.repository is None and st.stack_status is None


def test_status_prints_allocatable_devices_per_node(
    loaded: plan.LoadedPlan, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    st = status.Status(
        cluster={"status": "ACTIVE", "version": "1.33"},
        stack_status="CREATE_COMPLETE",
        nodes=[status.node_of(n) for n in NODES],
        queue=True,
        claim_phase="Bound",
    )
    monkeypatch.setattr(status, "gather", lambda *_a, **_k: st)
    code, out, err = tm_here(capsys, "cluster", "status", "--plan", str(loaded.dir))
    assert code == 0, err
    lines = out.splitlines()
    assert "trainmaster-trn1: ACTIVE, Kubernetes 1.33" in out and "claim fsx-claim" in out
    header = next(line for line in lines if line.startswith("NODE"))
    assert header.split() == [
        "NODE",
        "ROLE",
        "TYPE",
        "ZONE",
        "READY",
        "NEURON",
        "CORES",
        "GPU",
        "EFA",
    ]
    assert next(line for line in lines if line.startswith("ip-10-0-1-1")).split()[4:] == [
        "yes",
        "16",
        "32",
        "-",
        "8",
    ]
    assert next(line for line in lines if line.startswith("ip-10-0-1-2")).split()[4:] == [
        "NO",
        "-",
        "-",
        "-",
        "8",
    ]
