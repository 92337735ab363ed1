"""Smoke test of the local control plane: a Volcano Job goes the whole way, webhook to Running.

With the kubernetes client only (no trainmaster code): a Queue, a 2-task Volcano Job with the
svc and env plugins whose pods ask for a whole node's accelerators, and then what each
component must have done: the webhook admitted (and defaulted) it, the job controller made the
PodGroup and two pods, the scheduler bound them to two fake nodes, kwok ran them, the svc plugin
made the headless Service and set hostname/subdomain. Then the gang: a job needing one node more
than there are gets no pod bound at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.controlplane.conftest import RealKube
from trainmaster import catalog

# The first test may start (or, with TRAINMASTER_KUBE_BUILD=1, build) the control plane in its
# session fixture, which counts against the test's timeout.
pytestmark = [pytest.mark.kube, pytest.mark.timeout(3600)]

BATCH = ("batch.volcano.sh", "v1alpha1")
SCHEDULING = ("scheduling.volcano.sh", "v1beta1")
JOB_NAME_LABEL = "volcano.sh/job-name"
JOB_VERSION = "volcano.sh/job-version"
GROUP_NAME = "scheduling.k8s.io/group-name"


def volcano_job(
    name: str,
    namespace: str,
    queue: str,
    replicas: int,
    min_available: int,
    instance: catalog.InstanceType,
) -> dict[str, Any]:
    """One task of REPLICAS pods, each asking for all of a node's accelerators and tolerating
    the node group's taint: so each pod needs a node of its own."""
    resource = instance.device_resource
    assert resource is not None
    requests = {resource: str(instance.devices), "cpu": "1", "memory": "1Gi"}
    pod = {
        "restartPolicy": "Never",
        "tolerations": [{"key": resource, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": "trainer",
                "image": "busybox:1.36",
                "command": ["sleep", "inf"],
                "resources": {"requests": requests, "limits": requests},
            }
        ],
    }
    return {
        "apiVersion": "/".join(BATCH),
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": "volcano",
            "queue": queue,
            "minAvailable": min_available,
            "plugins": {"svc": ["--publish-not-ready-addresses"], "env": []},
            "tasks": [{"name": "worker", "replicas": replicas, "template": {"spec": pod}}],
        },
    }


def job_pods(kube: RealKube, namespace: str, job: str) -> list[Any]:
    return list(
        kube.core.list_namespaced_pod(namespace, label_selector=f"{JOB_NAME_LABEL}={job}").items
    )


@pytest.fixture
def queue(real_kube: RealKube, kube_namespace: str) -> Iterator[str]:
    """A Queue of our own, open; named after the test's namespace (queues are cluster-wide).
    Removed after the test, once the namespace and so the jobs in the queue are gone."""
    name = f"q-{kube_namespace}"
    body = {
        "apiVersion": "/".join(SCHEDULING),
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {"weight": 1, "reclaimable": False},
    }
    real_kube.custom.create_cluster_custom_object(*SCHEDULING, "queues", body)
    real_kube.wait_for(
        lambda: (
            real_kube.custom.get_cluster_custom_object(*SCHEDULING, "queues", name)
            .get("status", {})
            .get("state")
            == "Open"
        ),
        30,
        f"queue {name} Open",
    )
    yield name
    real_kube.delete_namespace(kube_namespace)
    real_kube.custom.delete_cluster_custom_object(*SCHEDULING, "queues", name)


def test_job_runs_as_a_gang_on_fake_nodes(
    real_kube: RealKube, kube_namespace: str, queue: str
) -> None:
    ns, instance = kube_namespace, catalog.CATALOG[real_kube.state["instance_type"]]
    nodes = set(real_kube.node_names)
    from kubernetes.client.exceptions import ApiException

    # The validating webhook refuses what Volcano would never run: minAvailable > replicas.
    with pytest.raises(ApiException) as refused:
        real_kube.custom.create_namespaced_custom_object(
            *BATCH, ns, "jobs", volcano_job("bad", ns, queue, 1, 2, instance)
        )
    assert "validatejob.volcano.sh" in str(refused.value.body), refused.value.body

    created = real_kube.custom.create_namespaced_custom_object(
        *BATCH, ns, "jobs", volcano_job("smoke", ns, queue, 2, 2, instance)
    )
    # The mutating webhook defaulted what we left out (maxRetry 3, the task's minAvailable).
    assert created["spec"]["maxRetry"] == 3
    assert created["spec"]["tasks"][0]["minAvailable"] == 2

    pods = real_kube.wait_for(
        lambda: (
            (p := job_pods(real_kube, ns, "smoke"))
            and len(p) == 2
            and all(x.spec.node_name and x.status.phase == "Running" for x in p)
            and p
        ),
        60,
        "2 pods bound and Running",
    )
    assert {p.metadata.name for p in pods} == {"smoke-worker-0", "smoke-worker-1"}
    assert {p.spec.node_name for p in pods} <= nodes
    assert len({p.spec.node_name for p in pods}) == 2  # a whole node's devices each
    for p in pods:
        assert p.spec.scheduler_name == "volcano"
        assert p.metadata.annotations[JOB_VERSION] == "0"
        assert p.spec.hostname == p.metadata.name and p.spec.subdomain == "smoke"
        assert p.status.pod_ip
        env = {e.name: e.value for e in p.spec.containers[0].env or []}
        assert env["VC_TASK_INDEX"] == p.metadata.name.rsplit("-", 1)[1]

    group = pods[0].metadata.annotations[GROUP_NAME]
    assert group == f"smoke-{created['metadata']['uid']}"
    podgroup = real_kube.custom.get_namespaced_custom_object(*SCHEDULING, ns, "podgroups", group)
    assert podgroup["spec"]["minMember"] == 2 and podgroup["spec"]["queue"] == queue
    real_kube.wait_for(
        lambda: (
            real_kube.custom.get_namespaced_custom_object(*SCHEDULING, ns, "podgroups", group)
            .get("status", {})
            .get("phase")
            == "Running"
        ),
        30,
        "the PodGroup Running",
    )

    service = real_kube.core.read_namespaced_service("smoke", ns)
    assert service.spec.cluster_ip == "None" and service.spec.publish_not_ready_addresses
    real_kube.wait_for(
        lambda: (
            real_kube.custom.get_namespaced_custom_object(*BATCH, ns, "jobs", "smoke")
            .get("status", {})
            .get("state", {})
            .get("phase")
            == "Running"
        ),
        30,
        "the Volcano Job Running",
    )


def test_gang_larger_than_the_cluster_binds_nothing(
    real_kube: RealKube, kube_namespace: str, queue: str
) -> None:
    ns, instance = kube_namespace, catalog.CATALOG[real_kube.state["instance_type"]]
    gang = len(real_kube.node_names) + 1  # one node more than there are
    created = real_kube.custom.create_namespaced_custom_object(
        *BATCH, ns, "jobs", volcano_job("gang", ns, queue, gang, gang, instance)
    )
    group = f"gang-{created['metadata']['uid']}"

    # Evidence that the scheduler has looked at the gang and said no, rather than not yet: its
    # Unschedulable event on the PodGroup. Volcano's enqueue action keeps a PodGroup Pending
    # while its minResources exceed what the cluster could ever give (the overcommit plugin:
    # "resource in cluster is overused"), and the job controller creates no pod before the
    # PodGroup is Inqueue; so not one pod exists, let alone is bound.
    def refusals() -> list[str]:
        events = real_kube.core.list_namespaced_event(
            ns, field_selector=f"involvedObject.kind=PodGroup,involvedObject.name={group}"
        ).items
        return [e.message for e in events if e.reason == "Unschedulable"]

    messages = real_kube.wait_for(refusals, 60, "the scheduler's Unschedulable event on the gang")
    assert any(f"{gang} minAvailable" in m or "overused" in m for m in messages), messages
    podgroup = real_kube.custom.get_namespaced_custom_object(*SCHEDULING, ns, "podgroups", group)
    assert podgroup["spec"]["minMember"] == gang
    assert podgroup["status"]["phase"] == "Pending"
    assert not [p.metadata.name for p in job_pods(real_kube, ns, "gang") if p.spec.node_name]
