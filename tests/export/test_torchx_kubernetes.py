"""The exported component through TorchX 0.7.0's own Kubernetes scheduler (its dry run): the
Volcano Job TorchX would submit mounts the job's storage, asks for the node's devices and
memory in TorchX's units, and runs the job's torchrun line with rank 0's host substituted.

TorchX pins urllib3<1.27, which this project's environment does not satisfy, so it lives in
its own virtual environment (`make torchx-venv`, which `make test` runs)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, run_cli

VENV = Path(os.environ.get("TRAINMASTER_TORCHX_VENV", ROOT / ".venv-torchx"))
TORCHX = VENV / "bin" / "torchx"
MARK = "=== SCHEDULER REQUEST ==="

pytestmark = pytest.mark.skipif(
    not TORCHX.exists(), reason=f"TorchX 0.7.0 is not installed in {VENV}; run `make torchx-venv`"
)


def dry_run(tmp_path: Path, job: str, fn: str, *sets: str) -> dict[str, Any]:
    comp = tmp_path / "component.py"
    extra = [a for s in sets for a in ("--set", s)]
    made = run_cli("export", "torchx", str(ROOT / "examples" / job), "--out", str(comp), *extra)
    assert made.returncode == 0, made.stderr
    out = subprocess.run(
        [str(TORCHX), "run", "-s", "kubernetes", "--workspace", "", "--dryrun",
         "-cfg", "queue=team-q,namespace=team-ns", f"{comp.name}:{fn}", "--image", "img:1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout.split(MARK, 1)[1])


def test_torchx_renders_a_volcano_job_with_storage_devices_and_the_command(tmp_path: Path) -> None:
    job = dry_run(tmp_path, "trn1-bert-large.toml", "bert_large_trn1")
    assert (job["kind"], job["spec"]["queue"]) == ("Job", "team-q")
    tasks = job["spec"]["tasks"]
    assert len(tasks) == 2
    for i, task in enumerate(tasks):
        pod = task["template"]["spec"]
        (c,) = pod["containers"]
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                  if "persistentVolumeClaim" in v}  # fmt: skip
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert claims[mounts["/data"]] == "fsx-claim"  # the dataset and the run folder
        assert "/dev/shm" in mounts
        limits = c["resources"]["limits"]
        assert limits["aws.amazon.com/neuron"] == "16" and limits["vpc.amazonaws.com/efa"] == "8"
        assert limits["memory"] == f"{455 * 2**30 // 10**6}M"  # the pods' 455Gi (30.7)
        assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "trn1.32xlarge"}
        script = c["command"][-1]
        assert "python -m torch.distributed.run --nnodes=2 --nproc-per-node=32" in script
        host = "$TORCHX_RANK0_HOST" if i == 0 else "$VC_WORKER_0_HOSTS"
        assert f'"--rdzv-endpoint={host}:29400"' in script  # rank 0's host, expanded by bash
        assert "--rdzv-id=bert-large-trn1-" in script and "${" not in script  # macros substituted
        assert "--storage /data" in script


def test_a_gpu_job_asks_for_gpus_the_torchx_way(tmp_path: Path) -> None:
    job = dry_run(tmp_path, "p5-bert-large.toml", "bert_large_p5")
    c = job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert c["resources"]["limits"]["vpc.amazonaws.com/efa"] == "32"
