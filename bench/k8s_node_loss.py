"""A lost node on Kubernetes: how long until the gang runs again elsewhere, and where it lands.

    python bench/k8s_node_loss.py [--trials 3] [--tolerate 60] [--nodes 3] [--nnodes 2]
                                  [--out FILE]
    python bench/k8s_node_loss.py --trials 1 --nodes 66 --nnodes 64      # at scale

On a local control plane of its own (controlplane/: the real kube-apiserver,
kube-controller-manager and Volcano, --nodes kwok trn1.32xlarge nodes; `make kube-build`
first), the tutorial's job (examples/trn1-bert-large.toml on --nnodes nodes,
kubernetes.node_lost_after_s = --tolerate) and the node watcher
(backends/kubernetes/nodewatch.py) run with its own service account. Each trial launches the
job and measures the time from `launch` returning to the whole gang bound and Running (Volcano
places it), one `trainmaster status --json` of it (every pod listed), then stops the
heartbeat of the node under pod 0 (controlplane/kube_faults.py: its Lease taken from kwok, as
an impaired instance that stays "running" stops renewing it) and measures, from that moment:
the node NotReady (the node controller's grace period), the node taken out of service (by the
watcher, once the pods' toleration has passed), and the gang Running again at the next
attempt; and whether any new pod landed on the lost node. Then the node answers again, its
mark is cleared and the job deleted. Kubernetes' defaults otherwise (node monitor grace
period, pod GC period). Medians over the trials. Prints one JSON object; no assertions
(docs/architecture.md 4). bench/faults.py runs the same as its kind k8s_node_loss.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import emit, machine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "controlplane"))
import kube_faults  # type: ignore[import-not-found]  # noqa: E402
import kube_objects  # type: ignore[import-not-found]  # noqa: E402

from trainmaster.backends.kubernetes import nodewatch  # noqa: E402
from trainmaster.cluster import nodeguard  # noqa: E402

JOB, NS = "bert-large-trn1", "default"
IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/trainmaster:bench"


def say(text: str) -> None:
    print(f"[k8s_node_loss] {text}", file=sys.stderr, flush=True)


def wait(probe: Callable[[], Any], timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = probe()
        if found:
            return found
        time.sleep(0.5)  # polling the API server, bounded
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def tm(kubeconfig: Path, *args: str) -> str:
    cmd = [sys.executable, "-m", "trainmaster", "--kubeconfig", str(kubeconfig), *args]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    return done.stdout


def gang(core: Any, version: str, n: int) -> list[Any] | None:
    pods = core.list_namespaced_pod(NS, label_selector=f"trainmaster.io/job={JOB}").items
    good = len(pods) == n and all(
        p.spec.node_name
        and p.status.phase == "Running"
        and p.metadata.deletion_timestamp is None
        and p.metadata.annotations.get("volcano.sh/job-version") == version
        for p in pods
    )
    return sorted(pods, key=lambda p: p.metadata.name) if good else None


def watcher_kubeconfig(core: Any, admin: Path, out: Path) -> Path:
    token = core.create_namespaced_service_account_token(
        nodeguard.WATCHER, nodeguard.WATCHER_NAMESPACE, {"spec": {"expirationSeconds": 7200}}
    ).status.token
    return kube_objects.token_kubeconfig(admin, token, out, "watcher")


def trial(core: Any, coord: Any, kubeconfig: Path, launched: float, n: int) -> dict[str, Any]:
    """One loss of the node under pod 0 of a gang of N launched at `launched` (monotonic)."""
    first = wait(lambda: gang(core, "0", n), 600, "the gang Running")
    placed_s = time.monotonic() - launched
    t0 = time.monotonic()
    shown = json.loads(tm(kubeconfig, "status", f"kubernetes://{NS}/{JOB}", "--json"))
    status_s = time.monotonic() - t0
    lost = first[0].spec.node_name
    addresses = kube_faults.addresses(core, lost)
    start = time.monotonic()
    kube_faults.lose(core, coord, lost)
    wait(lambda: not kube_faults.ready(core.read_node(lost)), 300, "the node NotReady")
    not_ready_s = time.monotonic() - start

    def out_of_service() -> bool:
        taints = core.read_node(lost).spec.taints or []
        return any(t.key == nodewatch.OUT_OF_SERVICE["key"] for t in taints)

    wait(out_of_service, 600, "the node out of service")
    out_s = time.monotonic() - start
    second = wait(lambda: gang(core, "1", n), 600, "the gang Running again")
    running_s = time.monotonic() - start
    landed = sorted(p.spec.node_name for p in second)
    moved = sorted({p.spec.node_name for p in second} - {p.spec.node_name for p in first})
    kube_faults.revive(core, coord, lost, addresses)
    wait(lambda: kube_faults.ready(core.read_node(lost)), 120, "the node Ready again")
    wait(lambda: not out_of_service(), 60, "the node back in service (the watcher)")
    tm(kubeconfig, "node", "clear", lost)
    say(f"trial: placed {placed_s:.0f} s; {lost} lost; NotReady {not_ready_s:.0f} s, out {out_s:.0f} s, Running {running_s:.0f} s, new node(s) {moved}")  # fmt: skip
    return {
        "gang_placed_s": round(placed_s, 1),
        "status_s": round(status_s, 2),
        "status_pods": len(shown.get("nodes", [])),
        "lost_node": lost,
        "not_ready_s": round(not_ready_s, 1),
        "out_of_service_s": round(out_s, 1),
        "gang_running_again_s": round(running_s, 1),
        "landed_on": landed if n <= 8 else f"{len(landed)} nodes",
        "new_nodes": moved,
        "landed_on_lost_node": lost in landed,
    }


def measure(trials: int, tolerate: int, nodes: int, nnodes: int) -> dict[str, Any]:
    """The trials on a control plane of their own; the bench's JSON (without the machine)."""
    from kubernetes import client, config

    with tempfile.TemporaryDirectory(prefix="tm-k8s-loss-") as tmp:
        env = {**os.environ, "TRAINMASTER_KUBE_DIR": f"{tmp}/plane"}
        kube = [sys.executable, str(ROOT / "controlplane" / "kube.py")]
        up = subprocess.run([*kube, "up", "--port", "0", "--nodes", str(nodes)], env=env,
                            capture_output=True, text=True)  # fmt: skip
        if up.returncode != 0:
            sys.exit(f"the control plane did not start (make kube-build first?):\n{up.stderr}")
        watcher = None
        try:
            kubeconfig = Path(tmp) / "plane" / "kubeconfig"
            api = config.new_client_from_config(config_file=str(kubeconfig))
            core, coord = client.CoreV1Api(api), client.CoordinationV1Api(api)
            for obj in nodeguard.watcher(IMAGE, {"trainmaster.io/role": "system"})[:-1]:
                client_apply(api, obj)
            own = watcher_kubeconfig(core, kubeconfig, Path(tmp) / "watcher.kubeconfig")
            watcher = subprocess.Popen(
                [sys.executable, "-m", "trainmaster.backends.kubernetes.nodewatch", "--period", "2"],
                env={**os.environ, "KUBECONFIG": str(own)},
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
            done = []
            for _ in range(trials):  # a fresh job each time: Volcano's maxRetry is the job's
                tm(kubeconfig, "launch", str(ROOT / "examples" / "trn1-bert-large.toml"),
                   "--backend", "kubernetes", "--set", f"kubernetes.image={IMAGE}",
                   "--set", f"kubernetes.node_lost_after_s={tolerate}",
                   "--set", f"job.nnodes={nnodes}")  # fmt: skip
                done.append(trial(core, coord, kubeconfig, time.monotonic(), nnodes))
                tm(kubeconfig, "cancel", f"kubernetes://{NS}/{JOB}")
                wait(lambda: not core.list_namespaced_pod(NS).items, 300, "the pods gone")
        finally:
            if watcher is not None:
                watcher.terminate()
                watcher.wait(timeout=30)
            subprocess.run([*kube, "down"], env=env, capture_output=True)

    def median(key: str) -> float:
        return round(statistics.median(t[key] for t in done), 2)

    return {
        "nodes": nodes,
        "job": f"examples/trn1-bert-large.toml ({nnodes} x trn1.32xlarge)",
        "node_lost_after_s": tolerate,
        "trials": done,
        "median_s": {
            "gang_placed": median("gang_placed_s"),
            "status": median("status_s"),
            "not_ready": median("not_ready_s"),
            "out_of_service": median("out_of_service_s"),
            "gang_running_again": median("gang_running_again_s"),
        },
        "landed_on_lost_node": sum(t["landed_on_lost_node"] for t in done),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--tolerate", type=int, default=60, help="kubernetes.node_lost_after_s (60)")
    ap.add_argument("--nodes", type=int, default=3, help="simulated trn1.32xlarge nodes (3)")
    ap.add_argument("--nnodes", type=int, default=2, help="the job's nodes (2)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if a.trials < 1 or a.tolerate < 1 or not 1 <= a.nnodes < a.nodes:
        ap.error("--trials and --tolerate at least 1, and 1 <= --nnodes < --nodes (a spare)")
    result = measure(a.trials, a.tolerate, a.nodes, a.nnodes)
    emit({"bench": "k8s_node_loss", "machine": machine(), **result}, a.out)


def client_apply(api: Any, obj: dict[str, Any]) -> None:
    """Create one of the watcher's objects (all but its Deployment: no system node here)."""
    from kubernetes import utils

    utils.create_from_dict(api, obj)


if __name__ == "__main__":
    main()
