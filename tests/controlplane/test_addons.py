"""What `cluster plan` and `data stage` write is admitted by a real API server.

The plan's k8s/*.yaml are applied server-side with fieldValidation=Strict (kubejobs.apply):
the Volcano queue (and Volcano's webhook opens it), the etcd namespace with its Deployment,
Services and NetworkPolicy, the StorageClass, the claim (kubejobs.job_ns binds it), and the
rest of k8s/. The data-stage pod (`data stage --dry-run`'s YAML) passes a strict server dry run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.controlplane import kubejobs as kj
from tests.controlplane.conftest import RealKube

pytestmark = [pytest.mark.kube, pytest.mark.timeout(3600)]


def test_plan_addons_are_admitted(
    real_kube: RealKube,
    plan_dir: Path,
    cluster_addons: dict[str, list[dict[str, Any]]],
    job_ns: str,
) -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for objs in cluster_addons.values() for o in objs}
    assert ("Queue", "trainmaster") in kinds and ("StorageClass", "fsx-sc") in kinds
    assert {("Namespace", "trainmaster-etcd"), ("NetworkPolicy", "etcd-clients")} <= kinds
    queue = real_kube.wait_for(
        lambda: (
            q
            if (
                q := real_kube.custom.get_cluster_custom_object(
                    "scheduling.volcano.sh", "v1beta1", "queues", "trainmaster"
                )
            )
            .get("status", {})
            .get("state")
            == "Open"
            else None
        ),
        30,
        "the plan's queue Open",
    )
    assert queue["spec"]["weight"] == 1
    # every other manifest of k8s/ (the claim is job_ns's, bound already)
    rest = sorted({p.name for p in (plan_dir / "k8s").glob("*.yaml")} - set(cluster_addons))
    for name in rest:
        for doc in kj.load_docs(plan_dir / "k8s" / name):
            if doc["kind"] == "PersistentVolumeClaim":
                doc["metadata"]["namespace"] = job_ns
            stored = kj.apply(real_kube, doc, namespace=job_ns)
            assert stored["metadata"]["uid"], name


def test_data_stage_pod_is_admitted(real_kube: RealKube, job_ns: str) -> None:
    out = kj.ok(
        kj.tm(
            real_kube,
            job_ns,
            "data",
            "stage",
            "s3://my-bucket/wikicorpus.tar",
            "--name",
            "wiki",
            "--job",
            str(kj.TRN1),
            "--set",
            f"kubernetes.image={kj.IMAGE}",
            "--dry-run",
        )
    )
    (pod,) = [d for d in yaml.safe_load_all(out) if d]
    assert pod["metadata"]["namespace"] == job_ns
    created = real_kube.core.create_namespaced_pod(
        job_ns, pod, dry_run="All", field_validation="Strict"
    )
    assert created.spec.volumes[0].persistent_volume_claim.claim_name == "fsx-claim"
    assert created.spec.containers[0].security_context.read_only_root_filesystem
