"""What the pod script reads from the pods Volcano's job controller really makes.

The rendezvous id lines of the pod's own script (between pod_script.RDZV_ID_BEGIN and _END in
the real pod's command) run in bash with the environment the pod would have: its downward-API
variables resolved from the real pod's annotations. The id is equal on every pod of one
attempt, changes with a RestartJob (a pod set Failed, policy PodFailed -> RestartJob) and with
a second submission of the same job name. The svc plugin's headless Service and the pods'
hostname/subdomain publish `<job>-worker-0.<job>`, the c10d endpoint of the builder. Then the
gang: a job wider than the cluster binds nothing and `status` says which resource is missing.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tests.controlplane import kubejobs as kj
from tests.controlplane.conftest import RealKube
from trainmaster.backends.kubernetes import pod_script, volcano

pytestmark = [pytest.mark.kube, pytest.mark.timeout(3600)]


def pod_env(pod: Any) -> dict[str, str]:
    """The container's env as the kubelet would resolve it: values, and fieldRefs of the pod's
    own annotations, name, namespace and node."""
    fields = {
        "metadata.name": pod.metadata.name,
        "metadata.namespace": pod.metadata.namespace,
        "spec.nodeName": pod.spec.node_name or "",
        "status.podIP": pod.status.pod_ip or "",
    }
    env: dict[str, str] = {}
    for e in pod.spec.containers[0].env or []:
        if e.value is not None:
            env[e.name] = e.value
        elif e.value_from is not None and e.value_from.field_ref is not None:
            path = e.value_from.field_ref.field_path
            if path.startswith("metadata.annotations['"):
                key = path[len("metadata.annotations['") : -2]
                if key in (pod.metadata.annotations or {}):
                    env[e.name] = pod.metadata.annotations[key]
            elif path in fields:
                env[e.name] = fields[path]
    return env


def rdzv_id(pod: Any) -> str:
    """Run the rendezvous-id lines of the pod's own script, with the pod's env, in bash."""
    script = pod.spec.containers[0].command[-1]
    begin = script.index(pod_script.RDZV_ID_BEGIN)
    end = script.index(pod_script.RDZV_ID_END)
    lines = script[begin:end]
    out = subprocess.run(
        ["bash", "-c", "set -eu\n" + lines + '\nprintf %s "$rdzv_id"'],
        env={"PATH": "/usr/bin:/bin", **pod_env(pod)},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert out.stderr == "", out.stderr  # no "older than v1.6" warning: the uid is there
    return out.stdout


def ids(pods: list[Any]) -> set[str]:
    return {rdzv_id(p) for p in pods}


def test_rendezvous_id_per_attempt_and_submission(real_kube: RealKube, job_ns: str) -> None:
    ns = job_ns
    handle = kj.launch(real_kube, ns, kj.TRN1)
    job = handle.rsplit("/", 1)[1]
    first = kj.bound(real_kube, ns, job, 2, "0")
    (id0,) = ids(first)  # one id on every pod of the attempt
    uid = real_kube.custom.get_namespaced_custom_object(
        "batch.volcano.sh", "v1alpha1", ns, "jobs", job
    )["metadata"]["uid"]
    assert id0 == f"{job}-{uid}-v0"

    # the svc plugin: <job>-worker-0.<job> is pod 0's name in the job's headless Service
    endpoint = volcano.rendezvous(volcano_cfg(ns)).endpoint
    host, service = endpoint.rsplit(":", 1)[0].split(".")
    assert (host, service) == (f"{job}-worker-0", job)
    svc = real_kube.core.read_namespaced_service(job, ns)
    assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses
    pod0 = next(p for p in first if p.metadata.name == host)
    assert (pod0.spec.hostname, pod0.spec.subdomain) == (host, service)
    assert all(pod0.metadata.labels.get(k) == v for k, v in svc.spec.selector.items())
    from kubernetes import client

    def published() -> bool:
        slices = (
            client.DiscoveryV1Api(real_kube.api)
            .list_namespaced_endpoint_slice(ns, label_selector=f"kubernetes.io/service-name={job}")
            .items
        )
        names = {(e.hostname, tuple(e.addresses)) for s in slices for e in s.endpoints or []}
        return (host, (pod0.status.pod_ip,)) in names

    real_kube.wait_for(published, 30, f"{host} published in Service {job}")  # what DNS serves

    # a pod fails: PodFailed -> RestartJob, a new attempt with a new id on every pod
    kj.fail_pod(real_kube, ns, first[1].metadata.name)
    second = kj.bound(real_kube, ns, job, 2, "1")
    (id1,) = ids(second)
    assert id1 == f"{job}-{uid}-v1" != id0
    st = kj.status(real_kube, ns, handle)
    assert st["restarts"] == 1 and st["details"]["attempt"] == "1"
    assert st["phase"] == "running"

    # cancelled and launched again under the same name: a new uid, so a new id
    kj.ok(kj.tm(real_kube, ns, "cancel", handle))
    real_kube.wait_for(lambda: not kj.pods(real_kube, ns, job), 60, "the pods deleted")
    kj.launch(real_kube, ns, kj.TRN1)
    (id2,) = ids(kj.bound(real_kube, ns, job, 2, "0"))
    assert id2 not in (id0, id1) and id2.endswith("-v0")


def volcano_cfg(ns: str) -> Any:
    from trainmaster.config import jobfile

    return jobfile.load(
        str(kj.TRN1), [f"kubernetes.image={kj.IMAGE}", f'kubernetes.namespace="{ns}"']
    )


def shape(nodes: int) -> tuple[str, str]:
    """N trn1 nodes, with a global batch that N x 32 workers x 16 divide (accumulation 16)."""
    return f"job.nnodes={nodes}", f"train.global_batch_size={nodes * 32 * 16 * 16}"


def test_gang_wider_than_the_cluster_binds_nothing_and_status_says_why(
    real_kube: RealKube,
    job_ns: str,
) -> None:
    ns, nodes = job_ns, len(real_kube.node_names)
    wide = nodes + 1
    handle = kj.launch(real_kube, ns, kj.TRN1, *shape(wide), "job.name=wide")

    def told() -> dict[str, Any] | None:
        st = kj.status(real_kube, ns, handle)
        return st if "insufficient aws.amazon.com/neuron" in st["message"] else None

    st = real_kube.wait_for(told, 60, "status naming the missing resource")
    assert st["phase"] == "pending" and f"gang of {wide} pods" in st["message"], st["message"]
    assert not [p for p in kj.pods(real_kube, ns, "wide") if p.spec.node_name]
    human = kj.ok(kj.tm(real_kube, ns, "status", handle))
    assert "insufficient aws.amazon.com/neuron" in " ".join(human.split())

    # as many nodes as there are: the whole gang binds, and status has nothing to explain
    kj.ok(kj.tm(real_kube, ns, "cancel", handle))
    real_kube.wait_for(lambda: not kj.pods(real_kube, ns, "wide"), 60, "the pods deleted")
    handle = kj.launch(real_kube, ns, kj.TRN1, *shape(nodes), "job.name=fits")
    placed = kj.bound(real_kube, ns, "fits", nodes, "0")
    assert len({p.spec.node_name for p in placed}) == nodes
    st = kj.status(real_kube, ns, handle)
    assert st["phase"] == "running" and "waiting" not in st["message"]
