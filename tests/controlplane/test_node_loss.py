"""A lost node on the real control plane: the gang moves to the spare by itself.

3 fake trn1 nodes, a 2-node job, and the node watcher (backends/kubernetes/nodewatch.py) as a
real process with its own service account's token, under the plan's RBAC (k8s/node-watcher.yaml).
The node under pod 0 stops its heartbeat as an impaired instance does: its Lease is taken from
kwok, so nothing renews it. The node controller taints it unreachable, the pods' toleration
(kubernetes.node_lost_after_s) runs out, they are evicted and would stay Terminating for good;
the watcher marks the node and takes it out of service, the pod GC deletes them, Volcano
restarts the gang, and the new pods land on the spare, never on the lost node. Nobody runs a
command meanwhile. When the node answers again the watcher gives it back to Kubernetes, and
trainmaster's mark keeps gangs off it until `trainmaster node clear`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.controlplane import kubejobs as kj
from tests.controlplane.conftest import RealKube, controlplane_module, exists
from trainmaster.backends.kubernetes import nodewatch
from trainmaster.cluster import nodeguard

pytestmark = [pytest.mark.kube, pytest.mark.timeout(900)]
faults = controlplane_module("kube_faults")  # lose() and revive() a node
RECOVERY_S = 180  # issue 37's bound, from the loss to the gang Running again


@pytest.fixture
def watcher(real_kube: RealKube, job_ns: str, tmp_path: Path) -> Iterator[Path]:
    """The plan's watcher objects applied (its Deployment stays Pending: no system node here),
    and the watcher itself run with a token of its service account. Yields its log."""
    from kubernetes import dynamic

    objs = nodeguard.watcher(kj.IMAGE, {"trainmaster.io/role": "system"})
    for obj in objs:
        kj.apply(real_kube, obj)
    token = real_kube.core.create_namespaced_service_account_token(
        nodeguard.WATCHER, nodeguard.WATCHER_NAMESPACE, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    objects = controlplane_module("kube_objects")
    objects.token_kubeconfig(
        real_kube.kubeconfig, token, tmp_path / "watcher.kubeconfig", "watcher"
    )
    log = tmp_path / "watcher.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainmaster.backends.kubernetes.nodewatch", "--period", "2"],
            env={**os.environ, "KUBECONFIG": str(tmp_path / "watcher.kubeconfig")},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield log
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        client = dynamic.DynamicClient(real_kube.api)
        for obj in reversed(objs[1:]):  # the namespace last
            resource = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            resource.delete(
                name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace")
            )
        # and gone before the next test applies it again: into a namespace still terminating
        # the apiserver refuses to create anything (403 Forbidden)
        real_kube.core.delete_namespace(nodeguard.WATCHER_NAMESPACE)
        real_kube.wait_for(
            lambda: not exists(lambda: real_kube.core.read_namespace(nodeguard.WATCHER_NAMESPACE)),
            120,
            f"namespace {nodeguard.WATCHER_NAMESPACE} gone",
        )


def taint_keys(kube: RealKube, node: str) -> set[str]:
    return {t.key for t in kube.core.read_node(node).spec.taints or []}


@dataclass(frozen=True)
class Loss:
    handle: str
    job: str
    first: list[Any]  # the gang's pods of attempt 0, by name
    node: str  # the node that stopped answering
    addresses: list[dict[str, str]]  # its addresses, for faults.revive
    at: float  # when its heartbeat stopped (time.monotonic)


def launch_and_lose(
    kube: RealKube,
    ns: str,
    tolerate_s: int,
    pod: int,
    before: Callable[[list[Any]], None] = lambda _: None,
) -> Loss:
    """Launch README's trn1 job tolerating a lost node for tolerate_s, wait for its gang, call
    before(pods), then stop the heartbeat of the node under pod POD."""
    handle = kj.launch(kube, ns, kj.TRN1, f"kubernetes.node_lost_after_s={tolerate_s}")
    job = handle.rsplit("/", 1)[1]
    first = kj.bound(kube, ns, job, 2, "0")
    node = first[pod].spec.node_name
    addresses = faults.addresses(kube.core, node)
    before(first)
    at = time.monotonic()
    faults.lose(kube.core, kube.coordination, node)
    return Loss(handle, job, first, node, addresses, at)


def test_a_lost_node_lets_go_of_its_gang_by_itself(
    real_kube: RealKube, job_ns: str, watcher: Path
) -> None:
    ns = job_ns
    loss = launch_and_lose(real_kube, ns, 30, 0)
    lost_at = loss.at
    handle, job, lost, addresses = loss.handle, loss.job, loss.node, loss.addresses
    try:
        second = kj.bound(real_kube, ns, job, 2, "1", timeout=RECOVERY_S)
        recovered_s = time.monotonic() - lost_at
        assert lost not in {p.spec.node_name for p in second}
        assert {p.spec.node_name for p in second} == set(real_kube.node_names) - {lost}
        assert {nodeguard.TAINT_KEY, nodewatch.OUT_OF_SERVICE["key"]} <= taint_keys(
            real_kube, lost
        ), watcher.read_text()
        assert f"node {lost} out of service" in watcher.read_text()
        st = kj.status(real_kube, ns, handle)
        assert st["restarts"] == 1 and any(
            f"node {lost} marked unhealthy (node-not-ready)" in n for n in st["notes"]
        ), st["notes"]
        print(f"gang Running again {recovered_s:.0f} s after the loss")

        faults.revive(real_kube.core, real_kube.coordination, lost, addresses)
        real_kube.wait_for(
            lambda: (
                faults.ready(real_kube.core.read_node(lost))
                and nodewatch.OUT_OF_SERVICE["key"] not in taint_keys(real_kube, lost)
            ),
            120,
            "the node Ready and back in service",
        )
        assert nodeguard.TAINT_KEY in taint_keys(real_kube, lost)  # until `node clear`
    finally:  # the next test finds three healthy nodes, however this one ended
        if not faults.ready(real_kube.core.read_node(lost)):
            faults.revive(real_kube.core, real_kube.coordination, lost, addresses)
        real_kube.wait_for(
            lambda: nodewatch.OUT_OF_SERVICE["key"] not in taint_keys(real_kube, lost),
            120,
            "the watcher to give the node back",
        )
        kj.ok(kj.tm(real_kube, ns, "node", "clear", lost))


def healed(kube: RealKube, node: str, addresses: list[dict[str, str]]) -> None:
    """The node answers again (if it does not yet) and the watcher gave it back to Kubernetes."""
    if not faults.ready(kube.core.read_node(node)):
        faults.revive(kube.core, kube.coordination, node, addresses)
    kube.wait_for(
        lambda: (
            faults.ready(kube.core.read_node(node))
            and not any(k.startswith("node.kubernetes.io/") for k in taint_keys(kube, node))
        ),
        120,
        f"{node} Ready, its not-ready and out-of-service taints gone",
    )


def test_a_node_that_went_not_ready_under_a_gang_is_not_trusted_with_its_restart(
    real_kube: RealKube, job_ns: str, watcher: Path
) -> None:
    """The node under pod 1 stops answering for less than the pods' toleration and comes back:
    nothing was evicted, but the watcher marked it while it was gone, so when the gang restarts
    (its pod 0 failed on the lost peer), it lands on the other node and the spare."""
    ns = job_ns
    loss = launch_and_lose(real_kube, ns, 600, 1)
    handle, job, first, blinked, addresses = (
        loss.handle,
        loss.job,
        loss.first,
        loss.node,
        loss.addresses,
    )
    try:
        real_kube.wait_for(
            lambda: nodeguard.TAINT_KEY in taint_keys(real_kube, blinked), 120, "the watcher's mark"
        )
        assert f"node {blinked} marked unhealthy" in watcher.read_text()
        ann = real_kube.core.read_node(blinked).metadata.annotations
        assert (
            ann[nodeguard.ANN_JOB] == f"{ns}/{job}"
            and first[1].metadata.name in ann[nodeguard.ANN_DETAIL]
        )
        healed(real_kube, blinked, addresses)
        assert nodeguard.TAINT_KEY in taint_keys(real_kube, blinked)  # until `node clear`
        assert [p.metadata.name for p in kj.bound(real_kube, ns, job, 2, "0")] == [
            p.metadata.name for p in first
        ]  # the blink evicted nothing

        kj.fail_pod(real_kube, ns, first[0].metadata.name, exit_code=1)
        second = kj.bound(real_kube, ns, job, 2, "1")
        assert {p.spec.node_name for p in second} == set(real_kube.node_names) - {blinked}
        st = kj.status(real_kube, ns, handle)
        assert any(f"node {blinked} marked unhealthy (node-not-ready)" in n for n in st["notes"])
    finally:
        healed(real_kube, blinked, addresses)
        kj.ok(kj.tm(real_kube, ns, "node", "clear", blinked))


def test_with_no_spare_the_gang_waits_saying_why_and_runs_again_once_the_node_is_cleared(
    real_kube: RealKube, job_ns: str, watcher: Path
) -> None:
    ns = job_ns
    spares: list[str] = []

    def cordon_the_spare(first: list[Any]) -> None:  # no spare left
        spares.extend(set(real_kube.node_names) - {p.spec.node_name for p in first})
        real_kube.core.patch_node(spares[0], {"spec": {"unschedulable": True}})

    loss = launch_and_lose(real_kube, ns, 30, 0, before=cordon_the_spare)
    handle, job, lost, addresses, spare = (
        loss.handle,
        loss.job,
        loss.node,
        loss.addresses,
        spares[0],
    )
    try:
        st = real_kube.wait_for(
            lambda: (
                (s := kj.status(real_kube, ns, handle))["message"].startswith("waiting")
                and s["restarts"] == 1
                and s
            ),
            RECOVERY_S,
            "the restarted gang waiting",
        )
        print("no spare:", st["message"])
        assert any(f"node {lost} marked unhealthy (node-not-ready)" in n for n in st["notes"])
        healed(real_kube, lost, addresses)  # back, but marked: still nowhere to go
        st = kj.status(real_kube, ns, handle)
        print("back, marked:", st["message"])
        assert st["message"].startswith("waiting") and st["message"].endswith(
            f"; marked unhealthy, so not used: {lost} (node-not-ready); "
            f"`trainmaster node clear {lost}` once it is sound"
        )
        assert not any(p.spec.node_name for p in kj.pods(real_kube, ns, job))

        kj.ok(kj.tm(real_kube, ns, "node", "clear", lost))
        second = kj.bound(real_kube, ns, job, 2, "1", timeout=120)
        assert {p.spec.node_name for p in second} == set(real_kube.node_names) - {spare}
    finally:
        real_kube.core.patch_node(spare, {"spec": {"unschedulable": None}})
        healed(real_kube, lost, addresses)
        kj.ok(kj.tm(real_kube, ns, "node", "clear", lost))
