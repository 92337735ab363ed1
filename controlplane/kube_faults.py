"""Faults a real node has, made on the local control plane's kwok nodes (tests and bench/).

An impaired instance that stays "running" stops its kubelet: no heartbeat, and nobody to finish
its pods' deletion. lose() takes the node's Lease from kwok (held by "lost", for an hour), so
nothing renews it and the node controller sees the node go silent, as on EKS, and takes kwok's
annotation off the node and marks its pods (kube_objects.LOST_POD), so kwok no longer plays
their kubelet (it would otherwise complete the deletion of an evicted pod, which no real lost
node does). revive() gives all of it back: kwok takes
a new Lease, the node's addresses are put back (kwok does not set them again on a node it
takes back, and without them the API server cannot reach the node for pod logs), and its pods
are kwok's to play again.
"""

from __future__ import annotations

import datetime
from typing import Any

from kube_objects import KWOK_ANNOTATION, LOST_POD

LEASES = "kube-node-lease"


def lose(core: Any, coordination: Any, node: str) -> None:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec = {"holderIdentity": "lost", "leaseDurationSeconds": 3600, "renewTime": now}
    coordination.patch_namespaced_lease(node, LEASES, {"spec": spec})
    core.patch_node(node, {"metadata": {"annotations": {KWOK_ANNOTATION[0]: None}}})
    for pod in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items:
        body = {"metadata": {"annotations": {LOST_POD: "true"}}}
        core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace, body)


def revive(core: Any, coordination: Any, node: str, addresses: list[dict[str, str]]) -> None:
    core.patch_node(node, {"metadata": {"annotations": dict([KWOK_ANNOTATION])}})
    coordination.delete_namespaced_lease(node, LEASES)
    core.patch_node_status(node, {"status": {"addresses": addresses}})
    for pod in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items:
        body = {"metadata": {"annotations": {LOST_POD: None}}}  # its kubelet is back
        core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace, body)


def addresses(core: Any, node: str) -> list[dict[str, str]]:
    """The node's addresses now, for revive()."""
    found = core.read_node(node).status.addresses or []
    return [{"type": a.type, "address": a.address} for a in found]


def ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
