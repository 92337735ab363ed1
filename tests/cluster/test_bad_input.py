"""Bad input to `cluster plan`: one clear line naming the field, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.conftest import TRN1_ZONES, tm, tm_here, trn1_config
from tests.conftest import assert_user_error
from trainmaster import api
from trainmaster.cluster import plan, spec
from trainmaster.errors import ConfigError


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("job") / "job.toml"
    path.write_text(api.init_job("trn1-bert-large"))
    return path


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("cluster.nodes=0", "cluster.nodes: input should be greater than 0"),
        (
            'cluster.kubernetes_version="1.29"',
            "cluster.kubernetes_version: EKS 1.29 is not in standard or extended support",
        ),
        (
            'cluster.kubernetes_version="1.40"',
            "cluster.kubernetes_version: EKS 1.40 is not in standard or extended support",
        ),
        ('cluster.name="my_cluster"', "cluster.name: string should match pattern"),
        (
            'cluster.name="' + "a" * 41 + '"',
            "cluster.name: '" + "a" * 41 + "' has 41 characters; use at most 40",
        ),
        ('cluster.name="trn-"', "cluster.name: 'trn-' is not a valid EKS cluster name"),
        ('cluster.name="a--b"', "cluster.name: 'a--b' is not a valid EKS cluster name"),
        ("cluster.nodes=1", "cluster.nodes: 1 nodes, but the job needs job.nnodes = 2"),
        ('cluster.zones=["us-west-2d"]', "cluster.zones: EKS needs at least two zones"),
        (
            'cluster.zones=["us-east-1a", "us-east-1b"]',
            "cluster.zones: 'us-east-1a' is not an availability zone of us-west-2",
        ),
        ('cluster.zones=["us-west-2a", "us-west-2a"]', "cluster.zones: a zone is listed twice"),
        (
            'kubernetes.queue="Big_Queue"',
            "kubernetes.queue: 'Big_Queue' is not a valid Kubernetes name",
        ),
        ('kubernetes.mount="data"', "kubernetes.mount: 'data' is not an absolute path"),
        (
            'cluster.public_access_cidrs=["10.0.0.1/8"]',
            "cluster.public_access_cidrs: '10.0.0.1/8' is not an IPv4 CIDR block",
        ),
        (
            'cluster.public_access_cidrs=["my-office"]',
            "cluster.public_access_cidrs: 'my-office' is not an IPv4 CIDR block",
        ),
        (
            'cluster.public_access_cidrs=["2001:db8::/32"]',
            "cluster.public_access_cidrs: '2001:db8::/32' is not an IPv4 CIDR block",
        ),
        (
            'cluster.public_access_cidrs=["0.0.0.0/0"]',
            "cluster.public_access_cidrs: 0.0.0.0/0 opens the API endpoint to the whole internet",
        ),
        (
            'cluster.public_access_cidrs=["1.2.3.4/32", "1.2.3.4/32"]',
            "cluster.public_access_cidrs: a CIDR is listed twice",
        ),
        (
            "cluster.public_access_cidrs=[]",
            "cluster.public_access_cidrs: eksctl cannot create a cluster with a private-only API endpoint",
        ),
        (
            'cluster.capacity_reservation_id="0123456789abcdef0"',
            "cluster.capacity_reservation_id: '0123456789abcdef0' is not a capacity reservation id",
        ),
        (
            'cluster.capacity_block_id="cr-XYZ"',
            "cluster.capacity_block_id: 'cr-XYZ' is not a capacity reservation id",
        ),
    ],
)
def test_plan_refuses(
    capsys: pytest.CaptureFixture[str], job: Path, tmp_path: Path, override: str, expected: str
) -> None:
    out = tmp_path / "plan"
    code, stdout, stderr = tm_here(
        capsys,
        "cluster",
        "plan",
        str(job),
        "--out",
        str(out),
        "--set",
        f"cluster.zones={TRN1_ZONES}",
        "--set",
        override,
    )
    assert code == 2, stdout + stderr
    assert expected in stderr
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["cluster.spot=true", "cluster.capacity_block_id=cr-0fedcba9876543210"],
            "cluster.spot: cluster.spot runs the nodes on Spot capacity, which a capacity "
            "reservation or block is not",
        ),
        (
            ["cluster.spot=true", "kubernetes.stop_grace_s=115"],
            "kubernetes.stop_grace_s: 115 s does not fit in the 120 s a Spot node has after "
            "its notice (cluster.spot); use at most 110",
        ),
    ],
)
def test_spot_refuses_what_its_notice_cannot_hold(
    capsys: pytest.CaptureFixture[str],
    job: Path,
    tmp_path: Path,
    overrides: list[str],
    expected: str,
) -> None:
    out = tmp_path / "plan"
    sets = [a for o in overrides for a in ("--set", o)]
    code, stdout, stderr = tm_here(
        capsys, "cluster", "plan", str(job), "--out", str(out), "--set",
        f"cluster.zones={TRN1_ZONES}", *sets,
    )  # fmt: skip
    assert code == 2, stdout + stderr
    assert expected in stderr and stderr.count("\n") == 1 and "Traceback" not in stderr
    assert not out.exists()


def test_bad_input_through_the_installed_command(job: Path, tmp_path: Path) -> None:
    result = tm(
        "cluster",
        "plan",
        str(job),
        "--out",
        str(tmp_path / "plan"),
        "--set",
        f"cluster.zones={TRN1_ZONES}",
        "--set",
        'cluster.kubernetes_version="1.29"',
    )
    line = assert_user_error(result, where="job.toml: cluster.kubernetes_version")
    assert line.startswith(
        "error: job.toml: cluster.kubernetes_version: EKS 1.29 is not in standard or extended "
        "support on "
    )
    assert result.stderr.count("\n") == 1 and "use 1." in result.stderr  # one line, the range


def test_cpu_is_not_a_cluster_instance_type() -> None:
    cfg = trn1_config(
        'kubernetes.instance_type="cpu"',
        "job.nproc_per_node=1",
        "train.global_batch_size=32",
        'train.device="cpu"',
    )
    with pytest.raises(ConfigError, match="'cpu' is not an accelerator instance type"):
        spec.resolve(cfg)


def test_region_without_the_instance_type(aws_read_only: None, tmp_path: Path) -> None:
    cfg = trn1_config('cluster.region="eu-west-3"', "cluster.zones=[]")
    with pytest.raises(ConfigError) as err:
        plan.write_plan(cfg, tmp_path / "plan")
    assert str(err.value).startswith("cluster.region: trn1.32xlarge is not offered in eu-west-3")
    assert not (tmp_path / "plan").exists()


def test_plan_into_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(ConfigError.__mro__[1], match="not a folder"):
        plan.write_plan(trn1_config(), target)


def test_one_kind_of_capacity_only() -> None:
    cfg = trn1_config(
        'cluster.capacity_block_id="cr-0123456789abcdef0"',
        'cluster.capacity_reservation_id="cr-0123456789abcdef1"',
    )
    with pytest.raises(
        ConfigError,
        match="set either cluster.capacity_reservation_id or cluster.capacity_block_id, not both",
    ):
        spec.resolve(cfg, cidr_lookup=lambda: "203.0.113.7/32")
