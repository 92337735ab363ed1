"""The node watcher's decision (backends/kubernetes/nodewatch.decide): when a lost node is taken
out of service and when it is given back, from the nodes and pods as the API returns them.
The whole loop runs on the real control plane in tests/controlplane/test_node_loss.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

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
    V1Taint,
    V1Toleration,
)

from trainmaster import jobfile
from trainmaster.backends.kubernetes import nodewatch, podspec

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
OOS = V1Taint(key="node.kubernetes.io/out-of-service", value="nodeshutdown", effect="NoExecute")


def node(name: str, ready: str = "True", for_s: float = 0, taints=(), ours: bool = False) -> V1Node:  # type: ignore[no-untyped-def]
    cond = V1NodeCondition(
        type="Ready",
        status=ready,
        reason="NodeStatusUnknown" if ready == "Unknown" else "KubeletReady",
        message="Kubelet stopped posting node status." if ready == "Unknown" else None,
        last_transition_time=NOW - timedelta(seconds=for_s),
    )
    annotations = {nodewatch.OURS: "2026-12-04T11:58:00Z"} if ours else {}
    return V1Node(
        metadata=V1ObjectMeta(name=name, annotations=annotations),
        spec=V1NodeSpec(taints=list(taints)),
        status=V1NodeStatus(conditions=[cond]),
    )


def pod(name: str, on: str, tolerate_s: int | None = 60, job: str = "bert") -> V1Pod:
    cfg = jobfile.preset("trn1-bert-large", [f"kubernetes.node_lost_after_s={tolerate_s or 1}"])
    tols = [V1Toleration(**{("toleration_seconds" if k == "tolerationSeconds" else k): v for k, v in t.items()}) for t in podspec.node_lost_tolerations(cfg)]  # fmt: skip
    return V1Pod(
        metadata=V1ObjectMeta(name=name, namespace="ml", labels={nodewatch.JOB_LABEL: job}),
        spec=V1PodSpec(containers=[V1Container(name="c")], node_name=on, tolerations=tols if tolerate_s else None),
    )  # fmt: skip


def test_a_node_lost_for_its_pods_toleration_is_taken_out_naming_the_job() -> None:
    lost = node("n0", "Unknown", for_s=61)
    (action,) = nodewatch.decide([lost, node("n1")], [pod("bert-worker-0", "n0"), pod("bert-worker-1", "n1")], NOW)  # fmt: skip
    assert (action.node, action.kind, action.job) == ("n0", "take-out", "ml/bert")
    assert "Ready=Unknown" in action.detail and "ml/bert-worker-0" in action.detail


@pytest.mark.parametrize(
    ("tolerations", "lost_for", "taken"),
    [((60,), 59, False), ((60,), 60, True), ((120, 30), 31, True), ((None,), 299, False), ((None,), 300, True)],
    ids=["before", "at", "shortest", "default-before", "default-at"],
)  # fmt: skip
def test_the_shortest_toleration_of_the_nodes_pods_decides(
    tolerations: tuple[int | None, ...], lost_for: float, taken: bool
) -> None:
    pods = [pod(f"p{i}", "n0", t) for i, t in enumerate(tolerations)]
    assert bool(nodewatch.decide([node("n0", "False", for_s=lost_for)], pods, NOW)) is taken


def test_nodes_without_our_pods_or_already_out_are_left_alone() -> None:
    nodes = [node("idle", "Unknown", for_s=900), node("out", "Unknown", for_s=900, taints=[OOS], ours=True)]  # fmt: skip
    assert nodewatch.decide(nodes, [pod("p", "out")], NOW) == []


def test_a_node_ready_again_is_given_back_only_if_the_watcher_took_it_out() -> None:
    back = node("back", taints=[OOS], ours=True)
    theirs = node("theirs", taints=[OOS])  # someone else's taint: theirs to remove
    (action,) = nodewatch.decide([back, theirs], [], NOW)
    assert (action.node, action.kind) == ("back", "bring-back")


def test_the_gang_tolerates_a_lost_node_for_node_lost_after_s() -> None:
    cfg = jobfile.preset("trn1-bert-large", ["kubernetes.node_lost_after_s=45"])
    tols = podspec.node_lost_tolerations(cfg)
    assert {t["key"] for t in tols} == set(podspec.NODE_LOST_TAINTS)
    assert all(t["effect"] == "NoExecute" and t["tolerationSeconds"] == 45 for t in tols)
