"""runbook.sh: valid bash, the tutorial's steps in the tutorial's order, runnable as it is."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.cluster.conftest import TRN1_ZONES, p5_config, tm_here, trn1_config
from trainmaster import api
from trainmaster.cluster import downsteps, plan, spec, steps, upsteps

# The AWS tutorial's steps (reference sections 1 and 5), in its order, each with what in the
# runbook does it. Steps of the jump host (an EC2 instance, an IAM user with administrator keys)
# have no counterpart on purpose: any machine with the tools and SSO credentials will do.
TUTORIAL = [
    ("tools: eksctl, kubectl, docker, aws configure", r"eksctl version"),
    ("ECR: aws ecr create-repository", r"aws ecr create-repository"),
    (
        "AZs: determine_eks_azs.sh (here: looked up at plan time)",
        r"availabilityZones|eksctl create cluster",
    ),
    ("eksctl create cluster -f eks_cluster.yaml", r"eksctl create cluster --config-file"),
    ("CFN params from the cluster: control plane SG, VPC", r"clusterSecurityGroupId"),
    ("aws cloudformation create-stack eks_trn1_ng_stack.yaml, wait", r"aws cloudformation deploy"),
    ("nodegroup manifest from the stack's LaunchTemplateId", r"render eksctl/nodegroup\.yaml"),
    ("eksctl create nodegroup -f trn1_nodegroup.yaml", r"eksctl create nodegroup"),
    ("Neuron device plugin (Neuron's Helm chart, with its NPD)", r"neuron-helm-chart"),
    ("EFA device plugin (helm eks/aws-efa-k8s-device-plugin)", r"eks/aws-efa-k8s-device-plugin"),
    ("verify the device plugin pods", r"wait_allocatable"),
    ("etcd (kubectl apply, before Volcano)", r"kubectl apply -f \"\$PLAN_DIR/k8s/etcd\.yaml\""),
    ("Volcano (kubectl apply volcano-development.yaml)", r"volcano-development\.yaml"),
    ("Volcano webhook ready (retry on 'no endpoints available')", r"retry .* --dry-run=server"),
    ("create the Volcano queue", r"retry .* kubectl apply -f \"\$PLAN_DIR/k8s/queue\.yaml\""),
    ("eksctl create iamserviceaccount fsx-csi-controller-sa", r"eksctl create iamserviceaccount"),
    ("FSx CSI driver", r"aws-fsx-csi-driver/aws-fsx-csi-driver"),
    ("kubectl get csidriver", r"get csidriver fsx\.csi\.aws\.com"),
    ("StorageClass fsx-sc (subnet of the nodes, Lustre SG)", r"render k8s/storageclass\.yaml"),
    ("PVC fsx-claim, watch until Bound", r"=Bound pvc/"),
    ("docker build the training image", r"docker build"),
    ("docker push to ECR", r"docker push"),
    ("TensorBoard", r"render k8s/tensorboard\.yaml"),
    # clean-up, section 5
    (
        "kubectl delete -f tensorboard_manifest.yaml",
        r"delete -f \"\$PLAN_DIR/k8s/tensorboard\.yaml\"",
    ),
    ("kubectl delete vcjob --all", r"delete jobs\.batch\.volcano\.sh --all"),
    ("kubectl delete pods --all", r"delete pods --all"),
    ("kubectl delete -f storageclass.yaml", r"delete -f \"\$PLAN_DIR/k8s/storageclass\.yaml\""),
    (
        "kubectl delete -f claim.yaml (deletes the file system)",
        r"delete -f \"\$PLAN_DIR/k8s/claim\.yaml\"",
    ),
    ("eksctl delete nodegroup --wait", r"eksctl delete nodegroup .*--wait"),
    ("aws cloudformation delete-stack + wait stack-delete-complete", r"wait stack-delete-complete"),
    ("eksctl delete cluster", r"eksctl delete cluster"),
    ("aws ecr delete-repository --force", r"aws ecr delete-repository .*--force"),
]


def ordered_commands(s: spec.ClusterSpec) -> list[str]:
    return [
        line for step in [*upsteps.up_steps(s), *downsteps.down_steps(s)] for line in step.commands
    ]


def test_runbook_covers_every_tutorial_step_in_order() -> None:
    commands = ordered_commands(spec.resolve(trn1_config()))
    position = -1
    for what, pattern in TUTORIAL:
        hits = [i for i, line in enumerate(commands) if re.search(pattern, line)]
        assert hits, f"no runbook step does: {what}"
        later = [i for i in hits if i >= position]
        assert later, f"{what} comes before the step that precedes it in the tutorial"
        position = later[0]


def test_runbook_is_valid_bash(tmp_path: Path) -> None:
    for cfg in (trn1_config(), p5_config()):
        text = plan.build(spec.resolve(cfg))["runbook.sh"]
        path = tmp_path / "runbook.sh"
        path.write_text(text)
        result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def test_every_step_has_a_function_and_list_shows_them(tmp_path: Path) -> None:
    written = plan.write_plan(trn1_config(), tmp_path)
    result = subprocess.run(
        ["bash", str(tmp_path / "runbook.sh"), "list"], capture_output=True, text=True
    )
    ids = [s.id for s in upsteps.up_steps(written.spec) + downsteps.down_steps(written.spec)]
    assert result.stdout.split() == ids
    text = (tmp_path / "runbook.sh").read_text()
    for step_id in ids:
        assert f"step_{step_id.replace('-', '_')}() {{" in text


def test_runbook_runs_end_to_end_by_itself(tmp_path: Path, fake_tools: dict[str, str]) -> None:
    """./runbook.sh with no arguments, as a person would run it (fake AWS/k8s tools)."""
    plan.write_plan(trn1_config(), tmp_path / "plan")
    env = {**os.environ, **fake_tools}
    result = subprocess.run(
        ["bash", str(tmp_path / "plan" / "runbook.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    # 17.10: pinned by digest, the tag named beside it
    assert (
        f"kubernetes.image=123456789012.dkr.ecr.us-west-2.amazonaws.com/trainmaster@sha256:{7:064d}"
        in result.stdout
    ) and "(tag 0.1.0-neuron)" in result.stdout
    rendered = (tmp_path / "plan" / ".rendered" / "eksctl" / "nodegroup.yaml").read_text()
    assert (
        "lt-0fake" in rendered
        and "fake-node-role" in rendered
        and "@" not in rendered.split("\n", 2)[2]
    )
    again = subprocess.run(
        ["bash", str(tmp_path / "plan" / "runbook.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0
    assert (
        "== cluster: done already" in again.stdout and "== node-stack: done already" in again.stdout
    )


def test_render_refuses_a_missing_value(tmp_path: Path, fake_tools: dict[str, str]) -> None:
    plan.write_plan(trn1_config(), tmp_path / "plan")
    env = {**os.environ, **fake_tools}
    result = subprocess.run(
        ["bash", str(tmp_path / "plan" / "runbook.sh"), "run", "nodegroup"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "run the steps before this one" in result.stderr


@pytest.mark.parametrize("nodes", [0, 3])
def test_scale_command(nodes: int) -> None:
    cmd = steps.scale_command("c", "us-west-2", "trn1-32xlarge", nodes)
    assert cmd[:3] == ["eksctl", "scale", "nodegroup"]
    assert cmd[cmd.index("--nodes") + 1] == str(nodes)
    assert cmd[cmd.index("--nodes-max") + 1] == str(max(nodes, 1))


def test_plan_output_says_to_launch_by_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """17.10: `cluster plan` says the tag moves and where the pinned reference comes from."""
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
    )
    assert code == 0, err
    assert "tagged trainmaster:0.1.0-neuron" in out and "kubernetes.image=REPO@sha256:" in out
