"""Which nodes `status` marks (backends/kubernetes/nodemark.py not_ready): a Ready condition
False or Unknown, as the kubelet or the node controller leaves it; a Ready node, or one that
reports no condition yet, is left alone."""

from __future__ import annotations

from kubernetes.client import V1Node, V1NodeCondition, V1NodeStatus

from trainmaster.backends.kubernetes.nodemark import not_ready


def node(*conditions: V1NodeCondition) -> V1Node:
    return V1Node(status=V1NodeStatus(conditions=list(conditions)))


def test_not_ready_says_why() -> None:
    lost = V1NodeCondition(type="Ready", status="Unknown", reason="NodeStatusUnknown",
                           message="Kubelet stopped posting node status.")  # fmt: skip
    down = V1NodeCondition(type="Ready", status="False", reason="KubeletNotReady")
    pressure = V1NodeCondition(type="MemoryPressure", status="True")
    assert not_ready(node(pressure, lost)) == (
        "Ready=Unknown (NodeStatusUnknown: Kubelet stopped posting node status.)"
    )
    assert not_ready(node(down)) == "Ready=False (KubeletNotReady)"
    assert not_ready(node(V1NodeCondition(type="Ready", status="True"), pressure)) is None
    assert not_ready(node()) is None and not_ready(V1Node()) is None
