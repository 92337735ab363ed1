"""The node watcher: a gang leaves a node that stopped answering by itself, with nobody at hand.

    python -m trainmaster.backends.kubernetes.nodewatch [--period 2] [--once]

runs in the cluster (k8s/node-watcher.yaml of `cluster plan`: a Deployment on the system nodes,
under a role that may read nodes and pods and patch nodes). Why it is needed: an instance that
is impaired but stays "running" stops its kubelet's heartbeat; the node controller taints the
node unreachable, and once the training pods' toleration has passed
(kubernetes.node_lost_after_s, backends/kubernetes/podspec.py) they are evicted. But no kubelet
is there to confirm they stopped, so they stay Terminating for good: a replacement of the same
name cannot be created, Volcano keeps the job Running, and the gang is stuck until a person acts
(measured on the local control plane, 10 minutes and counting).

Kubernetes' own answer for a node that is really gone is the `node.kubernetes.io/out-of-service`
taint (non-graceful node shutdown, GA in 1.28): the pod garbage collector force-deletes the
node's terminating pods and their volumes are detached. The watcher sets it, with nobody at
hand, only where Kubernetes itself has already given up on the pods:

- a node NotReady and tainted NoExecute by the node controller (its grace period passed;
  nodemark.lost, which says why the watcher waits for that taint) under a live trainmaster pod
  is marked at once (trainmaster's taint, reason node-not-ready, naming the pod's job),
  whether or not it comes back: a node that blinked out during a job is not
  trusted with the next restart until `trainmaster node clear` (Kubernetes' own taints go with
  the NotReady condition, so a flapping node would take the restarted gang back);
- such a node on which a live trainmaster pod was evicted and is still there (Ready=Unknown: no kubelet will confirm it; Ready=False: its
  grace period has passed too), is taken out of service (marked first if it was not); Volcano's PodEvicted policy then restarts the gang on the other nodes. Eviction is
  the node controller's, so its own safeguards hold: a zone or cluster that lost touch as a
  whole is not evicted, and then the watcher does nothing either;
- a node it took out of service that is Ready again gets that taint back off (Kubernetes
  leaves it to whoever set it); trainmaster's mark stays until someone clears it.

Before all that, and faster: a trainmaster pod whose deletion was asked (Volcano's RestartJob,
once the pod's peers ended theirs because its node stopped answering them: run/peers.py) on a
node whose kubelet has not renewed its lease for LEASE_STALE_S (two renewals missed) is let go:
the node marked first (the restarted gang must not land there), then the pod deleted with no
grace, so that Volcano can create its replacement now rather than after the node controller's
grace and the pods' toleration. Only while the node is still Ready: once the node controller
has judged it, the rules above apply. What makes that safe is the run's fence (run/peers.py): if
the node was only cut off, its old ranks write nothing to the run once the new attempt started.
Kubernetes' own safeguard is kept in spirit: when more than half of the Ready nodes went silent
at once (the control plane cut off, not the nodes), nothing is let go.

decide() is pure (nodes, pods, now -> actions) and tested like completion.py; the loop applies
what it returns.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from trainmaster.backends.kubernetes import nodemark
from trainmaster.backends.kubernetes.client import ApiError, Cluster, TransportError, call, connect
from trainmaster.errors import JobFailed, UserError

OUT_OF_SERVICE = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown"}
OURS = "trainmaster.io/out-of-service-since"  # annotation: the watcher set the taint, when
JOB_LABEL = "trainmaster.io/job"
FINISHED = ("Succeeded", "Failed")
VERBS = {
    "mark": "marked unhealthy",
    "take-out": "out of service",
    "bring-back": "back in service",
    "let-go": "let go of its pod",
}
# The kubelet renews its node's lease every 10 s (nodeLeaseDurationSeconds 40 x 0.25): a lease
# this old has missed two renewals.
LEASE_STALE_S = 20.0
NODE_LEASES = "kube-node-lease"


@dataclass(frozen=True)
class Action:
    node: str
    kind: Literal["mark", "take-out", "bring-back", "let-go"]
    detail: str
    job: str = ""  # NAMESPACE/JOB the node's mark names: `status` of that job shows it
    pod: str = ""  # let-go: NAMESPACE/NAME of the pod deleted


def _tainted(node: Any, keys: tuple[str, ...], effect: str) -> bool:
    return any(t.key in keys and t.effect == effect for t in node.spec.taints or [])


def _stuck(pod: Any, ready: str, now: datetime) -> bool:
    """Evicted (a deletion requested) and still there: for good on a node that does not answer
    (Unknown); once its grace period has passed (the deletion time) on one that says NotReady."""
    gone_at = pod.metadata.deletion_timestamp
    if gone_at is None or pod.status is None or pod.status.phase in FINISHED:
        return False
    return ready == "Unknown" or gone_at <= now


def _job(pods: list[Any]) -> str:
    """NAMESPACE/JOB of the first of these pods (by namespace and name)."""
    first = min(pods, key=lambda p: (p.metadata.namespace, p.metadata.name))
    return f"{first.metadata.namespace}/{(first.metadata.labels or {}).get(JOB_LABEL, '')}"


def _names(pods: list[Any]) -> str:
    return ", ".join(sorted(f"{p.metadata.namespace}/{p.metadata.name}" for p in pods))


def silent(nodes: list[Any], leases: dict[str, datetime], now: datetime) -> dict[str, float]:
    """Node -> seconds since its kubelet last renewed its lease, for the nodes still Ready
    whose lease is past LEASE_STALE_S: silent, and not judged by Kubernetes yet (once it has,
    its own out-of-service path below applies). Empty when more than half of the Ready nodes
    went silent at once (the control plane is cut off, not the nodes)."""
    ready = [n for n in nodes if nodemark.ready(n) == "True"]
    out = {}
    for node in ready:
        renewed = leases.get(node.metadata.name)
        age = (now - renewed).total_seconds() if renewed else None
        if age is not None and age >= LEASE_STALE_S:
            out[node.metadata.name] = age
    return {} if len(out) > max(1, len(ready) // 2) else out


def let_go(nodes: list[Any], pods: list[Any], leases: dict[str, datetime], now: datetime) -> list[Action]:  # fmt: skip
    """A pod given up (its deletion asked) on a node whose kubelet went silent: let it go."""
    quiet = silent(nodes, leases, now)
    actions = []
    for pod in sorted(pods, key=lambda p: (p.metadata.namespace, p.metadata.name)):
        node = pod.spec.node_name
        finished = pod.status is not None and pod.status.phase in FINISHED
        if node not in quiet or pod.metadata.deletion_timestamp is None or finished:
            continue
        name = f"{pod.metadata.namespace}/{pod.metadata.name}"
        detail = f"its kubelet silent for {quiet[node]:.0f} s; {name} given up by its job"
        actions.append(Action(node, "let-go", detail, _job([pod]), pod=name))
    return actions


def decide(
    nodes: list[Any],
    pods: list[Any],
    now: datetime,
    leases: dict[str, datetime] | None = None,
) -> list[Action]:
    """What to do now, from the cluster's nodes, trainmaster's pods (label JOB_LABEL) and the
    nodes' lease renewals (node -> renewTime; None: not read)."""
    released = let_go(nodes, pods, leases or {}, now)
    gone = {a.pod for a in released}
    pods = [p for p in pods if f"{p.metadata.namespace}/{p.metadata.name}" not in gone]
    return released + _verdicts(nodes, pods, now)


def _verdicts(nodes: list[Any], pods: list[Any], now: datetime) -> list[Action]:
    """The actions that wait for Kubernetes' verdict on a node (the module's doc)."""
    by_node: dict[str, list[Any]] = {}
    for pod in pods:
        if pod.spec.node_name:
            by_node.setdefault(pod.spec.node_name, []).append(pod)
    actions = []
    for node in nodes:
        name, ready = node.metadata.name, nodemark.ready(node)
        out = _tainted(node, (OUT_OF_SERVICE["key"],), "NoExecute")
        if ready == "True":
            if out and OURS in (node.metadata.annotations or {}):
                actions.append(Action(name, "bring-back", "Ready again"))
            continue
        why = nodemark.lost(node)  # Kubernetes gave up on it: its safeguards hold (nodemark.py)
        if out or why is None:
            continue
        stuck = [p for p in by_node.get(name, []) if _stuck(p, ready, now)]
        if stuck:
            detail = f"{why}; evicted, still bound: {_names(stuck)}"
            actions.append(Action(name, "take-out", detail, _job(stuck)))
            continue
        live = [p for p in by_node.get(name, []) if p.status and p.status.phase not in FINISHED]
        if live and not nodemark.is_marked(node):
            actions.append(Action(name, "mark", f"{why}; pods {_names(live)}", _job(live)))
    return actions


def _taints(node: Any) -> list[dict[str, Any]]:
    raw = [t.to_dict() for t in node.spec.taints or []]
    return [{k: v for k, v in t.items() if v is not None and k != "time_added"} for t in raw]


def apply(cluster: Cluster, action: Action, now: str) -> None:
    """Patch the node as the action says (the mark first: it is what keeps a gang away)."""
    if action.kind == "mark":
        nodemark.mark(cluster, action.node, nodemark.NOT_READY, action.detail, action.job)
        return
    if action.kind == "let-go":
        with call(cluster, "get", "nodes", action.node):
            node = cluster.core.read_node(action.node)
        if not nodemark.is_marked(node):  # first: the restarted gang must not land there
            nodemark.mark(cluster, action.node, nodemark.NOT_READY, action.detail, action.job)
        namespace, name = action.pod.split("/", 1)
        with call(cluster, "delete", "pods", name):
            cluster.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        return
    with call(cluster, "get", "nodes", action.node):
        node = cluster.core.read_node(action.node)
    if action.kind == "take-out":
        if not nodemark.is_marked(node):
            nodemark.mark(cluster, action.node, nodemark.NOT_READY, action.detail, action.job)
            with call(cluster, "get", "nodes", action.node):
                node = cluster.core.read_node(action.node)
        taints = [*_taints(node), {**OUT_OF_SERVICE, "effect": "NoExecute"}]
        annotations: dict[str, str | None] = {OURS: now}
    else:
        taints = [t for t in _taints(node) if t["key"] != OUT_OF_SERVICE["key"]]
        annotations = {OURS: None}
    # The whole taint list is replaced: the resourceVersion makes the patch fail (409, tried
    # again at the next look) if the node controller changed the node since it was read.
    version = node.metadata.resource_version
    patch = {
        "metadata": {"annotations": annotations, "resourceVersion": version},
        "spec": {"taints": taints},
    }
    with call(cluster, "patch", "nodes", action.node):
        cluster.core.patch_node(action.node, patch)


def leases(cluster: Cluster) -> dict[str, datetime]:
    """Node -> when its kubelet last renewed its lease (kube-node-lease)."""
    try:
        with call(cluster, "list", "leases", NODE_LEASES):
            items = cluster.coordination.list_namespaced_lease(NODE_LEASES).items
    except ApiError as exc:  # a plan from before the watcher read leases: its other rules hold
        print(f"node watcher: node leases not read, nothing let go early: {exc}", file=sys.stderr)
        return {}
    return {x.metadata.name: x.spec.renew_time for x in items if x.spec and x.spec.renew_time}


def once(cluster: Cluster, now: datetime) -> list[Action]:
    with call(cluster, "list", "nodes", ""):
        nodes = list(cluster.core.list_node().items)
    with call(cluster, "list", "pods", ""):
        pods = list(cluster.core.list_pod_for_all_namespaces(label_selector=JOB_LABEL).items)
    actions = decide(nodes, pods, now, leases(cluster))
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for action in actions:
        apply(cluster, action, stamp)
        verb = VERBS[action.kind]
        print(f"{stamp} node {action.node} {verb}: {action.detail}", flush=True)
    return actions


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="nodewatch", description=__doc__.split("\n")[0])
    ap.add_argument("--period", type=float, default=2.0, help="seconds between looks (2)")
    ap.add_argument("--once", action="store_true", help="look once and exit")
    a = ap.parse_args(argv)
    try:
        cluster = connect()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    while True:
        try:
            once(cluster, datetime.now(UTC))
        except (UserError, JobFailed, ApiError, TransportError) as exc:  # the next look tries again
            print(f"node watcher: {exc}", file=sys.stderr, flush=True)
        if a.once:
            return 0
        time.sleep(a.period)  # a controller's resync period, not synchronisation


if __name__ == "__main__":
    sys.exit(main())
