"""Mark, list and clear unhealthy nodes (cluster/nodeguard.py says why and who may).

In a training pod whose node failed a check:

    python3 -m trainmaster.backends.kubernetes.nodemark REASON DETAIL

asks the API server who it is (SelfSubjectReview: a pod's token names its node), taints that
node `trainmaster.io/unhealthy=REASON:NoSchedule` with annotations (reason, detail, time, the
job's namespace/name from TRAINMASTER_JOB and the pod's namespace), and writes the one-line
termination message (`trainmaster: node fault: REASON on NODE: DETAIL`) to
$TRAINMASTER_TERMINATION_LOG (default /dev/termination-log), which the kubelet puts in the
pod's status. It runs before the pod exits, so the mark is there before Volcano restarts the
gang. The operator side lists marks (`status`) and clears them (`trainmaster node clear`).

A node that goes NotReady cannot be marked from its own pod (it is the node that stopped
answering); `status` of the job marks it instead, with the caller's credentials
(mark_not_ready), before the gang's restart is placed if status runs in time (launch --follow
polls it), and the node watcher (nodewatch.py) does with nobody at hand.

Whether a node is not ready is read here and nowhere else (ready(); status and the watcher
mark by the two facts below it, failing() and lost(), which say why each needs its own).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from trainmaster.backends.kubernetes.client import Cluster, call, connect, whoami
from trainmaster.backends.kubernetes.names import NODE_LOST_TAINTS
from trainmaster.cluster.nodeguard import (
    ANN_DETAIL,
    ANN_JOB,
    ANN_REASON,
    ANN_TIME,
    TAINT_KEY,
    ready_condition,
)
from trainmaster.cluster.nodeguard import NODE_NAME_EXTRA as NODE_NAME
from trainmaster.errors import UserError

TERMINATION_LOG = "/dev/termination-log"
NOT_READY = "node-not-ready"  # the reason of a mark that `status` made (mark_not_ready)
REASON_CHARS = 63  # a taint value: a label value, at most 63 characters


@dataclass(frozen=True)
class NodeMark:
    node: str
    reason: str
    detail: str
    since: str
    job: str  # NAMESPACE/JOB of the pod that marked it

    def line(self) -> str:
        return f"node {self.node} marked unhealthy ({self.reason}) at {self.since}: {self.detail}"


def _value(reason: str) -> str:
    clean = "".join(c if c.isalnum() or c in "-_." else "-" for c in reason)[:REASON_CHARS]
    return clean.strip("-_.") or "unhealthy"


def mark_patch(
    reason: str, detail: str, job: str, taints: list[dict[str, Any]], now: str
) -> dict[str, Any]:
    """The node patch: our taint (replacing an older one of ours), the annotations."""
    kept = [t for t in taints if t.get("key") != TAINT_KEY]
    ours = {"key": TAINT_KEY, "value": _value(reason), "effect": "NoSchedule"}
    return {
        "metadata": {
            "annotations": {
                ANN_REASON: reason,
                ANN_DETAIL: detail[:1000],
                ANN_TIME: now,
                ANN_JOB: job,
            }
        },
        "spec": {"taints": [*kept, ours]},
    }


def whoami_node(cluster: Cluster) -> tuple[str, str]:
    """(node, namespace) of this process's own service-account token (a pod's)."""
    info = whoami(cluster)
    nodes = info.get("extra", {}).get(NODE_NAME) or []
    if not nodes:
        raise UserError(
            "this token names no node (not a pod's service-account token)", where="nodemark"
        )
    user = str(info.get("username", ""))  # system:serviceaccount:NAMESPACE:NAME
    return str(nodes[0]), user.split(":")[2] if user.count(":") == 3 else ""


def mark(cluster: Cluster, node: str, reason: str, detail: str, job: str) -> None:
    with call(cluster, "get", "nodes", node):
        current = cluster.core.read_node(node)
    taints = [t.to_dict() for t in current.spec.taints or []]
    taints = [{k: v for k, v in t.items() if v is not None and k != "time_added"} for t in taints]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with call(cluster, "patch", "nodes", node):
        cluster.core.patch_node(node, mark_patch(reason, detail, job, taints, now))


def list_nodes(cluster: Cluster) -> list[Any]:
    """The cluster's nodes (needs `list nodes`; none when not allowed or not answered)."""
    from trainmaster.backends.kubernetes.client import ApiError, TransportError

    try:
        return list(cluster.core.list_node().items)
    except (ApiError, TransportError):
        return []


def ready(node: Any) -> str:
    """The node's Ready condition: "True"; "False", its kubelet's own word that it is not
    ready; "Unknown", set by the node controller once it stopped hearing from the kubelet (and
    read so for a node that reports no Ready condition at all; cluster/nodeguard.py reads it)."""
    return str(_ready_condition(node)[0])


def _ready_condition(node: Any) -> tuple[str, str]:
    """(status, "reason: message") of the node's Ready condition; ("Unknown", "") if none."""
    return ready_condition(node.status.conditions if node.status else None)


def not_ready(node: Any) -> str | None:
    """Why the node is not Ready ("Ready=False (KubeletNotReady)"), None when it is."""
    status, said = _ready_condition(node)
    if status == "True":
        return None
    return f"Ready={status}" + (f" ({said})" if said else "")


def given_up(node: Any) -> bool:
    """Whether the node lifecycle controller has tainted the node NoExecute as not-ready or
    unreachable: its verdict on the Ready condition, which evicts the pods once their toleration
    ends (podspec.node_lost_tolerations). Its safeguards come with it: it taints at a limited
    rate per zone, more slowly (in a small cluster not at all) while much of a zone is not
    ready, and when every node is not ready at once (the control plane cut off, not the nodes)
    it takes these taints off and evicts nothing (kubernetes pkg/controller/nodelifecycle,
    handleDisruption)."""
    taints = (node.spec.taints if node.spec else None) or []
    return any(t.key in NODE_LOST_TAINTS and t.effect == "NoExecute" for t in taints)


def lost(node: Any) -> str | None:
    """Why Kubernetes has given up on the node (not Ready, and given_up), else None: what the
    node watcher marks and takes out of service. It acts alone on every node of the cluster,
    so it waits for the controller's verdict and keeps its safeguards: a partition of the
    control plane, or a zone gone mostly NotReady at once (a bad rollout), marks nothing."""
    why = not_ready(node)
    return why if why is not None and given_up(node) else None


def failing(node: Any) -> str | None:
    """Why `status` marks the node under a running pod of its job (mark_not_ready), else None:
    lost, or Ready=False before the taint. False is the node's own kubelet saying it is not
    ready: a node that answers is not cut off, and the pod it holds may fail and Volcano place
    the restart within a second, before the controller's rate-limited taint comes. Unknown
    without the taint is left alone: only the controller sets Unknown, and where it does not
    taint too it is holding back (the whole cluster looks lost, or much of a zone), so marking
    then would mark every node of the job. Only the job's own nodes are marked, and `status`
    shows each mark."""
    return lost(node) or (not_ready(node) if ready(node) == "False" else None)


def is_marked(node: Any) -> bool:
    """Whether trainmaster's mark is on the node (a client model Node)."""
    return any(t.key == TAINT_KEY for t in node.spec.taints or [])


def mark_not_ready(
    cluster: Cluster, nodes: list[Any], pods: dict[str, str], job: str
) -> tuple[list[str], bool]:
    """Mark the nodes of a running job's pods (node -> pod) that are failing (failing()), as
    `status` (and launch --follow) sees them: the pod on such a node cannot mark it itself, and
    Kubernetes' own not-ready taint goes when the node reports Ready again, so a node that
    flaps would take the restarted gang back. With the caller's credentials (patch nodes).
    Returns what could not be marked (lines for `status`) and whether a node was marked."""
    problems, marked = [], False
    for node in nodes:
        name = node.metadata.name
        if name not in pods or is_marked(node):
            continue
        why = failing(node)
        if why is None:
            continue
        try:
            mark(cluster, name, NOT_READY, f"{why}; pod {pods[name]}", job)
            marked = True
        except UserError as exc:
            problems.append(
                f"node {name} of pod {pods[name]} is not ready: {why}; not marked: {exc}"
            )
    return problems, marked


def marks(cluster: Cluster, nodes: list[Any] | None = None) -> list[NodeMark]:
    """Every node trainmaster marked, of NODES or of the cluster (list_nodes)."""
    out = []
    nodes = list_nodes(cluster) if nodes is None else nodes
    for n in nodes:
        if is_marked(n):
            ann = n.metadata.annotations or {}
            out.append(
                NodeMark(
                    n.metadata.name,
                    ann.get(ANN_REASON, "?"),
                    ann.get(ANN_DETAIL, ""),
                    ann.get(ANN_TIME, "?"),
                    ann.get(ANN_JOB, ""),
                )
            )
    return out


def held_back(found: list[NodeMark]) -> str:
    """For a gang that waits: the nodes trainmaster's marks keep from it (the scheduler's
    message counts "untolerated taint(s)" without naming them) and how to give one back."""
    names = ", ".join(f"{m.node} ({m.reason})" for m in found)
    return (
        f"marked unhealthy, so not used: {names}; `trainmaster node clear {found[0].node}` "
        "once it is sound"
    )


def clear(cluster: Cluster, node: str) -> bool:
    """Remove the mark; False when the node had none."""
    with call(cluster, "get", "nodes", node):
        current = cluster.core.read_node(node)
    taints = current.spec.taints or []
    if not any(t.key == TAINT_KEY for t in taints):
        return False
    kept = [
        {k: v for k, v in t.to_dict().items() if v is not None and k != "time_added"}
        for t in taints
        if t.key != TAINT_KEY
    ]
    patch = {
        "metadata": {"annotations": dict.fromkeys((ANN_REASON, ANN_DETAIL, ANN_TIME, ANN_JOB))},
        "spec": {"taints": kept},
    }
    with call(cluster, "patch", "nodes", node):
        cluster.core.patch_node(node, patch)
    return True


def main(argv: list[str] | None = None) -> int:
    """In the pod: mark this node, write the termination message. Exit 0 even when the mark
    fails (the pod's own failure is what matters); the message then says so."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(
            "usage: python3 -m trainmaster.backends.kubernetes.nodemark REASON DETAIL",
            file=sys.stderr,
        )
        return 2
    reason, detail = args
    try:
        cluster = connect()
        node, namespace = whoami_node(cluster)
        mark(cluster, node, reason, detail, f"{namespace}/{os.environ.get('TRAINMASTER_JOB', '')}")
        message = f"trainmaster: node fault: {reason} on {node}: {detail}"
    except (UserError, OSError) as exc:
        message = f"trainmaster: node fault: {reason}: {detail} (node not marked: {exc})"
    print(message, file=sys.stderr)
    try:
        with open(os.environ.get("TRAINMASTER_TERMINATION_LOG", TERMINATION_LOG), "w") as f:
            f.write(message[:4000] + "\n")  # the kubelet keeps at most 4096 bytes
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
