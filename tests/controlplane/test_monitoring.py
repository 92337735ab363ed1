"""`cluster plan`'s monitoring objects, admitted by a real API server against the operator's CRDs.

The PodMonitor and PrometheusRule CRDs are prometheus-operator's own, at the version the pinned
kube-prometheus-stack deploys (controlplane/monitoring-crds.sh); the objects of
k8s/monitoring.yaml are created with strict field validation, so a field the CRD does not know
fails here. The job's pods carry the port the PodMonitor names.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT, run_cli
from tests.controlplane import kubejobs as kj
from tests.controlplane.conftest import RealKube

pytestmark = [pytest.mark.kube, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def operator_crds(real_kube: RealKube) -> Iterator[None]:
    from kubernetes import client

    folder = subprocess.run(
        ["bash", str(ROOT / "controlplane" / "monitoring-crds.sh")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    crds = [yaml.safe_load(p.read_text()) for p in sorted(Path(folder).glob("*.yaml"))]
    assert {c["spec"]["names"]["kind"] for c in crds} == {"PodMonitor", "PrometheusRule"}
    ext = client.ApiextensionsV1Api(real_kube.api)
    for crd in crds:
        kj.apply(real_kube, crd)
    real_kube.wait_for(
        lambda: all(
            any(
                c.type == "Established" and c.status == "True"
                for c in ext.read_custom_resource_definition(
                    crd["metadata"]["name"]
                ).status.conditions
                or []
            )
            for crd in crds
        ),
        60,
        "the operator's CRDs established",
    )
    yield
    for crd in crds:
        ext.delete_custom_resource_definition(crd["metadata"]["name"])


def test_the_monitoring_objects_are_admitted_and_the_pods_have_the_port(
    real_kube: RealKube, operator_crds: None, job_ns: str, tmp_path: Path
) -> None:
    out = tmp_path / "plan"
    kj.ok(
        run_cli(
            "cluster",
            "plan",
            str(kj.TRN1),
            "--out",
            str(out),
            *kj.PLAN_SETS,
            "--set",
            "cluster.monitoring=true",
            "--set",
            f"kubernetes.namespace={job_ns}",
        )  # fmt: skip
    )
    docs = kj.load_docs(out / "k8s" / "monitoring.yaml")
    kinds = [d["kind"] for d in docs]
    assert kinds.count("PodMonitor") == 2 and "PrometheusRule" in kinds  # jobs', neuron-monitor's
    made: list[dict[str, Any]] = []
    try:
        for ns in {d["metadata"].get("namespace") for d in docs} - {None, job_ns}:
            made.append(kj.apply(real_kube, {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": ns}}))  # fmt: skip
        for doc in docs:
            made.append(kj.apply(real_kube, doc))  # Strict: an unknown field is refused
        monitor = next(
            d
            for d in docs
            if d["kind"] == "PodMonitor" and d["metadata"]["name"] == "trainmaster-jobs"
        )
        handle = kj.launch(real_kube, job_ns, kj.TRN1)
        job = handle.rsplit("/", 1)[1]
        pods = kj.bound(real_kube, job_ns, job, 2, "0")
        wanted = monitor["spec"]["selector"]["matchLabels"]
        port = monitor["spec"]["podMetricsEndpoints"][0]["port"]
        for pod in pods:
            assert wanted.items() <= (pod.metadata.labels or {}).items()
            assert port in [p.name for c in pod.spec.containers for p in c.ports or []]
    finally:
        from kubernetes import dynamic

        dyn = dynamic.DynamicClient(real_kube.api)
        for obj in reversed(made):
            meta = obj["metadata"]
            dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"]).delete(
                name=meta["name"], namespace=meta.get("namespace")
            )
