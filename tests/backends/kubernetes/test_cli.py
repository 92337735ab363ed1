"""`launch --backend kubernetes --dry-run` on the tutorial's example: a Job a cluster accepts;
the job commands against the fake API server."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.backends.kubernetes.fake_api import FakeCluster
from tests.backends.kubernetes.schemas import (
    validate_k8s,
    validate_pod_templates,
    validate_volcano_job,
)
from tests.conftest import ROOT, assert_user_error, run_cli
from trainmaster.catalog import EFA, NEURON

IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/trainmaster:1"


def test_tutorial_example_dry_run_validates() -> None:
    result = run_cli(
        "launch",
        str(ROOT / "examples" / "trn1-bert-large.toml"),
        "--backend",
        "kubernetes",
        "--dry-run",
    )
    assert result.returncode == 0, result.stderr
    cm, _, job = list(yaml.safe_load_all(result.stdout))
    validate_k8s(cm)
    validate_volcano_job(job)
    validate_pod_templates(job)
    spec = job["spec"]
    assert spec["schedulerName"] == "volcano" and spec["minAvailable"] == 2
    pod = spec["tasks"][0]["template"]["spec"]
    limits = pod["containers"][0]["resources"]["limits"]
    requests = pod["containers"][0]["resources"]["requests"]
    assert (limits[NEURON], limits[EFA]) == ("16", "8")  # the resource names, not `neurondevice`
    assert requests["cpu"] == limits["cpu"] and requests["memory"] == limits["memory"]  # Guaranteed
    script = " ".join(pod["containers"][0]["command"])
    # c10d through pod 0's stable name (etcd 3.6 has no v2 API), the id from the attempt
    assert "--rdzv-backend=c10d" in script
    assert "--rdzv-endpoint=bert-large-trn1-worker-0.bert-large-trn1:29400" in script
    assert '"--rdzv-id=$rdzv_id"' in script
    assert {"event": "PodEvicted", "action": "RestartJob"} in spec["policies"]


def test_real_launch_refuses_the_example_account(tmp_path: Path) -> None:
    result = run_cli(
        "launch",
        str(ROOT / "examples" / "trn1-bert-large.toml"),
        "--backend",
        "kubernetes",
        "--kubeconfig",
        str(tmp_path / "none"),
    )
    assert_user_error(result, "example account 123456789012")


def test_kubernetes_commands_against_the_fake_api(fake: FakeCluster) -> None:
    """launch, list, status, logs and cancel through the CLI and the real client."""
    kube = ["--backend", "kubernetes", "--kubeconfig", str(fake.kubeconfig())]
    job = ROOT / "examples" / "trn1-bert-large.toml"
    launched = run_cli("launch", str(job), "--image", IMAGE, *kube)
    assert launched.returncode == 0, launched.stderr
    assert launched.stdout.startswith(
        "kubernetes://default/bert-large-trn1  (Volcano job in namespace default"
    )
    fake.add_pod(
        "default",
        "bert-large-trn1-worker-0",
        {"trainmaster.io/job": "bert-large-trn1", "volcano.sh/job-name": "bert-large-trn1"},
        log=["[default0]:step 1 loss 11.2"],
    )
    listed = run_cli("list", *kube)
    assert listed.returncode == 0 and "bert-large-trn1" in listed.stdout, listed.stderr
    status = run_cli("status", "bert-large-trn1", *kube)
    assert status.returncode == 0, status.stderr
    assert "backend kubernetes" in status.stdout and "bert-large-trn1-worker-0" in status.stdout
    # The handle launch printed names the backend and namespace: no --backend needed after launch.
    by_handle = run_cli(
        "status",
        "kubernetes://default/bert-large-trn1",
        "--json",
        "--kubeconfig",
        str(fake.kubeconfig()),
    )
    assert by_handle.returncode == 0, by_handle.stderr
    data = json.loads(by_handle.stdout)
    assert (data["job"], data["backend"], data["handle"]) == (
        "bert-large-trn1",
        "kubernetes",
        "kubernetes://default/bert-large-trn1",
    )
    assert data["phase"] in ("pending", "running") and data["nnodes"] == 2
    assert [(n["name"], n["host"]) for n in data["nodes"]] == [
        ("bert-large-trn1-worker-0", "node-1")
    ]
    assert data["details"]["namespace"] == "default"
    listed_json = json.loads(run_cli("list", "--json", *kube).stdout)
    assert [j["handle"] for j in listed_json] == ["kubernetes://default/bert-large-trn1"]
    wrong = run_cli(
        "status",
        "kubernetes://other/bert-large-trn1",
        "--namespace",
        "default",
        "--kubeconfig",
        str(fake.kubeconfig()),
    )
    assert_user_error(wrong, where="--namespace")
    logs = run_cli("logs", "bert-large-trn1", *kube)
    assert logs.returncode == 0 and logs.stdout == "[default0]:step 1 loss 11.2\n", logs.stderr
    assert "# bert-large-trn1-worker-0" in logs.stderr
    bad = run_cli("logs", "bert-large-trn1", "--rank", "3", *kube)
    assert_user_error(bad, "--rank: kubernetes jobs")
    cancelled = run_cli("cancel", "bert-large-trn1", *kube)
    assert (
        cancelled.returncode == 0
        and "cancelled (the Volcano job and its pods are being deleted)" in cancelled.stdout
    )
    assert ("default", "bert-large-trn1") not in fake.jobs


def test_debug_shows_the_api_error_behind_a_one_line_error(fake: FakeCluster) -> None:
    kube = ["--backend", "kubernetes", "--kubeconfig", str(fake.kubeconfig())]
    plain = run_cli("status", "nosuch", *kube)
    assert_user_error(plain)
    debug = run_cli("--debug", "status", "nosuch", *kube)
    assert (
        "kubernetes.client.exceptions.NotFoundException: (404)" in debug.stderr
    )  # chained, not hidden
    assert "direct cause of the following exception" in debug.stderr
