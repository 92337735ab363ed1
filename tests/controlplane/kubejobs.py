"""Driving trainmaster against the real local control plane: the CLI as a user runs it, the
cluster's storage and queue as `cluster plan` makes them, and the pod failures a test stands in
for (kwok runs no container, so a test sets a pod's phase as its kubelet would).

- `plan_dir`: `trainmaster cluster plan` of the trn1 preset (cluster.zones and the API CIDRs
  set, so nothing asks AWS), written once per session.
- `cluster_addons`: the plan's k8s/*.yaml applied server-side (the queue the presets name, the
  etcd namespace and its NetworkPolicy, the StorageClass, ...) and a CSINode per node for the
  FSx CSI driver, as its node DaemonSet (tolerateAllTaints) registers on every real node:
  without one Volcano's scheduler counts the FSx volume against an attach limit of 0 and a
  restarted gang never fits (seen here).
- `job_ns`: a namespace with the plan's claim `fsx-claim`, bound to a static PV.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.conftest import run_cli

if TYPE_CHECKING:  # conftest.py imports the fixtures below
    from tests.controlplane.conftest import RealKube

ROOT = Path(__file__).resolve().parents[2]

IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/trainmaster:test"
TRN1 = ROOT / "examples" / "trn1-bert-large.toml"
P5 = ROOT / "examples" / "p5-bert-large.toml"
CUSTOM_GPT = ROOT / "examples" / "custom-gpt" / "job.toml"
FSX_DRIVER = "fsx.csi.aws.com"
PLAN_SETS = (
    "--set",
    'cluster.zones=["us-west-2a", "us-west-2b"]',
    "--set",
    'cluster.public_access_cidrs=["203.0.113.7/32"]',
)


def tm(
    kube: RealKube, ns: str, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`trainmaster --kubeconfig K --backend kubernetes --namespace NS ARGS`."""
    return run_cli(
        "--kubeconfig",
        str(kube.kubeconfig),
        "--backend",
        "kubernetes",
        "--namespace",
        ns,
        *args,
        timeout=timeout,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def launch(kube: RealKube, ns: str, job_file: Path, *sets: str) -> str:
    """Launch; the handle it printed."""
    extra = [a for s in sets for a in ("--set", s)]
    out = ok(tm(kube, ns, "launch", str(job_file), "--set", f"kubernetes.image={IMAGE}", *extra))
    handle = out.split()[0]
    assert handle.startswith(f"kubernetes://{ns}/"), out
    return handle


def job_gone(kube: RealKube, ns: str, job: str) -> bool:
    """The Volcano Job itself is gone (after cancel its pods go first: Foreground deletion)."""
    from kubernetes.client.exceptions import ApiException

    try:
        kube.custom.get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", ns, "jobs", job)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def status(kube: RealKube, ns: str, handle: str) -> dict[str, Any]:
    return dict(json.loads(ok(tm(kube, ns, "status", handle, "--json"))))


def pods(kube: RealKube, ns: str, job: str) -> list[Any]:
    found = kube.core.list_namespaced_pod(ns, label_selector=f"trainmaster.io/job={job}").items
    return sorted(found, key=lambda p: p.metadata.name)


def bound(
    kube: RealKube, ns: str, job: str, n: int, version: str, timeout: float = 60
) -> list[Any]:
    """Wait until the job's N pods of attempt VERSION are bound and Running; return them."""

    def probe() -> list[Any] | None:
        found = pods(kube, ns, job)
        good = len(found) == n and all(
            p.spec.node_name
            and p.status.phase == "Running"
            and p.metadata.deletion_timestamp is None
            and p.metadata.annotations.get("volcano.sh/job-version") == version
            for p in found
        )
        return found if good else None

    return kube.wait_for(probe, timeout, f"{n} pods of {job} (attempt {version}) Running")


def fail_pod(kube: RealKube, ns: str, pod: str, message: str = "", exit_code: int = 1) -> None:
    """What the kubelet reports when the pod's container ends: phase Failed (Succeeded for exit
    code 0), the container terminated with its exit code and the termination message the pod
    script wrote."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    reason = "Error" if exit_code else "Completed"
    terminated = {"exitCode": exit_code, "reason": reason, "startedAt": now, "finishedAt": now}
    if message:
        terminated["message"] = message
    body = {
        "status": {
            "phase": "Failed" if exit_code else "Succeeded",
            "containerStatuses": [
                {
                    "name": "trainer",
                    "image": IMAGE,
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": terminated},
                }
            ],
        }
    }
    kube.core.patch_namespaced_pod_status(pod, ns, body)


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def apply(kube: RealKube, obj: dict[str, Any], namespace: str | None = None) -> Any:
    """Server-side apply with fieldValidation=Strict (as `kubectl apply --server-side`)."""
    from kubernetes import dynamic

    client = dynamic.DynamicClient(kube.api)
    resource = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    ns = (obj["metadata"].get("namespace") or namespace) if resource.namespaced else None
    applied = client.server_side_apply(
        resource,
        body=obj,
        namespace=ns,
        field_manager="trainmaster-test",
        force_conflicts=True,
        query_params=[("fieldValidation", "Strict")],
    )
    return applied.to_dict()


def register_fsx_driver(kube: RealKube, node: Any) -> None:
    """The CSINode the FSx CSI node plugin registers on a real node (module docstring)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    body = {
        "metadata": {
            "name": node.metadata.name,
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node.metadata.name,
                    "uid": node.metadata.uid,
                }
            ],
        },
        "spec": {"drivers": [{"name": FSX_DRIVER, "nodeID": node.metadata.name}]},
    }
    try:
        client.StorageV1Api(kube.api).create_csi_node(body)
    except ApiException as exc:
        if exc.status != 409:
            raise


@pytest.fixture(scope="session")
def plan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("plan") / "plan"
    ok(run_cli("cluster", "plan", str(TRN1), "--out", str(out), *PLAN_SETS))
    return out


@pytest.fixture(scope="session")
def cluster_addons(real_kube: RealKube, plan_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """The plan's add-ons in the cluster (queue first: the presets' jobs name it); per file,
    the objects as the API server stored them."""
    applied: dict[str, list[dict[str, Any]]] = {}
    for name in ("queue.yaml", "storageclass.yaml", "etcd.yaml"):
        applied[name] = [apply(real_kube, d) for d in load_docs(plan_dir / "k8s" / name)]
    for node in real_kube.core.list_node().items:
        register_fsx_driver(real_kube, node)
    return applied


@pytest.fixture
def job_ns(
    real_kube: RealKube, kube_namespace: str, plan_dir: Path, cluster_addons: Any
) -> Iterator[str]:
    """A namespace holding the plan's claim, bound to a static PV of the FSx driver."""
    ns = kube_namespace
    claim = load_docs(plan_dir / "k8s" / "claim.yaml")[0]
    claim["metadata"]["namespace"] = ns
    spec = claim["spec"]
    pv = {
        "metadata": {"name": f"fsx-{ns}"},
        "spec": {
            "capacity": {"storage": spec["resources"]["requests"]["storage"]},
            "accessModes": spec["accessModes"],
            "storageClassName": spec["storageClassName"],
            "persistentVolumeReclaimPolicy": "Retain",
            "csi": {"driver": FSX_DRIVER, "volumeHandle": f"fs-{ns}"},
            "claimRef": {"namespace": ns, "name": claim["metadata"]["name"]},
        },
    }
    real_kube.core.create_persistent_volume(pv)
    apply(real_kube, claim)
    real_kube.wait_for(
        lambda: (
            real_kube.core.read_namespaced_persistent_volume_claim(
                claim["metadata"]["name"], ns
            ).status.phase
            == "Bound"
        ),
        30,
        "the claim bound",
    )
    yield ns
    real_kube.core.delete_persistent_volume(f"fsx-{ns}")  # goes once its claim has gone


def pod_kubeconfig(kube: RealKube, pod: Any, out: Path) -> Path:
    """A kubeconfig holding a token of the pod's service account bound to the pod: the
    identity the pod's own processes have (its node in the token's claims)."""
    token = kube.core.create_namespaced_service_account_token(
        pod.spec.service_account_name or "default",
        pod.metadata.namespace,
        {
            "spec": {
                "expirationSeconds": 600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod.metadata.name,
                    "uid": pod.metadata.uid,
                },
            }
        },
    ).status.token
    from tests.controlplane.conftest import controlplane_module  # conftest imports this module

    objects = controlplane_module("kube_objects")
    return Path(objects.token_kubeconfig(kube.kubeconfig, token, out, "pod"))


def statuses(kube: RealKube, ns: str) -> list[dict[str, Any]]:
    """`list --json`: every job of the namespace as `status --json` shows it, less the details."""
    return list(json.loads(ok(tm(kube, ns, "list", "--json"))))
