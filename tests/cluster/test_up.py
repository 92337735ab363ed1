"""`cluster up | down | scale` through the real CLI, running the real runbook.sh against fake tools."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from tests.cluster.conftest import tm, trn1_config
from tests.conftest import assert_user_error
from trainmaster.cluster import plan, up
from trainmaster.errors import UserError


@pytest.fixture
def plan_dir(tmp_path: Path) -> Path:
    plan.write_plan(trn1_config(), tmp_path / "plan")
    return tmp_path / "plan"


def calls(fake_tools: dict[str, str]) -> list[str]:
    path = Path(fake_tools["FAKE_LOG"])
    return path.read_text().splitlines() if path.exists() else []


def index(lines: list[str], prefix: str) -> int:
    return next(i for i, line in enumerate(lines) if line.startswith(prefix))


def test_up_runs_every_step_in_order(plan_dir: Path, fake_tools: dict[str, str]) -> None:
    result = tm("cluster", "up", "--plan", str(plan_dir), env=fake_tools)
    assert result.returncode == 0, result.stdout + result.stderr
    log = calls(fake_tools)
    order = [
        "aws ecr create-repository",
        "eksctl create cluster",
        "aws cloudformation deploy",
        "eksctl create nodegroup",
        "eksctl create iamserviceaccount",  # the Neuron NPD's IRSA (the FSx one comes later)
        "helm upgrade --install neuron-helm-chart oci://public.ecr.aws/neuron/neuron-helm-chart",
        "helm upgrade --install aws-efa-k8s-device-plugin",
        "kubectl apply -f " + str(plan_dir / "k8s/etcd.yaml"),
        "kubectl apply --server-side -f https://raw.githubusercontent.com/volcano-sh/volcano/v1.15.1",
        "helm upgrade --install aws-fsx-csi-driver",
        "docker build --platform linux/amd64",
        "docker push",
    ]
    positions = [index(log, p) for p in order]
    assert positions == sorted(positions)
    assert "[21/21] summary" in result.stdout
    assert "port-forward service/tensorboard 6006:6006" in result.stdout
    # 17.10: what runs is pinned by digest (the tag is pushed again by every build)
    pinned = f"123456789012.dkr.ecr.us-west-2.amazonaws.com/trainmaster@sha256:{7:064d}"
    assert f"--set kubernetes.image={pinned}" in result.stdout
    assert (plan_dir / ".state/image").read_text().strip() == pinned
    assert f"image: '{pinned}'" in (plan_dir / ".rendered/k8s/tensorboard.yaml").read_text()
    storage = (plan_dir / ".rendered/k8s/storageclass.yaml").read_text()
    assert "subnetId: 'subnet-accel'" in storage and "securityGroupIds: 'sg-lustre'" in storage
    state = json.loads((plan_dir / ".state/up.json").read_text())
    assert state["failed"] is None and len(state["done"]) == 21


def test_up_resumes_after_a_failure(plan_dir: Path, fake_tools: dict[str, str]) -> None:
    env = {**fake_tools, "FAKE_FAIL": "eksctl create nodegroup"}
    first = tm("cluster", "up", "--plan", str(plan_dir), env=env)
    assert first.returncode == 1
    assert "step nodegroup failed" in first.stderr and "nodegroup.log" in first.stderr
    assert "simulated failure" in first.stdout  # the failed step's last lines
    assert json.loads((plan_dir / ".state/up.json").read_text())["failed"] == "nodegroup"
    second = tm("cluster", "up", "--plan", str(plan_dir), env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resuming: 5 of 21 steps done earlier" in second.stdout
    log = calls(fake_tools)
    assert sum(line.startswith("eksctl create cluster") for line in log) == 1
    assert sum(line.startswith("eksctl create nodegroup") for line in log) == 2


def test_up_skips_what_exists(plan_dir: Path, fake_tools: dict[str, str]) -> None:
    for marker in ("ecr", "cluster", "stack"):
        (Path(fake_tools["FAKE_DIR"]) / marker).touch()
    result = tm("cluster", "up", "--plan", plan_dir.name, env=fake_tools, cwd=plan_dir.parent)
    assert result.returncode == 0, result.stderr
    log = calls(fake_tools)
    assert not any(
        line.startswith(
            ("eksctl create cluster", "aws ecr create-repository", "aws cloudformation deploy")
        )
        for line in log
    )
    assert (
        "cluster: EKS control plane, OIDC, system node group (eksctl, 10-15 min) (exists, skipped)"
        in result.stdout
    )


def test_dry_run_prints_commands_and_runs_nothing(
    plan_dir: Path, fake_tools: dict[str, str]
) -> None:
    result = tm("cluster", "up", "--plan", str(plan_dir), "--dry-run", env=fake_tools)
    assert result.returncode == 0, result.stderr
    assert calls(fake_tools) == []
    assert 'eksctl create cluster --config-file "$PLAN_DIR/eksctl/cluster.yaml"' in result.stdout
    assert (
        "helm upgrade --install aws-fsx-csi-driver aws-fsx-csi-driver/aws-fsx-csi-driver --version 1.17.0"
        in result.stdout
    )
    assert "# [21/21] summary" in result.stdout
    down = tm("cluster", "down", "--plan", str(plan_dir), "--dry-run", env=fake_tools)
    assert (
        down.returncode == 0 and "eksctl delete cluster" in down.stdout and calls(fake_tools) == []
    )


def test_missing_tools_are_named_with_how_to_install(plan_dir: Path) -> None:
    loaded = plan.load_plan(plan_dir)
    present = {"bash", "aws", "kubectl"}
    with pytest.raises(UserError) as err:
        up.up(loaded, Console(), which=lambda t: t if t in present else None)
    message = str(err.value)
    for tool, hint in (
        ("eksctl", "https://eksctl.io"),
        ("helm", "helm.sh"),
        ("docker", "docs.docker.com"),
    ):
        assert tool in message and hint in message
    assert "kubectl" not in message


def test_down_follows_the_tutorial_order(plan_dir: Path, fake_tools: dict[str, str]) -> None:
    assert tm("cluster", "up", "--plan", str(plan_dir), env=fake_tools).returncode == 0
    env = {**fake_tools, "FAKE_K8S_EXISTS": "1"}
    result = tm("cluster", "down", "--plan", str(plan_dir), "--yes", "--discard-data", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    log = calls(fake_tools)
    start = index(log, "kubectl delete -f " + str(plan_dir / "k8s/tensorboard.yaml"))
    order = [
        "kubectl delete -f " + str(plan_dir / "k8s/tensorboard.yaml"),
        "kubectl --namespace default delete jobs.batch.volcano.sh --all",
        "kubectl --namespace default delete pods --all",
        "kubectl delete -f " + str(plan_dir / "k8s/storageclass.yaml"),
        "kubectl delete -f " + str(plan_dir / "k8s/claim.yaml"),
        "kubectl wait --for=delete pv/pv-fake",
        "trainmaster cluster wait-fsx --region us-west-2 --cluster trainmaster-trn1 --file-system-id fs-0fake",
        "eksctl delete nodegroup",
        "aws cloudformation delete-stack",
        "aws cloudformation wait stack-delete-complete",
        "eksctl delete cluster",
        "aws ecr delete-repository",
        "aws fsx describe-file-systems",
    ]
    positions = [index(log[start:], p) for p in order]
    assert positions == sorted(positions)
    # everything is gone: a new `up` checks every step again instead of trusting old progress
    assert not (plan_dir / ".state/up.json").exists()


def test_down_reports_file_systems_left_behind(plan_dir: Path, fake_tools: dict[str, str]) -> None:
    result = tm(
        "cluster",
        "down",
        "--plan",
        str(plan_dir),
        "--yes",
        "--discard-data",
        env={**fake_tools, "FAKE_LEFTOVER": "fs-0123456789abcdef0"},
    )
    assert result.returncode == 1
    assert "fs-0123456789abcdef0" in result.stdout and "down-leftovers" in result.stderr


def test_down_asks_first(plan_dir: Path, fake_tools: dict[str, str]) -> None:
    result = tm(
        "cluster", "down", "--plan", str(plan_dir), "--discard-data", env=fake_tools, stdin=""
    )
    assert_user_error(result, "confirmation", where="--yes")
    assert calls(fake_tools) == []


def test_scale(plan_dir: Path, fake_tools: dict[str, str]) -> None:
    result = tm("cluster", "scale", "--nodes", "4", "--plan", str(plan_dir), env=fake_tools)
    assert result.returncode == 0, result.stderr
    assert calls(fake_tools) == [
        "eksctl scale nodegroup --cluster trainmaster-trn1 --region us-west-2 "
        "--name trn1-32xlarge --nodes 4 --nodes-min 4 --nodes-max 4"
    ]
    bad = tm("cluster", "scale", "--nodes", "-1", "--plan", str(plan_dir), env=fake_tools)
    assert_user_error(bad, "--nodes")


def test_commands_without_a_plan_say_how_to_make_one(tmp_path: Path) -> None:
    result = tm("cluster", "up", "--plan", str(tmp_path / "nowhere"))
    assert_user_error(result, "trainmaster cluster plan")


def test_down_keeps_the_runs_or_asks_to_discard_them(
    plan_dir: Path, fake_tools: dict[str, str]
) -> None:
    """Without cluster.results_bucket the checkpoints would go with the file system."""
    refused = tm("cluster", "down", "--plan", str(plan_dir), "--yes", env=fake_tools)
    assert_user_error(refused, where="--discard-data")
    assert "cluster.results_bucket" in refused.stderr and calls(fake_tools) == []


def test_runs_are_linked_to_s3_and_exported_before_the_file_system_goes(
    tmp_path: Path, fake_tools: dict[str, str]
) -> None:
    plan.write_plan(trn1_config('cluster.results_bucket="team-results"'), tmp_path / "kept")
    kept = tmp_path / "kept"
    assert tm("cluster", "up", "--plan", str(kept), env=fake_tools).returncode == 0
    log = calls(fake_tools)
    link = index(log, "aws fsx create-data-repository-association")
    assert (
        "--file-system-path /runs --data-repository-path s3://team-results/trainmaster-trn1/runs/"
        in log[link]
    )
    assert "AutoExportPolicy={Events=[NEW,CHANGED,DELETED]}" in log[link]
    assert (
        index(log, "kubectl --namespace default wait --for=jsonpath") < link
    )  # after the claim is Bound
    env = {**fake_tools, "FAKE_K8S_EXISTS": "1"}
    done = tm("cluster", "down", "--plan", str(kept), "--yes", env=env)  # no --discard-data needed
    assert done.returncode == 0, done.stdout + done.stderr
    log = calls(fake_tools)
    export = index(log, "aws fsx create-data-repository-task")
    assert "--type EXPORT_TO_REPOSITORY --paths runs" in log[export]
    assert export < index(log, "kubectl delete -f " + str(kept / "k8s/claim.yaml"))


def test_a_failed_export_keeps_the_file_system(tmp_path: Path, fake_tools: dict[str, str]) -> None:
    plan.write_plan(trn1_config('cluster.results_bucket="team-results"'), tmp_path / "kept")
    kept = tmp_path / "kept"
    assert tm("cluster", "up", "--plan", str(kept), env=fake_tools).returncode == 0
    env = {**fake_tools, "FAKE_K8S_EXISTS": "1", "FAKE_EXPORT": "FAILED"}
    failed = tm("cluster", "down", "--plan", str(kept), "--yes", env=env)
    assert (
        failed.returncode == 1 and "the export of runs/ is FAILED" in failed.stdout + failed.stderr
    )
    assert not [
        line
        for line in calls(fake_tools)
        if line.startswith("kubectl delete -f " + str(kept / "k8s/claim.yaml"))
    ]
