"""Whether a node is not ready (backends/kubernetes/nodemark.py): its Ready condition is read in
one place, and the two callers that mark nodes decide by two named facts of it: the node
watcher by lost() (the node controller's NoExecute taint on a not-Ready node: Kubernetes gave
up on it), `status` by failing() (lost, or the kubelet itself says Ready=False). An Unknown
node the controller has not tainted is marked by neither: the controller holds back when the
whole cluster, or much of a zone, looks lost at once. Hand-made nodes, as the API returns them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client import (
    V1Container,
    V1Node,
    V1NodeCondition,
    V1NodeSpec,
    V1NodeStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodSpec,
    V1PodStatus,
    V1Taint,
)

from trainmaster.backends.kubernetes import nodemark, nodewatch

UNREACHABLE = V1Taint(key="node.kubernetes.io/unreachable", effect="NoExecute")
NOT_READY = V1Taint(key="node.kubernetes.io/not-ready", effect="NoExecute")
NO_SCHEDULE = V1Taint(key="node.kubernetes.io/unreachable", effect="NoSchedule")
LOST = V1NodeCondition(type="Ready", status="Unknown", reason="NodeStatusUnknown",
                       message="Kubelet stopped posting node status.")  # fmt: skip
DOWN = V1NodeCondition(type="Ready", status="False", reason="KubeletNotReady")
UP = V1NodeCondition(type="Ready", status="True", reason="KubeletReady")
PRESSURE = V1NodeCondition(type="MemoryPressure", status="True")


def node(*conditions: V1NodeCondition, taints: tuple[V1Taint, ...] = (), name: str = "n0") -> V1Node:  # fmt: skip
    return V1Node(
        metadata=V1ObjectMeta(name=name),
        spec=V1NodeSpec(taints=list(taints)),
        status=V1NodeStatus(conditions=list(conditions)),
    )


def test_the_ready_condition_says_why() -> None:
    assert nodemark.not_ready(node(PRESSURE, LOST)) == (
        "Ready=Unknown (NodeStatusUnknown: Kubelet stopped posting node status.)"
    )
    assert nodemark.not_ready(node(DOWN)) == "Ready=False (KubeletNotReady)"
    assert nodemark.not_ready(node(UP, PRESSURE)) is None
    assert [nodemark.ready(node(c)) for c in (UP, DOWN, LOST)] == ["True", "False", "Unknown"]
    # no Ready condition (a node that never reported): Unknown, as the node controller reads it
    assert nodemark.ready(node()) == nodemark.ready(V1Node()) == "Unknown"
    assert nodemark.lost(V1Node()) is None and nodemark.failing(V1Node()) is None


CASES = [  # (Ready condition, taints) -> (lost: the watcher marks, failing: status marks)
    (UP, (), False, False),
    (UP, (NOT_READY,), False, False),  # Ready again; the controller has yet to lift its taint
    (DOWN, (), False, True),  # the kubelet says so: status marks, the watcher waits for the taint
    (DOWN, (NOT_READY,), True, True),
    (LOST, (), False, False),  # the controller holds back (the cluster, or a zone, at once)
    (LOST, (NO_SCHEDULE,), False, False),  # the NoSchedule twin does not evict
    (LOST, (UNREACHABLE,), True, True),
    (None, (UNREACHABLE,), True, True),  # no condition reads as Unknown
]
IDS = ["ready", "ready-again", "kubelet-says", "down", "held-back", "noschedule", "lost", "none"]


@pytest.mark.parametrize(("ready", "taints", "lost", "failing"), CASES, ids=IDS)
def test_lost_and_failing(
    ready: V1NodeCondition | None, taints: tuple[V1Taint, ...], lost: bool, failing: bool
) -> None:
    n = node(*([ready] if ready else []), taints=taints)
    assert (nodemark.lost(n) is not None, nodemark.failing(n) is not None) == (lost, failing)
    if failing:  # the mark's detail says why
        assert nodemark.failing(n) == nodemark.not_ready(n)


class Core:
    """The two node calls nodemark.mark makes, on hand-made nodes."""

    def __init__(self, nodes: list[V1Node]) -> None:
        self.nodes = {n.metadata.name: n for n in nodes}
        self.patched: list[str] = []

    def read_node(self, name: str) -> V1Node:
        return self.nodes[name]

    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        self.patched.append(name)


def pod(name: str, on: str) -> V1Pod:
    meta = V1ObjectMeta(name=name, namespace="ml", labels={nodewatch.JOB_LABEL: "bert"})
    spec = V1PodSpec(containers=[V1Container(name="c")], node_name=on)
    return V1Pod(metadata=meta, spec=spec, status=V1PodStatus(phase="Running"))


def test_status_and_the_watcher_mark_by_these_facts_and_no_other_rule() -> None:
    """Every case above on its own node under a running pod of the job: `status`
    (mark_not_ready) patches exactly the failing nodes, the watcher (decide) marks exactly the
    lost ones."""
    nodes = [
        node(*([c] if c else []), taints=t, name=f"n{i}") for i, (c, t, _, _) in enumerate(CASES)
    ]
    on = {n.metadata.name: f"bert-worker-{i}" for i, n in enumerate(nodes)}
    core = Core(nodes)
    problems, marked = nodemark.mark_not_ready(
        SimpleNamespace(namespace="ml", core=core),  # type: ignore[arg-type]
        nodes,
        on,
        "ml/bert",
    )
    failing = [f"n{i}" for i, case in enumerate(CASES) if case[3]]
    assert (core.patched, problems, marked) == (failing, [], True)
    pods = [pod(p, n) for n, p in on.items()]
    actions = nodewatch.decide(nodes, pods, datetime(2026, 12, 4, 12, 0, tzinfo=UTC))
    assert [(a.node, a.kind) for a in actions] == [
        (f"n{i}", "mark") for i, case in enumerate(CASES) if case[2]
    ]
