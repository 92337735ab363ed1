#!/usr/bin/env python3
"""The tutorial's job, shrunk, trained in containers on the local cluster's real nodes.

    python controlplane/kube.py up --nodes 0 --real-nodes 3   # the plane and three real nodes
    python controlplane/kube_image.py build                   # our image, from our Dockerfile
    python controlplane/kube_job.py [--name N] [--steps S]    # set up, launch, follow to the end

What a user with an EKS cluster does after `cluster up`, on this machine: the plan's add-ons
(`cluster plan` writes them; `setup` applies them as its runbook does) — the etcd rendezvous
server as a Deployment behind its Service, the node watcher as its Deployment with its own
service account, the job namespace's node-marker and progress policies — the prepared data on
the shared claim (the plane's hostPath stand-in for FSx, RUN_DIR/fsx), then `trainmaster launch
--backend kubernetes` of bert-tiny on 2 nodes with the etcd rendezvous. The tests
(tests/controlplane/test_real_job.py) and the bench (bench/k8s_real_nodes.py) drive the same
functions. Nothing here imports torch: the training runs in the pods.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
T = TypeVar("T")
NAMESPACE = "default"
DATASET = "pydoc"
SYSTEM_LABEL = ("trainmaster.io/role", "system")  # cluster/addons.py SYSTEM_SELECTOR
REAL_LABEL = ("trainmaster.io/local-node", "real")  # what kube_nodes labels a real node with
POOL_LABEL = ("trainmaster.io/pool", "training")  # the nodes setup() gives the job
PLAN_SETS = [
    'cluster.zones=["us-west-2a", "us-west-2b"]',
    'cluster.public_access_cidrs=["203.0.113.7/32"]',
]


def job_sets(image: str, name: str, steps: int, every: int) -> list[str]:
    """local-cpu's job (bert-tiny, 2 nodes x 1 worker) as a Kubernetes job on the real nodes:
    the etcd rendezvous `cluster plan` lays, and containers sized for 2-core nodes (the two
    pods share the host's two cores); everything else as trainmaster's defaults have it."""
    return [
        f"job.name={name}",
        "job.backend=kubernetes",
        "rendezvous.backend=etcd",  # the tutorial's
        "rendezvous.timeout=300",
        f"kubernetes.image={image}",
        "kubernetes.instance_type=cpu",
        "kubernetes.cpu=1",
        "kubernetes.memory_gib=3",
        f'kubernetes.node_selector={{ "{POOL_LABEL[0]}" = "{POOL_LABEL[1]}" }}',
        f"train.max_steps={steps}",
        f"train.checkpoint_every={every}",
        "train.warmup_steps=5",
    ]


def tm(kubeconfig: Path, *args: str, timeout: float = 300, check: bool = True) -> str:
    """`trainmaster --kubeconfig K ARGS` as a user runs it; its stdout."""
    cmd = [sys.executable, "-m", "trainmaster", "--kubeconfig", str(kubeconfig), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args[:2])}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc.stdout


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, every: float = 0.5) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)  # polling the cluster, bounded by the deadline


def _apply(api: Any, docs: list[dict[str, Any]]) -> None:
    from kubernetes import dynamic

    client = dynamic.DynamicClient(api)
    for obj in docs:
        res = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        ns = obj["metadata"].get("namespace") if res.namespaced else None
        client.server_side_apply(
            res, body=obj, namespace=ns, field_manager="trainmaster-local", force_conflicts=True
        )


def _docs(path: Path, image: str) -> list[dict[str, Any]]:
    text = path.read_text().replace("@IMAGE@", image)  # what runbook.sh fills in
    return [d for d in yaml.safe_load_all(text) if d]


def _deployment_ready(apps: Any, ns: str, name: str) -> bool:
    d = apps.read_namespaced_deployment(name, ns)
    return bool(d.status.ready_replicas) and d.status.ready_replicas >= (d.spec.replicas or 1)


def setup(
    kubeconfig: Path,
    run_dir: Path,
    image: str,
    pool: list[str],
    *,
    timeout: float = 240,
) -> dict[str, float]:
    """The plan's add-ons for a job in NAMESPACE, and its data on the claim; seconds per step.
    POOL (real nodes) is where the job may run (job_sets' node selector); its last node is the
    system node group too: etcd and the watcher run there, so that a node taken from under the
    job (kube_job_loss.py: never the system node) is a training node only, as on EKS."""
    from kubernetes import client, config

    times: dict[str, float] = {}
    t0 = time.monotonic()
    api = config.new_client_from_config(config_file=str(kubeconfig))
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    for node in pool:
        core.patch_node(node, {"metadata": {"labels": dict([POOL_LABEL])}})
    core.patch_node(pool[-1], {"metadata": {"labels": dict([SYSTEM_LABEL])}})
    plan = run_dir / "plan"
    if not (plan / "k8s" / "etcd.yaml").exists():
        example = str(ROOT / "examples" / "trn1-bert-large.toml")
        sets = [a for s in PLAN_SETS for a in ("--set", s)]
        tm(kubeconfig, "cluster", "plan", example, "--out", str(plan), *sets)
    for name in ("etcd.yaml", "node-watcher.yaml", "node-marker.yaml", "job-progress.yaml"):
        _apply(api, _docs(plan / "k8s" / name, image))
    times["addons_applied_s"] = time.monotonic() - t0
    storage = run_dir / "fsx"
    data = storage / "datasets" / DATASET
    if not (data / "dataset.json").exists():
        subprocess.run(
            [sys.executable, "-m", "trainmaster", "data", "prepare", "--builtin", DATASET,
             "--output", str(data)],
            check=True, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    times["data_s"] = time.monotonic() - t0 - times["addons_applied_s"]
    wait_for(
        lambda: (
            _deployment_ready(apps, "trainmaster-etcd", "etcd-server")
            and _deployment_ready(apps, "trainmaster-system", "trainmaster-node-watcher")
        ),
        timeout,
        "the etcd server and the node watcher Ready in their pods",
    )
    times["setup_s"] = time.monotonic() - t0
    return times


def launch(kubeconfig: Path, run_dir: Path, sets: list[str]) -> str:
    """`trainmaster launch` of local-cpu with SETS on the real nodes; the handle."""
    args = [a for s in sets for a in ("--set", s)]
    example = str(ROOT / "examples" / "local-cpu.toml")
    out = tm(kubeconfig, "launch", example, "--storage", str(run_dir / "fsx"), *args)
    return out.split()[0]


def status(kubeconfig: Path, handle: str) -> dict[str, Any]:
    return dict(json.loads(tm(kubeconfig, "status", handle, "--json", timeout=120)))


def pods(kubeconfig: Path, job: str) -> list[Any]:
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(kubeconfig))
    found = client.CoreV1Api(api).list_namespaced_pod(
        NAMESPACE, label_selector=f"trainmaster.io/job={job}"
    )
    return sorted(found.items, key=lambda p: p.metadata.name)


def metrics_rows(run_dir: Path, job: str) -> list[dict[str, Any]]:
    """rank 0's metrics.jsonl on the shared claim (written from inside its container)."""
    path = run_dir / "fsx" / "runs" / job / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a row being written
    return rows


def live_nodes(run_dir: Path) -> list[str]:
    """The plane's real nodes not lost (state.json), in order."""
    nodes = json.loads((run_dir / "state.json").read_text()).get("real_nodes", [])
    names = [str(n["name"]) for n in nodes if not n.get("lost")]
    if len(names) < 3:
        raise SystemExit(f"{len(names)} live real nodes in {run_dir}: 3 needed (2 and a spare)")
    return names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", default="tiny-k8s")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    p.add_argument("--image", help="image ref (default: what kube_image.py built last)")
    p.add_argument(
        "--lose-node",
        action="store_true",
        help="kill a training node after the first checkpoint and say where the time went",
    )
    args = p.parse_args(argv)
    run_dir = Path(os.environ.get("TRAINMASTER_KUBE_DIR", "/tmp/trainmaster-kube"))
    kubeconfig = run_dir / "kubeconfig"
    sys.path.insert(0, str(HERE))
    import kube_image
    import kube_job_loss

    image = args.image or kube_image.build()["image"]
    pool = live_nodes(run_dir)
    print(json.dumps(setup(kubeconfig, run_dir, image, pool)), flush=True)
    sets = job_sets(image, args.name, args.steps, args.every)
    if args.lose_node:
        out = kube_job_loss.run(kubeconfig, run_dir, sets, pool[-1])
        print(json.dumps({k: out[k] for k in ("victim", "launch_to_first_step_s", "phases")}))
        final = out["final"]
    else:
        handle = launch(kubeconfig, run_dir, sets)
        print(f"launched {handle}; follow: trainmaster --kubeconfig {kubeconfig} logs {handle} -f")
        final = wait_for(
            lambda: (s := status(kubeconfig, handle))["phase"] in ("succeeded", "failed") and s,
            1800,
            f"{handle} to end",
            every=5,
        )
    print(json.dumps(final, indent=1))
    return 0 if final["phase"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
