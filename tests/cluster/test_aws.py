"""boto3 look-ups against moto, and the errors a user sees when AWS says no."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from tests.cluster.conftest import trn1_config
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
    eks.create_nodegroup(clusterName="tm", nodegroupName="trn1-32xlarge", nodeRole=role,
                         subnets=[subnet], scalingConfig={"minSize": 2, "maxSize": 2, "desiredSize": 2})
    cluster = aws.eks_cluster("us-west-2", "tm")
    assert cluster and cluster["name"] == "tm"
    assert [ng["nodegroupName"] for ng in aws.eks_nodegroups("us-west-2", "tm")] == ["trn1-32xlarge"]
    fsx = boto3.client("fsx", region_name="us-west-2")
    made = fsx.create_file_system(FileSystemType="LUSTRE", StorageCapacity=1200, SubnetIds=[subnet],
                                  LustreConfiguration={"DeploymentType": "PERSISTENT_2",
                                                       "PerUnitStorageThroughput": 250},
                                  Tags=[{"Key": "trainmaster.io/cluster", "Value": "tm"}])
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


def test_plan_without_credentials_says_how_to_avoid_the_look_up(no_credentials: None, tmp_path: Path) -> None:
    with pytest.raises(UserError) as err:
        plan.write_plan(trn1_config("cluster.zones=[]"), tmp_path)
    assert "credentials" in str(err.value)


@pytest.mark.parametrize(("code", "operation", "action", "call"), [
    ("UnauthorizedOperation", "describe_instance_type_offerings", "ec2:DescribeInstanceTypeOfferings",
     lambda: aws.offered_zones("us-west-2", "trn1.32xlarge")),
    ("AccessDeniedException", "describe_cluster", "eks:DescribeCluster",
     lambda: aws.eks_cluster("us-west-2", "tm")),
    ("AccessDeniedException", "describe_repositories", "ecr:DescribeRepositories",
     lambda: aws.ecr_repository("us-west-2", "trainmaster")),
    ("AccessDenied", "describe_file_systems", "fsx:DescribeFileSystems",
     lambda: aws.file_systems("us-west-2", "tm")),
])
def test_denied_names_the_iam_action(monkeypatch: pytest.MonkeyPatch, code: str, operation: str,
                                     action: str, call: Any) -> None:
    service = action.split(":")[0]
    client = boto3.client(service, region_name="us-west-2", aws_access_key_id="x",
                          aws_secret_access_key="x")
    stubber = Stubber(client)
    stubber.add_client_error(operation, service_error_code=code, service_message="not allowed")
    stubber.activate()
    monkeypatch.setattr(aws, "client", lambda _service, _region: client)
    with pytest.raises(UserError) as err:
        call()
    assert action in str(err.value) and "permission denied" in str(err.value)


def test_expired_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    client = boto3.client("eks", region_name="us-west-2", aws_access_key_id="x", aws_secret_access_key="x")
    stubber = Stubber(client)
    stubber.add_client_error("describe_cluster", service_error_code="ExpiredTokenException",
                             service_message="The security token included in the request is expired")
    stubber.activate()
    monkeypatch.setattr(aws, "client", lambda _service, _region: client)
    with pytest.raises(UserError) as err:
        aws.eks_cluster("us-west-2", "tm")
    assert "refused the credentials" in str(err.value) and "expired" in str(err.value)
