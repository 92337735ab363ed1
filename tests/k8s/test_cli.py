"""`launch --backend kubernetes --dry-run` on the tutorial's example: a Job a cluster accepts."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.conftest import ROOT, run_cli
from tests.k8s.schemas import validate_k8s, validate_pod_templates, validate_volcano_job
from trainmaster.catalog import EFA, NEURON


def test_tutorial_example_dry_run_validates() -> None:
    result = run_cli("launch", str(ROOT / "examples" / "trn1-bert-large.toml"), "--backend",
                     "kubernetes", "--dry-run")
    assert result.returncode == 0, result.stderr
    cm, job = list(yaml.safe_load_all(result.stdout))
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
    result = run_cli("launch", str(ROOT / "examples" / "trn1-bert-large.toml"), "--backend",
                     "kubernetes", "--kubeconfig", str(tmp_path / "none"))
    assert result.returncode == 2
    assert "example account 123456789012" in result.stderr
