"""A custom entrypoint on Kubernetes: the pods run it from the image (kubernetes.workspace is
built into an image FROM the training image by `cluster plan`'s Dockerfile.workspace); only
the worker program of the torchrun line differs from the built-in trainer's job."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli
from trainmaster.backends.kubernetes import volcano
from trainmaster.cluster import plan, spec
from trainmaster.config import jobfile

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "custom-gpt" / "job.toml"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/trainmaster-workspace:v1"


def script_of(job: dict) -> str:
    return job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["command"][2]


def test_dry_run_runs_the_script_from_the_images_workspace() -> None:
    result = run_cli(
        "launch",
        str(JOB),
        "--backend",
        "kubernetes",
        "--dry-run",
        "--set",
        f"kubernetes.image={IMAGE}",
        "--set",
        "job.nproc_per_node=8",
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert (
        "-m trainmaster.launch.entry --job /data/runs/custom-gpt/job.toml --storage /data "
        "--workdir /workspace -- examples/custom-gpt/train_gpt.py --steps 300 --checkpoint-every 50"
        in result.stdout
    )
    assert f"image: {IMAGE}" in result.stdout


def test_only_the_worker_program_differs_from_the_builtin_trainers_job() -> None:
    custom = jobfile.load(JOB, [f"kubernetes.image={IMAGE}", 'job.args=["--x", "a b"]'])
    builtin = custom.model_copy(
        update={
            "job": custom.job.model_copy(update={"entrypoint": "-m trainmaster.train", "args": []})
        }
    )
    mine, theirs = volcano.build_job(custom), volcano.build_job(builtin)
    a, b = script_of(mine).splitlines(), script_of(theirs).splitlines()
    assert [x for x in a if x not in b] == [a[-1]] and a[:-1] == b[:-1]  # the exec line alone
    assert a[-1].endswith("--workdir /workspace -- examples/custom-gpt/train_gpt.py --x 'a b'")
    pod, pod0 = (j["spec"]["tasks"][0]["template"]["spec"] for j in (mine, theirs))
    strip = {"command"}
    assert {k: v for k, v in pod["containers"][0].items() if k not in strip} == {
        k: v for k, v in pod0["containers"][0].items() if k not in strip
    }  # devices, EFA, shm, env
    assert pod["volumes"] == pod0["volumes"]


def test_cluster_plan_writes_the_workspace_dockerfile() -> None:
    cfg = jobfile.load(JOB)
    files = plan.build(
        spec.resolve(
            cfg,
            zone_lookup=lambda region, itype: ["us-west-2a", "us-west-2b"],
            cidr_lookup=lambda: "203.0.113.7/32",
        )
    )
    text = files["image/Dockerfile.workspace"]
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert lines == [
        "ARG BASE",
        "FROM --platform=linux/amd64 ${BASE}",
        "COPY . /workspace",
        "WORKDIR /workspace",
    ]
    assert ".git" in files["image/Dockerfile.workspace.dockerignore"].splitlines()
    assert "image/Dockerfile.workspace" in json.loads(files["plan.json"])["files"]
    without = cfg.model_copy(
        update={"kubernetes": cfg.kubernetes.model_copy(update={"workspace": None})}
    )
    assert not any(
        "workspace" in f
        for f in plan.build(
            spec.resolve(
                without,
                zone_lookup=lambda r, i: ["us-west-2a", "us-west-2b"],
                cidr_lookup=lambda: "203.0.113.7/32",
            )
        )
    )


def test_the_documented_kubernetes_launch_runs_one_worker_per_gpu() -> None:
    """30.11: on p5.48xlarge the pod holds 8 GPUs and 32 EFA devices; the example's own
    Kubernetes command line runs one worker per GPU, not 1 (the local run keeps 1 per node)."""
    import shlex

    from trainmaster import catalog

    lines = [ln[1:].strip() for ln in JOB.read_text().splitlines() if ln.startswith("#")]
    start = next(i for i, ln in enumerate(lines) if "--backend kubernetes" in ln)
    end = next(i for i in range(start, len(lines)) if not lines[i].endswith("\\"))
    words = shlex.split(" ".join(ln.rstrip("\\") for ln in lines[start : end + 1]))
    assert words[:3] == ["trainmaster", "launch", "examples/custom-gpt/job.toml"]
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    cfg = jobfile.load(JOB, [s for s in sets if not s.startswith("kubernetes.image")])
    inst = catalog.CATALOG[cfg.kubernetes.instance_type]
    assert cfg.job.nproc_per_node == inst.devices == 8
    assert jobfile.load(JOB).job.nproc_per_node == 1  # the local run: 2 nodes x 1 on a laptop
