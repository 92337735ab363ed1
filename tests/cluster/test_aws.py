"""boto3 look-ups against moto, and the errors a user sees when AWS says no."""

from __future__ import annotations

import re
from datetime import UTC
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from tests.cluster.conftest import tm_here, trn1_config
from trainmaster.cluster import aws, plan, spec
from trainmaster.errors import UserError


def region_zones(region: str) -> set[str]:
    ec2 = boto3.client("ec2", region_name=region)
    return {z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"]}


def test_offered_zones(aws_read_only: None) -> None:
    trn1 = aws.offered_zones("us-west-2", "trn1.32xlarge")
    assert trn1 and set(trn1) < region_zones("us-west-2") and trn1 == sorted(trn1)
    assert aws.offered_zones("eu-west-3", "trn1.32xlarge") == []


def test_lookup_puts_the_accelerator_zone_first(aws_read_only: None) -> None:
    zones = spec.lookup_zones("us-west-2", "trn1.32xlarge")
    assert len(zones) == 2 and zones[0] != zones[1]
    assert zones[0] in aws.offered_zones("us-west-2", "trn1.32xlarge")
    # sa-east-1 offers p5 in one zone only: the control plane's second zone comes from the region
    only = aws.offered_zones("sa-east-1", "p5.48xlarge")
    zones = spec.lookup_zones("sa-east-1", "p5.48xlarge")
    assert len(only) == 1 and zones[0] == only[0] and zones[1] in region_zones("sa-east-1")


def test_plan_without_zones_looks_them_up(aws_read_only: None, tmp_path: Path) -> None:
    written = plan.write_plan(trn1_config("cluster.zones=[]"), tmp_path)
    assert written.spec.accelerator_zone in aws.offered_zones("us-west-2", "trn1.32xlarge")
    assert f"- {written.spec.accelerator_zone}" in (tmp_path / "eksctl/nodegroup.yaml").read_text()


def test_ecr_repository(aws_env: None) -> None:
    assert aws.ecr_repository("us-west-2", "trainmaster") is None
    uri = aws.ecr_repository("us-west-2", "trainmaster", create=True)
    assert uri and uri.endswith(".dkr.ecr.us-west-2.amazonaws.com/trainmaster")
    assert aws.ecr_repository("us-west-2", "trainmaster") == uri
    assert aws.ecr_image_tags("us-west-2", "trainmaster") == []
    assert aws.ecr_image_tags("us-west-2", "missing") == []


def _vpc() -> tuple[str, str]:
    ec2 = boto3.client("ec2", region_name="us-west-2")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/24", AvailabilityZone="us-west-2d")
    return vpc, subnet["Subnet"]["SubnetId"]


def test_cluster_nodegroups_stack_and_file_systems(aws_env: None) -> None:
    assert aws.eks_cluster("us-west-2", "tm") is None
    assert aws.stack("us-west-2", "tm-accelerator-nodes") is None
    vpc, subnet = _vpc()
    eks = boto3.client("eks", region_name="us-west-2")
    role = "arn:aws:iam::123456789012:role/eks"
    eks.create_cluster(name="tm", roleArn=role, resourcesVpcConfig={"subnetIds": [subnet]})
    eks.create_nodegroup(
        clusterName="tm",
        nodegroupName="trn1-32xlarge",
        nodeRole=role,
        subnets=[subnet],
        scalingConfig={"minSize": 2, "maxSize": 2, "desiredSize": 2},
    )
    cluster = aws.eks_cluster("us-west-2", "tm")
    assert cluster and cluster["name"] == "tm"
    assert [ng["nodegroupName"] for ng in aws.eks_nodegroups("us-west-2", "tm")] == [
        "trn1-32xlarge"
    ]
    fsx = boto3.client("fsx", region_name="us-west-2")
    made = fsx.create_file_system(
        FileSystemType="LUSTRE",
        StorageCapacity=1200,
        SubnetIds=[subnet],
        LustreConfiguration={"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 250},
        Tags=[{"Key": "trainmaster.io/cluster", "Value": "tm"}],
    )
    fsx.create_file_system(FileSystemType="LUSTRE", StorageCapacity=1200, SubnetIds=[subnet])
    found = aws.file_systems("us-west-2", "tm", "vpc-other")
    assert [f["FileSystemId"] for f in found] == [made["FileSystem"]["FileSystemId"]]
    assert aws.file_systems("us-west-2", "other") == []


def test_no_credentials_is_one_clear_line(no_credentials: None) -> None:
    with pytest.raises(UserError) as err:
        aws.offered_zones("us-west-2", "trn1.32xlarge")
    message = str(err.value)
    assert "no AWS credentials" in message and "ec2:DescribeInstanceTypeOfferings" in message
    assert "aws configure sso" in message


def test_plan_without_credentials_says_how_to_avoid_the_look_up(
    no_credentials: None, tmp_path: Path
) -> None:
    with pytest.raises(UserError) as err:
        plan.write_plan(trn1_config("cluster.zones=[]"), tmp_path)
    assert "credentials" in str(err.value)


@pytest.mark.parametrize(
    ("code", "operation", "action", "call"),
    [
        (
            "UnauthorizedOperation",
            "describe_instance_type_offerings",
            "ec2:DescribeInstanceTypeOfferings",
            lambda: aws.offered_zones("us-west-2", "trn1.32xlarge"),
        ),
        (
            "AccessDeniedException",
            "describe_cluster",
            "eks:DescribeCluster",
            lambda: aws.eks_cluster("us-west-2", "tm"),
        ),
        (
            "AccessDeniedException",
            "describe_repositories",
            "ecr:DescribeRepositories",
            lambda: aws.ecr_repository("us-west-2", "trainmaster"),
        ),
        (
            "AccessDenied",
            "describe_file_systems",
            "fsx:DescribeFileSystems",
            lambda: aws.file_systems("us-west-2", "tm"),
        ),
    ],
)
def test_denied_names_the_iam_action(
    monkeypatch: pytest.MonkeyPatch, code: str, operation: str, action: str, call: Any
) -> None:
    service = action.split(":")[0]
    client = boto3.client(
        service, region_name="us-west-2", aws_access_key_id="x", aws_secret_access_key="x"
    )
    stubber = Stubber(client)
    stubber.add_client_error(operation, service_error_code=code, service_message="not allowed")
    stubber.activate()
    monkeypatch.setattr(aws, "client", lambda _service, _region: client)
    with pytest.raises(UserError) as err:
        call()
    assert action in str(err.value) and "permission denied" in str(err.value)


def test_expired_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    client = boto3.client(
        "eks", region_name="us-west-2", aws_access_key_id="x", aws_secret_access_key="x"
    )
    stubber = Stubber(client)
    stubber.add_client_error(
        "describe_cluster",
        service_error_code="ExpiredTokenException",
        service_message="The security token included in the request is expired",
    )
    stubber.activate()
    monkeypatch.setattr(aws, "client", lambda _service, _region: client)
    with pytest.raises(UserError) as err:
        aws.eks_cluster("us-west-2", "tm")
    assert "refused the credentials" in str(err.value) and "expired" in str(err.value)


def _lustre(subnet: str, cluster: str = "tm") -> str:
    fsx = boto3.client("fsx", region_name="us-west-2")
    made = fsx.create_file_system(
        FileSystemType="LUSTRE",
        StorageCapacity=1200,
        SubnetIds=[subnet],
        Tags=[{"Key": "trainmaster.io/cluster", "Value": cluster}],
    )
    return str(made["FileSystem"]["FileSystemId"])


def test_down_waits_until_the_file_system_is_gone(aws_env: None) -> None:
    """12.7: the PV is gone before the file system; the wait polls FSx until it is."""
    _, subnet = _vpc()
    fs, other = _lustre(subnet), _lustre(subnet)  # `other` is not being deleted: not waited for
    said: list[str] = []
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the deletion finishes during the second wait
        slept.append(seconds)
        if len(slept) == 2:
            boto3.client("fsx", region_name="us-west-2").delete_file_system(FileSystemId=fs)

    aws.wait_file_systems_deleted(
        "us-west-2",
        "tm",
        [fs],
        interval_s=30,
        progress=said.append,
        clock=lambda: 100.0,
        sleep=sleep,
    )
    assert slept == [30, 30] and len(said) == 2 and fs in said[0] and other not in said[0]
    assert [f["FileSystemId"] for f in aws.file_systems("us-west-2", "tm")] == [other]


def test_waiting_for_the_file_system_is_bounded(aws_env: None) -> None:
    _, subnet = _vpc()
    fs = _lustre(subnet)
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with pytest.raises(UserError) as err:
        aws.wait_file_systems_deleted(
            "us-west-2",
            "tm",
            [fs],
            timeout_s=100,
            interval_s=30,
            progress=lambda _: None,
            clock=lambda: now[0],
            sleep=sleep,
        )
    assert fs in str(err.value) and "100 s" in str(err.value) and now[0] == 100


def test_ecr_image_digest(aws_env: None) -> None:
    """17.10: the digest the pushed tag points at (what jobs pin), None before the push."""
    ecr = boto3.client("ecr", region_name="us-west-2")
    assert aws.ecr_image_digest("us-west-2", "trainmaster", "0.1.0-neuron") is None
    ecr.create_repository(repositoryName="trainmaster")
    assert aws.ecr_image_digest("us-west-2", "trainmaster", "0.1.0-neuron") is None
    manifest = (
        '{"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json"}'
    )
    ecr.put_image(repositoryName="trainmaster", imageManifest=manifest, imageTag="0.1.0-neuron")
    digest = aws.ecr_image_digest("us-west-2", "trainmaster", "0.1.0-neuron")
    listed = ecr.describe_images(repositoryName="trainmaster")["imageDetails"][0]["imageDigest"]
    assert digest and digest == listed and re.fullmatch(r"sha256:[0-9a-f]{64}", digest)


def test_wait_with_no_time_is_a_check(aws_env: None) -> None:
    """`--timeout 0` is down-claim's check: done only when nothing of the cluster is DELETING."""
    _, subnet = _vpc()
    aws.wait_file_systems_deleted("us-west-2", "tm", timeout_s=0, sleep=pytest.fail)
    fs = _lustre(subnet)
    with pytest.raises(UserError):
        aws.wait_file_systems_deleted("us-west-2", "tm", [fs], timeout_s=0, sleep=pytest.fail)


def test_wait_fsx_command(aws_env: None, capsys: pytest.CaptureFixture[str]) -> None:
    """What runbook.sh runs: exit 0 when the file systems are gone, 2 (one line) when not in time."""
    _, subnet = _vpc()
    code, out, _ = tm_here(
        capsys, "cluster", "wait-fsx", "--region", "us-west-2", "--cluster", "tm"
    )
    assert code == 0 and "deleted" in out
    fs = _lustre(subnet)
    code, _, err = tm_here(
        capsys,
        "cluster",
        "wait-fsx",
        "--region",
        "us-west-2",
        "--cluster",
        "tm",
        "--file-system-id",
        fs,
        "--timeout",
        "0",
    )
    assert code == 2 and fs in err


def test_s3_reads_for_the_stage_pod(aws_env: None, tmp_path: Path) -> None:
    """30.3: what the stage pod runs instead of `aws s3 cp/sync` (boto3 is in every image)."""
    import io

    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="bkt")
    for key, body in {"p/a.hdf5": b"a" * 10, "p/sub/b.txt": b"b", "other/c": b"c"}.items():
        s3.put_object(Bucket="bkt", Key=key, Body=body)
    assert aws.s3_sync("s3://bkt/p/", tmp_path / "out") == 2
    assert (tmp_path / "out" / "a.hdf5").read_bytes() == b"a" * 10
    assert (tmp_path / "out" / "sub" / "b.txt").read_bytes() == b"b"
    assert not (tmp_path / "out" / "c").exists()
    sink = io.BytesIO()
    aws.s3_cat("s3://bkt/p/a.hdf5", sink)
    assert sink.getvalue() == b"a" * 10
    with pytest.raises(UserError, match="s3://bkt/missing"):
        aws.s3_cat("s3://bkt/missing", io.BytesIO())
    assert aws.main(["s3", "sync", "s3://bkt/p/", str(tmp_path / "cli"), "--no-progress"]) == 0
    assert (tmp_path / "cli" / "sub" / "b.txt").exists()


def test_spot_prices_are_each_zones_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    """DescribeSpotPriceHistory from now gives rows per zone, not always newest first: each
    zone's price is its newest row's (botocore's Stubber checks the request too)."""
    from datetime import datetime

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    ec2 = boto3.client("ec2", region_name="us-west-2")
    at = [datetime(2026, 12, 6, h, tzinfo=UTC) for h in (1, 2, 3)]
    rows = [
        {"AvailabilityZone": "us-west-2d", "SpotPrice": "7.50", "Timestamp": at[0]},
        {"AvailabilityZone": "us-west-2d", "SpotPrice": "8.25", "Timestamp": at[2]},
        {"AvailabilityZone": "us-west-2a", "SpotPrice": "9.10", "Timestamp": at[1]},
    ]
    with Stubber(ec2) as stub:
        stub.add_response(
            "describe_spot_price_history",
            {"SpotPriceHistory": rows[:2], "NextToken": "more"},
        )
        stub.add_response("describe_spot_price_history", {"SpotPriceHistory": rows[2:]})
        monkeypatch.setattr(aws, "client", lambda service, region: ec2)
        prices = aws.spot_prices("us-west-2", "trn1.32xlarge")
    assert prices == {"us-west-2a": 9.10, "us-west-2d": 8.25}


def test_spot_prices_through_moto(aws_read_only: None) -> None:
    prices = aws.spot_prices("us-west-2", "trn1.32xlarge")
    assert set(prices) == set(aws.offered_zones("us-west-2", "trn1.32xlarge"))
    assert all(p > 0 for p in prices.values())
