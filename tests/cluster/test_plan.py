"""`cluster plan`: every file written, pinned by golden files, valid against the published schemas."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import schemas
from tests.cluster.conftest import TRN1_ZONES, p5_config, tm, tm_here, trn1_config, trn2_config
from tests.golden import check
from trainmaster import api
from trainmaster.cluster import plan, spec, versions
from trainmaster.config import JobConfig

GOLDEN = Path(__file__).parent / "golden"
# Fixed endpoint CIDRs (the default looks up this machine's address) and both capacity kinds, so
# the goldens, the eksctl schema and cfn-lint see every field the plan can write.
TRN1_CASE = (
    'cluster.public_access_cidrs=["198.51.100.0/24", "203.0.113.7/32"]',
    "cluster.capacity_reservation_id=cr-0123456789abcdef0",
    'cluster.data_buckets=["trainmaster-data-bucket"]',
)
P5_CASE = (
    'cluster.public_access_cidrs=["192.0.2.0/28"]',
    "cluster.capacity_block_id=cr-0fedcba9876543210",
)
CASES = {
    "trn1": lambda: trn1_config(*TRN1_CASE),
    # TorchNeuron (beta), Neuron's chart, node repair, a Spot node group
    "trn2": lambda: trn2_config(
        'cluster.public_access_cidrs=["198.51.100.0/24"]', "cluster.spot=true"
    ),
    "p5": lambda: p5_config(*P5_CASE),
}
COMMON = [
    "cloudformation/accelerator-nodes.yaml",
    "eksctl/cluster.yaml",
    "eksctl/fsx-irsa.yaml",
    "eksctl/nodegroup.yaml",
    "helm/aws-fsx-csi-driver.yaml",
    "helm/efa-device-plugin.yaml",
    "image/Dockerfile.cpu",
    "image/Dockerfile.cuda",
    "image/Dockerfile.neuron",
    "image/Dockerfile.torchneuron",
    "k8s/claim.yaml",
    "k8s/node-marker.yaml",
    "k8s/job-progress.yaml",
    "k8s/node-watcher.yaml",
    "k8s/etcd.yaml",
    "k8s/queue.yaml",
    "k8s/storageclass.yaml",
    "k8s/tensorboard.yaml",
    "plan.json",
    "runbook.sh",
]


def files_of(cfg: JobConfig) -> dict[str, str]:
    return plan.build(spec.resolve(cfg))


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> tuple[str, JobConfig, dict[str, str]]:
    cfg = CASES[request.param]()
    return request.param, cfg, files_of(cfg)


def test_cli_plan_writes_every_file(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(api.init_job("trn1-bert-large"))
    out = tmp_path / "plan"
    result = tm(
        "cluster",
        "plan",
        str(job),
        "--out",
        str(out),
        "--set",
        f"cluster.zones={TRN1_ZONES}",
        "--set",
        'cluster.public_access_cidrs=["192.0.2.0/28"]',
    )  # no look-up in a subprocess
    assert result.returncode == 0, result.stderr
    expected = [*COMMON, "helm/neuron-helm-chart.yaml", "eksctl/npd-irsa.yaml"]
    for rel in expected:
        assert (out / rel).is_file(), rel
        assert rel in result.stdout
    assert sorted(
        str(p.relative_to(out))
        for p in out.rglob("*")
        if p.is_file() and not p.name.endswith(".dockerignore")
    ) == sorted(expected)
    assert (out / "runbook.sh").stat().st_mode & 0o111
    assert "2 x trn1.32xlarge in us-west-2 (us-west-2d" in result.stdout
    # the pins with the date each was checked, and why trn1 stays on its stack
    pin = rf"neuron_helm_chart +{re.escape(versions.NEURON_CHART_VERSION)}  checked 2026-12-06"
    assert re.search(pin, result.stdout), result.stdout
    assert versions.FROZEN_XLA_NOTE in result.stdout


def test_replanning_removes_files_the_new_plan_lacks(tmp_path: Path) -> None:
    plan.write_plan(trn1_config(), tmp_path)
    assert (tmp_path / "helm/neuron-helm-chart.yaml").exists()
    plan.write_plan(p5_config(), tmp_path)
    assert not (tmp_path / "helm/neuron-helm-chart.yaml").exists()
    assert (tmp_path / "helm/nvidia-device-plugin.yaml").exists()


def test_golden(case: tuple[str, JobConfig, dict[str, str]]) -> None:
    name, _, files = case
    for rel, text in files.items():
        check(GOLDEN / name / rel, text)


def test_eksctl_files_match_the_published_schema(
    case: tuple[str, JobConfig, dict[str, str]],
) -> None:
    _, _, files = case
    eksctl = [r for r in files if r.startswith("eksctl/")]  # s3-irsa.yaml with data_buckets
    assert {"eksctl/cluster.yaml", "eksctl/nodegroup.yaml"} <= set(eksctl)
    for rel in eksctl:
        schemas.validate_eksctl(yaml.safe_load(files[rel]))


def test_the_eksctl_schema_catches_a_typo(case: tuple[str, JobConfig, dict[str, str]]) -> None:
    ng = yaml.safe_load(case[2]["eksctl/nodegroup.yaml"])
    ng["managedNodeGroups"][0]["efaEnable"] = True
    assert schemas.errors_of(schemas.eksctl_validator(), ng)


def test_template_passes_cfn_lint(case: tuple[str, JobConfig, dict[str, str]]) -> None:
    _, cfg, files = case
    assert (
        schemas.cfn_lint(files["cloudformation/accelerator-nodes.yaml"], cfg.cluster.region) == []
    )


def test_cfn_lint_catches_a_broken_template() -> None:
    text = files_of(trn1_config())["cloudformation/accelerator-nodes.yaml"]
    broken = text.replace("HttpTokens: required", "HttpTokens: mandatory")
    assert any(f.startswith("E") for f in schemas.cfn_lint(broken, "us-west-2"))


def test_kubernetes_objects_are_valid(case: tuple[str, JobConfig, dict[str, str]]) -> None:
    _, cfg, files = case
    seen = 0
    for rel, text in files.items():
        if not rel.startswith("k8s/"):
            continue
        for obj in docs(text):
            if obj["kind"] == "Queue":
                schemas.validate_queue(obj)
            else:
                schemas.validate_k8s(obj, cfg.cluster.kubernetes_version)
            seen += 1
    assert seen >= 8


def test_strict_validation_catches_unknown_fields(
    case: tuple[str, JobConfig, dict[str, str]],
) -> None:
    import kubernetes_validate

    _, cfg, files = case
    queue = docs(files["k8s/queue.yaml"])[0]
    queue["spec"]["capabilities"] = {"cpu": "2"}
    assert schemas.errors_of(schemas.queue_validator(), queue)
    service = next(d for d in docs(files["k8s/etcd.yaml"]) if d["kind"] == "Service")
    service["spec"]["clusterIp"] = "None"
    with pytest.raises(kubernetes_validate.ValidationError):
        schemas.validate_k8s(service, cfg.cluster.kubernetes_version)


def test_nothing_is_unpinned(case: tuple[str, JobConfig, dict[str, str]]) -> None:
    _, _, files = case
    for rel, text in files.items():
        assert not re.search(r":latest\b|-latest\b|/master/|ref=master|\bpop /", text), rel
    runbook = files["runbook.sh"]
    installs = re.findall(r"helm upgrade --install .*", runbook)
    assert installs and all("--version " in line for line in installs)
    assert "volcano-sh/volcano/v1.15.1/installer" in runbook


def test_no_public_endpoints(case: tuple[str, JobConfig, dict[str, str]]) -> None:
    _, _, files = case
    for rel in ("k8s/etcd.yaml", "k8s/tensorboard.yaml"):
        for obj in docs(files[rel]):
            if obj["kind"] == "Service":
                assert obj["spec"]["type"] == "ClusterIP"
    template = yaml.safe_load(files["cloudformation/accelerator-nodes.yaml"])
    for name, res in template["Resources"].items():
        props = res.get("Properties", {})
        assert "CidrIp" not in props and "CidrIpv6" not in props, name
        assert props.get("FromPort") != 22, name
    assert "AmazonSSMManagedInstanceCore" in files["cloudformation/accelerator-nodes.yaml"]
    assert "AmazonFSxFullAccess" not in files["eksctl/fsx-irsa.yaml"]


def test_plan_says_who_reaches_the_api_endpoint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """12.9a: the endpoint is open to the looked-up address only, and the user is told."""
    job = tmp_path / "job.toml"
    job.write_text(api.init_job("trn1-bert-large"))
    monkeypatch.setattr(spec, "caller_cidr", lambda: "203.0.113.7/32")
    code, stdout, stderr = tm_here(
        capsys,
        "cluster",
        "plan",
        str(job),
        "--out",
        str(tmp_path / "plan"),
        "--set",
        f"cluster.zones={TRN1_ZONES}",
    )
    assert code == 0, stderr
    assert "note: the EKS API endpoint is public to 203.0.113.7/32 only" in stdout
    cluster = yaml.safe_load((tmp_path / "plan/eksctl/cluster.yaml").read_text())
    assert cluster["vpc"] == {
        "clusterEndpoints": {"privateAccess": True, "publicAccess": True},
        "publicAccessCIDRs": ["203.0.113.7/32"],
    }
    monkeypatch.setattr(spec, "caller_cidr", lambda: None)  # offline: refused, nothing written
    code, stdout, stderr = tm_here(
        capsys,
        "cluster",
        "plan",
        str(job),
        "--out",
        str(tmp_path / "other"),
        "--set",
        f"cluster.zones={TRN1_ZONES}",
    )
    assert (
        code == 2
        and "cluster.public_access_cidrs: could not learn this machine's public IP" in stderr
    )
    assert not (tmp_path / "other").exists()


def test_s3_reader_service_account_for_data_stage(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """30.8: pods cannot reach IMDS, so `data stage` reads S3 through IRSA: a service account
    whose role may read the job's data buckets, and nothing else."""
    files = files_of(trn1_config(*TRN1_CASE))
    cfg = yaml.safe_load(files["eksctl/s3-irsa.yaml"])
    schemas.validate_eksctl(cfg)
    [sa] = cfg["iam"]["serviceAccounts"]
    assert sa["metadata"] == {"name": "trainmaster-s3-reader", "namespace": "default"}
    statements = sa["attachPolicy"]["Statement"]
    actions = {a for st in statements for a in st["Action"]}
    assert actions == {"s3:GetObject", "s3:ListBucket"}
    resources = {r for st in statements for r in st["Resource"]}
    assert resources == {
        "arn:aws:s3:::trainmaster-data-bucket",
        "arn:aws:s3:::trainmaster-data-bucket/*",
    }
    assert "eksctl/s3-irsa.yaml" in files["runbook.sh"]
    assert "eksctl/s3-irsa.yaml" not in files_of(p5_config(*P5_CASE))  # no buckets: no role
    job = tmp_path / "job.toml"
    job.write_text(api.init_job("trn1-bert-large"))
    code, out, err = tm_here(
        capsys,
        "cluster",
        "plan",
        str(job),
        "--out",
        str(tmp_path / "plan"),
        "--set",
        f"cluster.zones={TRN1_ZONES}",
        "--set",
        'cluster.data_buckets=["trainmaster-data-bucket"]',
    )
    assert code == 0, err
    assert "data stage reads s3://trainmaster-data-bucket through service account" in out
    assert "trainmaster-s3-reader" in out


def test_bad_data_bucket_is_refused() -> None:
    from trainmaster.errors import ConfigError

    with pytest.raises(
        ConfigError, match="cluster.data_buckets: 'Not_A_Bucket' is not an S3 bucket"
    ):
        files_of(trn1_config('cluster.data_buckets=["Not_A_Bucket"]'))


def test_spot_puts_the_accelerator_node_group_on_spot_and_nothing_else() -> None:
    """cluster.spot is eksctl's own `spot: true` on the accelerator node group (the schema and
    cfn-lint see it in the trn2 golden); the system node group stays on-demand."""
    on = files_of(trn2_config("cluster.spot=true"))
    off = files_of(trn2_config())
    ng = docs(on["eksctl/nodegroup.yaml"])[0]["managedNodeGroups"]
    assert [g.get("spot") for g in ng] == [True]
    assert "spot" not in docs(off["eksctl/nodegroup.yaml"])[0]["managedNodeGroups"][0]
    system = docs(on["eksctl/cluster.yaml"])[0]["managedNodeGroups"]
    assert system and all("spot" not in g for g in system)
