"""AWS look-ups with boto3, each failure turned into one line a user can act on.

What is looked up instead of hard-coded: the zones where the instance type is offered (the
tutorial knew two zone IDs in two regions), the ECR repository, the EKS cluster and its node
groups, the node stack, and the FSx file systems in the cluster's VPC (what `cluster down`
must not leave behind). Missing credentials and refused permissions name what to fix: the
profile to configure, or the IAM action that was denied.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, cast

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)

from trainmaster.errors import UserError

T = TypeVar("T")
DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedAccess"}
BAD_CREDENTIALS = {
    "UnrecognizedClientException",
    "InvalidClientTokenId",
    "ExpiredToken",
    "ExpiredTokenException",
    "AuthFailure",
    "SignatureDoesNotMatch",
}
NOT_FOUND = {
    "ResourceNotFoundException",
    "RepositoryNotFoundException",
    "ImageNotFoundException",
    "FileSystemNotFound",
    "ValidationError",
    "ParameterNotFound",
}
FIX_CREDENTIALS = (
    "configure credentials: `aws configure sso` (or `aws configure`), or set "
    "AWS_PROFILE; no administrator user's static keys are needed"
)
CLUSTER_TAG = "trainmaster.io/cluster"
# eksctl's list of zones whose EKS control plane capacity is exhausted (pkg/az/az.go).
AVOID_ZONE_IDS = {"use1-az3", "usw1-az2", "cac1-az3"}


def client(service: str, region: str) -> Any:
    """A client from boto3's default session (its service models load once per process)."""
    factory = cast(Any, boto3.client)  # the stubs want a literal service name
    return factory(
        service, region_name=region, config=Config(retries={"max_attempts": 5, "mode": "standard"})
    )


def call(action: str, fn: Callable[..., T], /, **kwargs: Any) -> T:
    """Call one API operation; `action` is its IAM name (e.g. ec2:DescribeInstanceTypeOfferings)."""
    try:
        return fn(**kwargs)
    except (NoCredentialsError, PartialCredentialsError) as exc:
        raise UserError(f"no AWS credentials for {action}; {FIX_CREDENTIALS}", where="aws") from exc
    except NoRegionError as exc:
        raise UserError("no AWS region; set cluster.region in the job file", where="aws") from exc
    except EndpointConnectionError as exc:
        raise UserError(
            f"cannot reach AWS ({exc}); check the network and cluster.region", where="aws"
        ) from exc
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        message = exc.response.get("Error", {}).get("Message", "")
        if code in DENIED:
            raise UserError(
                f"permission denied: the IAM principal may not call {action}; "
                f"allow {action} in its policy ({code})",
                where="aws",
            ) from exc
        if code in BAD_CREDENTIALS:
            raise UserError(
                f"AWS refused the credentials ({code}: {message}); {FIX_CREDENTIALS}", where="aws"
            ) from exc
        raise
    except BotoCoreError as exc:
        raise UserError(f"{action} failed: {exc}", where="aws") from exc


def _missing(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code", "") in NOT_FOUND


# --- zones -------------------------------------------------------------------------------------


def offered_zones(region: str, instance_type: str) -> list[str]:
    """Zone names of the region where the instance type is offered (sorted)."""
    ec2 = client("ec2", region)
    zones: set[str] = set()
    kwargs: dict[str, Any] = {
        "LocationType": "availability-zone",
        "Filters": [{"Name": "instance-type", "Values": [instance_type]}],
    }
    while True:
        page = call(
            "ec2:DescribeInstanceTypeOfferings", ec2.describe_instance_type_offerings, **kwargs
        )
        zones.update(o["Location"] for o in page.get("InstanceTypeOfferings", []))
        if not page.get("NextToken"):
            return sorted(zones)
        kwargs["NextToken"] = page["NextToken"]


def spot_prices(region: str, instance_type: str) -> dict[str, float]:
    """The instance type's Spot price now (USD per hour, Linux) in each zone of the region
    that sells it: the newest price EC2 reports per zone (DescribeSpotPriceHistory)."""
    ec2 = client("ec2", region)
    newest: dict[str, tuple[Any, float]] = {}
    kwargs: dict[str, Any] = {
        "InstanceTypes": [instance_type],
        "ProductDescriptions": ["Linux/UNIX"],
        "StartTime": datetime.now(UTC),  # from now: each zone's current price
    }
    while True:
        page = call("ec2:DescribeSpotPriceHistory", ec2.describe_spot_price_history, **kwargs)
        for row in page.get("SpotPriceHistory", []):
            zone, at = row["AvailabilityZone"], row.get("Timestamp")
            if zone not in newest or (at is not None and at > newest[zone][0]):
                newest[zone] = (at, float(row["SpotPrice"]))
        if not page.get("NextToken"):
            return {zone: price for zone, (_, price) in sorted(newest.items())}
        kwargs["NextToken"] = page["NextToken"]


def usable_zones(region: str) -> list[str]:
    """Available zones of the region that can host an EKS control plane (sorted by name)."""
    ec2 = client("ec2", region)
    page = call(
        "ec2:DescribeAvailabilityZones",
        ec2.describe_availability_zones,
        Filters=[
            {"Name": "state", "Values": ["available"]},
            {"Name": "zone-type", "Values": ["availability-zone"]},
        ],
    )
    return sorted(
        z["ZoneName"]
        for z in page.get("AvailabilityZones", [])
        if z.get("ZoneId") not in AVOID_ZONE_IDS
    )


# --- ECR -----------------------------------------------------------------------------------------


def ecr_repository(region: str, name: str, *, create: bool = False) -> str | None:
    """The repository's URI; created (scan on push, immutable tags off) when asked and missing."""
    ecr = client("ecr", region)
    try:
        page = call("ecr:DescribeRepositories", ecr.describe_repositories, repositoryNames=[name])
        return str(page["repositories"][0]["repositoryUri"])
    except ClientError as exc:
        if not _missing(exc):
            raise
    if not create:
        return None
    made = call(
        "ecr:CreateRepository",
        ecr.create_repository,
        repositoryName=name,
        imageScanningConfiguration={"scanOnPush": True},
    )
    return str(made["repository"]["repositoryUri"])


def ecr_image_tags(region: str, name: str) -> list[str]:
    ecr = client("ecr", region)
    try:
        page = call("ecr:DescribeImages", ecr.describe_images, repositoryName=name)
    except ClientError as exc:
        if _missing(exc):
            return []
        raise
    return sorted(t for d in page.get("imageDetails", []) for t in d.get("imageTags", []))


def ecr_image_digest(region: str, name: str, tag: str) -> str | None:
    """The manifest digest (sha256:...) the tag points at now, or None when it is not pushed.

    Jobs pin `repo@digest`, not `repo:tag`: `cluster up` pushes the same `<version>-<flavour>`
    tag again on every build, so nodes that pulled earlier would run another image than nodes
    that pull later. The digest ECR reports is the registry's manifest digest, the one a pull
    by digest resolves (https://docs.aws.amazon.com/AmazonECR/latest/APIReference/API_ImageDetail.html).
    """
    ecr = client("ecr", region)
    try:
        page = call(
            "ecr:DescribeImages",
            ecr.describe_images,
            repositoryName=name,
            imageIds=[{"imageTag": tag}],
        )
    except ClientError as exc:
        if _missing(exc):
            return None
        raise
    details = page.get("imageDetails", [])
    return str(details[0]["imageDigest"]) if details else None


# --- EKS, CloudFormation, FSx ------------------------------------------------------------------


def eks_cluster(region: str, name: str) -> dict[str, Any] | None:
    """describe-cluster's `cluster`, or None when there is no such cluster."""
    eks = client("eks", region)
    try:
        return dict(call("eks:DescribeCluster", eks.describe_cluster, name=name)["cluster"])
    except ClientError as exc:
        if _missing(exc):
            return None
        raise


def eks_nodegroups(region: str, cluster: str) -> list[dict[str, Any]]:
    eks = client("eks", region)
    try:
        names = call("eks:ListNodegroups", eks.list_nodegroups, clusterName=cluster)["nodegroups"]
    except ClientError as exc:
        if _missing(exc):
            return []
        raise
    return [
        dict(
            call(
                "eks:DescribeNodegroup",
                eks.describe_nodegroup,
                clusterName=cluster,
                nodegroupName=n,
            )["nodegroup"]
        )
        for n in sorted(names)
    ]


def stack(region: str, name: str) -> dict[str, Any] | None:
    cfn = client("cloudformation", region)
    try:
        page = call("cloudformation:DescribeStacks", cfn.describe_stacks, StackName=name)
    except ClientError as exc:
        if _missing(exc):
            return None
        raise
    stacks = page.get("Stacks", [])
    return dict(stacks[0]) if stacks else None


def file_systems(region: str, cluster: str, vpc_id: str | None = None) -> list[dict[str, Any]]:
    """FSx file systems of the cluster: tagged trainmaster.io/cluster=NAME (the StorageClass tags
    what it provisions), or in the cluster's VPC. What `cluster down` must not leave behind."""
    fsx = client("fsx", region)
    found: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {}
    while True:
        page = call("fsx:DescribeFileSystems", fsx.describe_file_systems, **kwargs)
        for f in page.get("FileSystems", []):
            tags = {t.get("Key"): t.get("Value") for t in f.get("Tags", [])}
            if tags.get(CLUSTER_TAG) == cluster or (vpc_id and f.get("VpcId") == vpc_id):
                found.append(dict(f))
        if not page.get("NextToken"):
            return found
        kwargs["NextToken"] = page["NextToken"]


def wait_file_systems_deleted(
    region: str,
    cluster: str,
    ids: Sequence[str] = (),
    *,
    timeout_s: float = 1800,
    interval_s: float = 30,
    progress: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once the file systems `ids`, and every file system of the cluster that is DELETING,
    are gone; UserError naming them after timeout_s.

    Why: the PV disappears as soon as the FSx CSI driver's DeleteVolume has *started*
    DeleteFileSystem (the call returns while the file system is DELETING, which takes minutes), and
    the Lustre security group stays in use by the file system's network interfaces until it is gone:
    deleting the node stack then fails with DependencyViolation. (DeleteFileSystem "returns while the
    file system has the DELETING status": https://docs.aws.amazon.com/fsx/latest/APIReference/API_DeleteFileSystem.html ;
    the driver calls it and returns: github.com/kubernetes-sigs/aws-fsx-csi-driver pkg/cloud/cloud.go
    DeleteFileSystem, called by DeleteVolume in pkg/driver/controller.go.)
    A tagged file system that is not being deleted is left to the `down-leftovers` report.
    """
    wanted = set(ids)
    deadline = clock() + timeout_s
    while True:
        left = sorted(
            f"{f['FileSystemId']} ({f.get('Lifecycle', '?')})"
            for f in file_systems(region, cluster)
            if f.get("FileSystemId") in wanted or f.get("Lifecycle") == "DELETING"
        )
        if not left:
            return
        remaining = deadline - clock()
        if remaining <= 0:
            raise UserError(
                f"FSx file system(s) still not deleted after {timeout_s:.0f} s: "
                f"{', '.join(left)}; check the FSx console, then run `cluster down` again",
                where="aws",
            )
        progress(
            f"waiting for FSx file system(s) to be deleted: {', '.join(left)} "
            f"({remaining:.0f} s left)"
        )
        sleep(min(interval_s, remaining))


# --- S3 reads of `data stage` ------------------------------------------------------------------
# The stage pod runs `python3 -m trainmaster.cluster.aws s3 cp|sync ...` (backends/kubernetes/
# stage.py): boto3 comes with trainmaster, so every training image has it, while only the
# Neuron image has the AWS CLI. Credentials: boto3's default chain, i.e. the web
# identity token that IRSA puts into the pod (AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE).


def _s3(unsigned: bool) -> Any:
    from botocore import UNSIGNED

    extra: dict[str, Any] = {"signature_version": UNSIGNED} if unsigned else {}
    factory = cast(Any, boto3.client)
    return factory("s3", config=Config(retries={"max_attempts": 5, "mode": "standard"}, **extra))


def _split(url: str) -> tuple[str, str]:
    if not url.startswith("s3://"):
        raise UserError(f"{url!r} is not an s3:// URL", where="SRC")
    bucket, _, key = url[5:].partition("/")
    return bucket, key


def _s3_call(url: str, action: str, fn: Callable[..., T], /, **kwargs: Any) -> T:
    try:
        return call(action, fn, **kwargs)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        raise UserError(
            f"cannot read {url} ({code or exc}); the stage pod reads S3 through its service "
            "account: list the bucket in cluster.data_buckets (then `cluster up` again) or set "
            "kubernetes.service_account, or use --no-sign-request for a public bucket",
            where="SRC",
        ) from exc


def s3_cat(url: str, out: Any, *, unsigned: bool = False) -> None:
    """The object's bytes to a binary file object, streamed (`aws s3 cp URL -`)."""
    bucket, key = _split(url)
    body = _s3_call(url, "s3:GetObject", _s3(unsigned).get_object, Bucket=bucket, Key=key)["Body"]
    for chunk in iter(lambda: body.read(1 << 20), b""):
        out.write(chunk)


def s3_sync(url: str, dest: Path | str, *, unsigned: bool = False) -> int:
    """Every object under the prefix into dest, by relative key (`aws s3 sync URL DIR`); the
    number of files."""
    bucket, prefix = _split(url)
    prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    s3, root, count = _s3(unsigned), Path(dest).resolve(), 0
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
    while True:
        page = _s3_call(url, "s3:ListBucket", s3.list_objects_v2, **kwargs)
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix) :]
            target = (root / rel).resolve()
            if not rel or rel.endswith("/") or not target.is_relative_to(root):
                continue  # folder markers; a key that would land outside dest
            target.parent.mkdir(parents=True, exist_ok=True)
            key = obj["Key"]
            _s3_call(
                url, "s3:GetObject", s3.download_file, Bucket=bucket, Key=key, Filename=str(target)
            )
            count += 1
        if not page.get("IsTruncated"):
            return count
        kwargs["ContinuationToken"] = page["NextContinuationToken"]


def s3_put_tree(folder: Path, url: str, manifest_name: str, manifest: dict[str, Any]) -> int:
    """Upload folder's files under the URL's prefix, S3 checking each file's SHA-256 as it
    arrives (ChecksumSHA256 from the manifest), then the manifest itself: last, so that a
    manifest in S3 says every file before it is there. Returns the number of files."""
    import base64

    bucket, prefix = _split(url)
    prefix = prefix.rstrip("/")
    s3 = _s3(False)
    for rel, (_size, digest) in manifest["files"].items():
        checksum = base64.b64encode(bytes.fromhex(digest)).decode()
        with (folder / rel).open("rb") as body:
            _s3_put(
                url, s3, Bucket=bucket, Key=f"{prefix}/{rel}", Body=body, ChecksumSHA256=checksum
            )
    text = json.dumps(manifest, indent=1).encode()
    _s3_put(url, s3, Bucket=bucket, Key=f"{prefix}/{manifest_name}", Body=text)
    return len(manifest["files"])


def _s3_put(url: str, s3: Any, **kwargs: Any) -> None:
    try:
        call("s3:PutObject", s3.put_object, **kwargs)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        raise UserError(f"cannot write {url} ({code or exc})", where="DEST") from exc


def main(argv: Sequence[str]) -> int:
    """`s3 cp URL - [--no-sign-request]` | `s3 sync URL DIR [--no-progress] [--no-sign-request]`."""
    import sys

    args = [a for a in argv if a not in ("--no-sign-request", "--no-progress")]
    unsigned = "--no-sign-request" in argv
    try:
        if args[:2] == ["s3", "cp"] and len(args) == 4 and args[3] == "-":
            s3_cat(args[2], sys.stdout.buffer, unsigned=unsigned)
            sys.stdout.buffer.flush()
        elif args[:2] == ["s3", "sync"] and len(args) == 4:
            print(f"{s3_sync(args[2], args[3], unsigned=unsigned)} file(s) from {args[2]}")
        else:
            print(f"usage: {main.__doc__}", file=sys.stderr)
            return 2
    except UserError as exc:
        print(f"trainmaster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
