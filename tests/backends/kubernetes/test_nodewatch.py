"""The node watcher's decision (backends/kubernetes/nodewatch.decide): when a node under a gang
is marked, when a lost node is taken out of service and when it is given back, from the nodes
and pods as the API returns them.
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
    V1PodStatus,
    V1Taint,
)

from trainmaster.backends.kubernetes import nodewatch, podspec
from trainmaster.config import jobfile

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
OOS = V1Taint(key="node.kubernetes.io/out-of-service", value="nodeshutdown", effect="NoExecute")
UNREACHABLE = V1Taint(key="node.kubernetes.io/unreachable", effect="NoExecute")
NOT_READY = V1Taint(key="node.kubernetes.io/not-ready", effect="NoExecute")
NO_SCHEDULE = V1Taint(key="node.kubernetes.io/unreachable", effect="NoSchedule")
MARKED = V1Taint(key="trainmaster.io/unhealthy", value="node-not-ready", effect="NoSchedule")


def node(name: str, ready: str = "True", taints: tuple[V1Taint, ...] = (), ours: bool = False) -> V1Node:  # fmt: skip
    cond = V1NodeCondition(
        type="Ready",
        status=ready,
        reason="NodeStatusUnknown" if ready == "Unknown" else "KubeletReady",
        message="Kubelet stopped posting node status." if ready == "Unknown" else None,
    )
    annotations = {nodewatch.OURS: "2026-12-04T11:58:00Z"} if ours else {}
    return V1Node(
        metadata=V1ObjectMeta(name=name, annotations=annotations),
        spec=V1NodeSpec(taints=list(taints)),
        status=V1NodeStatus(conditions=[cond]),
    )


def pod(name: str, on: str, evicted_s: float | None = None, phase: str = "Running") -> V1Pod:
    """A trainmaster pod; evicted_s: its deletion time relative to NOW (None: not evicted)."""
    gone = None if evicted_s is None else NOW + timedelta(seconds=evicted_s)
    meta = V1ObjectMeta(name=name, namespace="ml", labels={nodewatch.JOB_LABEL: "bert"})
    meta.deletion_timestamp = gone
    spec = V1PodSpec(containers=[V1Container(name="c")], node_name=on)
    return V1Pod(metadata=meta, spec=spec, status=V1PodStatus(phase=phase))


def test_an_unreachable_node_holding_an_evicted_pod_is_taken_out_naming_the_job() -> None:
    lost = node("n0", "Unknown", (NO_SCHEDULE, UNREACHABLE))
    pods = [pod("bert-worker-0", "n0", evicted_s=25), pod("bert-worker-1", "n1")]
    (action,) = nodewatch.decide([lost, node("n1")], pods, NOW)
    assert (action.node, action.kind, action.job) == ("n0", "take-out", "ml/bert")
    assert "Ready=Unknown" in action.detail and "ml/bert-worker-0" in action.detail


@pytest.mark.parametrize(
    ("ready", "taints", "pods", "kind"),
    [
        ("Unknown", (UNREACHABLE,), [pod("p", "n0")], "mark"),  # not evicted (yet, or a zone)
        ("Unknown", (UNREACHABLE, MARKED), [pod("p", "n0")], None),  # marked already
        ("Unknown", (NO_SCHEDULE,), [pod("p", "n0", -5)], None),  # no NoExecute taint
        ("Unknown", (UNREACHABLE,), [pod("p", "n0", -5, "Succeeded")], None),  # finished
        ("False", (NOT_READY,), [pod("p", "n0", 10)], "mark"),  # its kubelet may still end it
        ("False", (NOT_READY,), [pod("p", "n0", -1)], "take-out"),  # grace over, still bound
        ("Unknown", (UNREACHABLE, MARKED), [pod("p", "n0", -5)], "take-out"),
        ("Unknown", (UNREACHABLE, OOS), [pod("p", "n0", -5)], None),  # out already
        ("Unknown", (UNREACHABLE,), [], None),  # none of ours there
    ],
    ids=[
        "not-evicted",
        "marked",
        "no-noexecute",
        "finished",
        "in-grace",
        "grace-over",
        "marked-evicted",
        "out",
        "idle",
    ],  # fmt: skip
)
def test_a_node_gone_under_a_gang_is_marked_and_taken_out_once_kubernetes_gave_up(
    ready: str, taints: tuple[V1Taint, ...], pods: list[V1Pod], kind: str | None
) -> None:
    actions = nodewatch.decide([node("n0", ready, taints)], pods, NOW)
    assert [a.kind for a in actions] == ([kind] if kind else [])
    assert all(a.job == "ml/bert" and "ml/p" in a.detail for a in actions)


def test_a_node_ready_again_is_given_back_only_if_the_watcher_took_it_out() -> None:
    back = node("back", taints=(OOS,), ours=True)
    theirs = node("theirs", taints=(OOS,))  # someone else's taint: theirs to remove
    (action,) = nodewatch.decide([back, theirs], [], NOW)
    assert (action.node, action.kind) == ("back", "bring-back")


def test_the_gang_tolerates_a_lost_node_for_node_lost_after_s() -> None:
    cfg = jobfile.preset("trn1-bert-large", ["kubernetes.node_lost_after_s=45"])
    tols = podspec.node_lost_tolerations(cfg)
    assert {t["key"] for t in tols} == set(podspec.NODE_LOST_TAINTS)
    assert all(t["effect"] == "NoExecute" and t["tolerationSeconds"] == 45 for t in tols)


def renewed(seconds_ago: float) -> datetime:
    return NOW - timedelta(seconds=seconds_ago)


def test_a_pod_its_job_gave_up_on_a_node_whose_kubelet_went_silent_is_let_go() -> None:
    """Before Kubernetes' verdict (the node still Ready): the job's RestartJob asked for the
    pod's deletion, and the kubelet missed two lease renewals."""
    nodes = [node("n0"), node("n1"), node("n2")]
    pods = [pod("bert-worker-0", "n0", evicted_s=90), pod("bert-worker-1", "n1", evicted_s=90)]
    leases = {"n0": renewed(21), "n1": renewed(3), "n2": renewed(5)}
    (action,) = nodewatch.decide(nodes, pods, NOW, leases)
    assert (action.node, action.kind, action.pod, action.job) == (
        "n0",
        "let-go",
        "ml/bert-worker-0",
        "ml/bert",
    )
    assert "silent for 21 s" in action.detail


@pytest.mark.parametrize(
    ("lease_age", "evicted_s", "phase"),
    [
        (nodewatch.LEASE_STALE_S - 1, 90, "Running"),  # one renewal missed: may be late only
        (60, None, "Running"),  # nobody gave the pod up: the node controller's rules decide
        (60, 90, "Failed"),  # ended: nothing holds the gang
    ],
    ids=["fresh-lease", "not-given-up", "finished"],
)
def test_nothing_is_let_go_without_a_silent_kubelet_and_a_pod_given_up(
    lease_age: float, evicted_s: float | None, phase: str
) -> None:
    pods = [pod("bert-worker-0", "n0", evicted_s=evicted_s, phase=phase)]
    leases = {"n0": renewed(lease_age), "n1": renewed(1), "n2": renewed(1)}
    actions = nodewatch.decide([node("n0"), node("n1"), node("n2")], pods, NOW, leases)
    assert [a for a in actions if a.kind == "let-go"] == []


def test_nothing_is_let_go_when_most_ready_nodes_went_silent_at_once() -> None:
    """The control plane cut off from the nodes looks like every kubelet silent: hold back."""
    nodes = [node(f"n{i}") for i in range(4)]
    pods = [pod(f"bert-worker-{i}", f"n{i}", evicted_s=90) for i in range(4)]
    leases = {"n0": renewed(30), "n1": renewed(30), "n2": renewed(30), "n3": renewed(1)}
    assert nodewatch.decide(nodes, pods, NOW, leases) == []
    leases["n1"] = leases["n2"] = renewed(1)  # one of four: the node, not the plane
    assert [a.node for a in nodewatch.decide(nodes, pods, NOW, leases)] == ["n0"]


def test_once_kubernetes_judged_the_node_its_own_out_of_service_path_applies() -> None:
    lost = node("n0", "Unknown", (NO_SCHEDULE, UNREACHABLE, MARKED))
    pods = [pod("bert-worker-0", "n0", evicted_s=-5)]
    leases = {"n0": renewed(90), "n1": renewed(1), "n2": renewed(1)}
    actions = nodewatch.decide([lost, node("n1"), node("n2")], pods, NOW, leases)
    assert [a.kind for a in actions] == ["take-out"]
