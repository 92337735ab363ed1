"""Issue 25.4 on the real control plane: a restart does not land on the node that caused it.

3 fake trn1 nodes, a 2-node job. Pod 1 fails preflight: what its trainer runs before the pod
ends (train/nodefault.py mark_node -> `python -m trainmaster.backends.kubernetes.nodemark`) runs
here with a service-account token bound to that real pod (so the API server sees the pod's
node in it, as in the pod), under the plan's RBAC and admission policy (cluster/nodeguard.py);
then the pod is set Failed with the termination message nodemark wrote. Volcano restarts the
gang, and it lands on the healthy node and the spare. The policy refuses the same token on
another node or for a label; `status` names the node and why; `node clear` removes the mark.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.controlplane import kubejobs as kj
from tests.controlplane.conftest import RealKube
from trainmaster.backends.kubernetes import nodemark
from trainmaster.cluster import nodeguard
from trainmaster.train import nodefault

pytestmark = [pytest.mark.kube, pytest.mark.timeout(3600)]


@pytest.fixture
def marker_rbac(real_kube: RealKube, job_ns: str) -> Iterator[None]:
    from kubernetes import dynamic

    objs = nodeguard.rbac(job_ns, "default")
    for obj in objs:
        kj.apply(real_kube, obj)
    yield
    client = dynamic.DynamicClient(real_kube.api)
    for obj in reversed(objs):
        client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"]).delete(
            name=obj["metadata"]["name"]
        )
    for node in real_kube.node_names:  # the next test finds every node clean
        kj.ok(kj.tm(real_kube, job_ns, "node", "clear", node))


def test_restart_avoids_the_marked_node(
    real_kube: RealKube, job_ns: str, marker_rbac: None, tmp_path: Path
) -> None:
    ns = job_ns
    assert len(real_kube.node_names) == 3  # the tutorial's two and a spare
    handle = kj.launch(real_kube, ns, kj.TRN1)
    job = handle.rsplit("/", 1)[1]
    first = kj.bound(real_kube, ns, job, 2, "0")
    bad = first[1].spec.node_name
    healthy = first[0].spec.node_name
    kubeconfig = kj.pod_kubeconfig(real_kube, first[1], tmp_path / "pod.kubeconfig")
    term = tmp_path / "termination-log"
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "TRAINMASTER_JOB": job,
        "TRAINMASTER_TERMINATION_LOG": str(term),
    }
    detail = "0 /dev/neuron* device(s), need 16"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "trainmaster.backends.kubernetes.nodemark",
            "preflight-neuron",
            detail,
        ],
        env=env,
        check=True,
        timeout=60,
    )
    message = term.read_text().strip()
    assert message == f"trainmaster: node fault: preflight-neuron on {bad}: {detail}"
    taints = real_kube.core.read_node(bad).spec.taints or []
    assert any(t.key == nodeguard.TAINT_KEY and t.effect == "NoSchedule" for t in taints)

    # the admission policy: the pod's token marks its own node only, and only our mark
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    as_pod = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    with pytest.raises(ApiException) as refused:
        as_pod.patch_node(
            healthy,
            {
                "spec": {
                    "taints": [{"key": nodeguard.TAINT_KEY, "value": "x", "effect": "NoSchedule"}]
                }
            },
        )
    assert "only the node it runs on" in str(refused.value.body)
    with pytest.raises(ApiException) as refused:
        as_pod.patch_node(bad, {"metadata": {"labels": {"evil": "1"}}})
    assert "labels" in str(refused.value.body)

    # the pod ends as the kubelet reports it; Volcano restarts the gang, away from the node
    kj.fail_pod(real_kube, ns, first[1].metadata.name, message=message, exit_code=1)
    second = kj.bound(real_kube, ns, job, 2, "1")
    assert bad not in {p.spec.node_name for p in second}
    assert {p.spec.node_name for p in second} == set(real_kube.node_names) - {bad}

    st = kj.status(real_kube, ns, handle)
    assert st["restarts"] == 1 and any(
        f"node {bad} marked unhealthy (preflight-neuron)" in n and detail in n for n in st["notes"]
    ), st["notes"]
    assert f"node {bad} marked unhealthy" in " ".join(
        kj.ok(kj.tm(real_kube, ns, "status", handle)).split()
    )
    assert bad in kj.ok(kj.tm(real_kube, ns, "node", "list"))

    kj.ok(kj.tm(real_kube, ns, "node", "clear", bad))
    assert not any(
        t.key == nodeguard.TAINT_KEY for t in real_kube.core.read_node(bad).spec.taints or []
    )
    assert not kj.status(real_kube, ns, handle)["notes"]


# What a rank's hang watchdog runs (train/nodefault.hang_action), with the probe's timeout
# given: argv DEVICE TIMEOUT_S.
HANG = """
import sys
from trainmaster.train import nodefault
probe = lambda device: nodefault.probe_device(device, timeout=float(sys.argv[2]))
nodefault.hang_action(sys.argv[1], probe=probe)("rank 1: no step for 30 s after step 7")
"""


def test_a_hang_marks_the_node_only_where_the_device_probe_fails(
    real_kube: RealKube, job_ns: str, marker_rbac: None, tmp_path: Path
) -> None:
    """Both pods' watchdogs fire on a hang; each probes its own device. Pod 0's answers (a
    real matmul on the cpu): no mark. Pod 1's never answers (a wedged device: the probe
    process hangs): its node gets the preflight's taint and annotations, reason hang-device,
    through the same nodemark process and the pod's own token."""
    ns = job_ns
    handle = kj.launch(real_kube, ns, kj.TRN1)
    job = handle.rsplit("/", 1)[1]
    first = kj.bound(real_kube, ns, job, 2, "0")
    term = tmp_path / "termination-log"
    env = {**os.environ, "KUBERNETES_SERVICE_HOST": "10.0.0.1", "TRAINMASTER_JOB": job,
           "TRAINMASTER_TERMINATION_LOG": str(term)}  # fmt: skip
    for i, (wedged, timeout) in enumerate([(False, "120"), (True, "3")]):
        kubeconfig = kj.pod_kubeconfig(real_kube, first[i], tmp_path / f"pod{i}.kubeconfig")
        extra = {nodefault.PROBE_HANG_ENV: "1"} if wedged else {}
        done = subprocess.run(
            [sys.executable, "-c", HANG, "cpu", timeout],
            env={**env, "KUBECONFIG": str(kubeconfig), **extra},
            capture_output=True,
            text=True,
            timeout=180,
            check=True,
        )
        node = first[i].spec.node_name
        taints = real_kube.core.read_node(node).spec.taints or []
        ours = [(t.value, t.effect) for t in taints if t.key == nodeguard.TAINT_KEY]
        if not wedged:
            assert ours == [] and done.stdout == "" and not term.exists(), done.stdout
            continue
        assert "cpu did not answer a probe in 3 s: marking this node (hang-device)" in done.stdout
        assert ours == [(nodefault.HANG_REASON, "NoSchedule")]
        ann = real_kube.core.read_node(node).metadata.annotations
        assert ann[nodeguard.ANN_REASON] == nodefault.HANG_REASON
        assert ann[nodeguard.ANN_JOB] == f"{ns}/{job}"
        assert ann[nodeguard.ANN_DETAIL].startswith("rank 1: no step for 30 s after step 7; cpu")
        assert term.read_text().startswith(f"trainmaster: node fault: hang-device on {node}: ")
        st = kj.status(real_kube, ns, handle)
        assert any(f"node {node} marked unhealthy (hang-device)" in n for n in st["notes"])


KWOK = "kwok.x-k8s.io/node"  # kwok keeps a node Ready only while it carries this (controlplane/)


def node_goes(kube: RealKube, node: str, ready: bool) -> None:
    """A node stops answering (kwok lets go of it, its Ready condition turns False, as the
    kubelet's last word or the node controller's would be), or comes back (kwok takes it
    again and reports it Ready)."""
    if ready:
        kube.core.patch_node(node, {"metadata": {"annotations": {KWOK: "fake"}}})
        kube.wait_for(lambda: nodemark.not_ready(kube.core.read_node(node)) is None, 60, "Ready")
        return
    kube.core.patch_node(node, {"metadata": {"annotations": {KWOK: None}}})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    down = {"type": "Ready", "status": "False", "reason": "KubeletNotReady",
            "message": "container runtime is down", "lastHeartbeatTime": now,
            "lastTransitionTime": now}  # fmt: skip
    kube.core.patch_node_status(node, {"status": {"conditions": [down]}})


def test_status_marks_a_node_gone_not_ready(real_kube: RealKube, job_ns: str) -> None:
    """A pod's node goes NotReady: the pod cannot mark it; `status` does (the caller's
    credentials), naming the node and why. The node comes back Ready (Kubernetes' own
    not-ready taint goes with the condition) but keeps trainmaster's mark, so the gang's
    restart lands on the healthy node and the spare."""
    ns = job_ns
    handle = kj.launch(real_kube, ns, kj.TRN1)
    job = handle.rsplit("/", 1)[1]
    first = kj.bound(real_kube, ns, job, 2, "0")
    bad, pod = first[1].spec.node_name, first[1].metadata.name
    try:
        node_goes(real_kube, bad, ready=False)
        st = kj.status(real_kube, ns, handle)
        line = f"node {bad} marked unhealthy ({nodemark.NOT_READY})"
        assert any(line in n and "Ready=False (KubeletNotReady" in n and pod in n
                   for n in st["notes"]), st["notes"]  # fmt: skip
        taint = [t for t in real_kube.core.read_node(bad).spec.taints or []
                 if t.key == nodeguard.TAINT_KEY]  # fmt: skip
        assert [(t.value, t.effect) for t in taint] == [(nodemark.NOT_READY, "NoSchedule")]
        ann = real_kube.core.read_node(bad).metadata.annotations
        assert ann[nodeguard.ANN_JOB] == f"{ns}/{job}" and pod in ann[nodeguard.ANN_DETAIL]

        node_goes(real_kube, bad, ready=True)
        real_kube.wait_for(
            lambda: not any(t.key.startswith("node.kubernetes.io/")
                            for t in real_kube.core.read_node(bad).spec.taints or []),
            120, "Kubernetes' own not-ready taints gone",
        )  # fmt: skip
        # the survivors' pod fails on its lost peer; Volcano restarts the gang
        kj.fail_pod(real_kube, ns, first[0].metadata.name, exit_code=1)
        second = kj.bound(real_kube, ns, job, 2, "1")
        assert {p.spec.node_name for p in second} == set(real_kube.node_names) - {bad}
        assert line in " ".join(kj.ok(kj.tm(real_kube, ns, "status", handle)).split())
    finally:
        node_goes(real_kube, bad, ready=True)
        kj.ok(kj.tm(real_kube, ns, "node", "clear", bad))
    assert not kj.status(real_kube, ns, handle)["notes"]
