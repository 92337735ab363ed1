"""Why a Volcano job waits: the gang scheduler's answer, read from the job's PodGroup.

Volcano's job controller creates no pod until the PodGroup `<job>-<job uid>` is Inqueue, and
its scheduler binds no pod until the whole gang fits (minMember). So a job that waits has no
pod, or only unbound ones, and the reason lives on the PodGroup (observed on Volcano v1.15.1,
controlplane/README.md "What Volcano does"):
- while the gang exceeds what the cluster could ever give, the PodGroup stays Pending with
  events `Unschedulable` "resource in cluster is overused: overused aws.amazon.com/neuron, ..."
  (the overcommit plugin at enqueue) and no condition;
- once Inqueue but not placeable, a condition type Unschedulable (reason NotEnoughResources)
  whose message ends with the first pod's scheduling failure: "... Origin reason is
  <pod>: 0/3 nodes are unavailable: ...".
A condition stays on the PodGroup after the gang was placed (only a newer Scheduled one
follows), and events outlive the wait by an hour, so both count only while the job waits.
Reading events needs `list events` in the namespace; without it status says less, not fails.
"""

from __future__ import annotations

import json
import re
from typing import Any

from trainmaster import catalog
from trainmaster.backends.kubernetes.client import ApiError, Cluster, TransportError

SCHEDULING = ("scheduling.volcano.sh", "v1beta1", "podgroups")
PREFIX = "waiting:"  # every reason explain() gives starts so
OVERUSED = re.compile(r"overused ([A-Za-z0-9./_-]+)")
ORIGIN = re.compile(r"Origin reason is [^:]+: (.*)$", re.S)


def podgroup_name(job: str, uid: str) -> str:
    """Volcano's PodGroup of a job: `<job>-<job uid>` (since v1.6; pod_script.py says where)."""
    return f"{job}-{uid}"


def explain(message: str, gang: int) -> str:
    """One line from a Volcano scheduling message: which resources the gang lacks, or why its
    pods cannot be placed; the scheduler's own words follow in parentheses."""
    message = " ".join(message.split())
    lacking = list(dict.fromkeys(OVERUSED.findall(message)))
    if lacking:
        # the accelerators first (the usual cause), then other devices (EFA), then cpu, memory
        lacking.sort(
            key=lambda r: 0 if r in (catalog.NEURON, catalog.NVIDIA_GPU) else 2 - ("/" in r)
        )
        return (
            f"{PREFIX} the gang of {gang} pods does not fit in the cluster: insufficient "
            f"{', '.join(lacking)} (Volcano: {message})"
        )
    origin = ORIGIN.search(message)
    if origin:
        return f"{PREFIX} not scheduled: {origin.group(1).strip()} (Volcano: {message})"
    return f"{PREFIX} not scheduled (Volcano: {message})"


def _stamp(event: dict[str, Any]) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )


def _newest_event(cluster: Cluster, group: str) -> str:
    try:
        resp = cluster.core.list_namespaced_event(
            cluster.namespace,
            field_selector=f"involvedObject.kind=PodGroup,involvedObject.name={group}",
            _preload_content=False,
        )
        try:
            items = json.loads(resp.data).get("items") or []
        finally:
            resp.release_conn()
    except (ApiError, TransportError, ValueError):
        return ""  # no right to list events, or none: say less
    unschedulable = [e for e in items if e.get("reason") == "Unschedulable"]
    if not unschedulable:
        return ""
    newest = max(_stamp(e) for e in unschedulable)
    # events of one moment: the gang plugin's "pod group is not ready" says less than the
    # overcommit plugin's "overused ..." beside it; prefer the one that names resources
    same = [e.get("message") or "" for e in unschedulable if _stamp(e) == newest]
    return next((m for m in same if OVERUSED.search(m)), same[0])


def reason(cluster: Cluster, job: str, uid: str, gang: int) -> str:
    """Why the job's gang is not placed, or "" when its PodGroup says nothing (or is placed)."""
    group = podgroup_name(job, uid)
    try:
        pg = cluster.custom.get_namespaced_custom_object(
            SCHEDULING[0], SCHEDULING[1], cluster.namespace, SCHEDULING[2], group
        )
    except (ApiError, TransportError):
        return ""  # not made yet, or not readable: nothing to add
    status = (pg or {}).get("status") or {}
    if status.get("phase") == "Running":
        return ""
    conditions = sorted(
        status.get("conditions") or [], key=lambda c: c.get("lastTransitionTime", "")
    )
    if conditions and conditions[-1].get("type") == "Unschedulable":
        message = conditions[-1].get("message") or ""
        if message:
            return explain(message, gang)
    message = _newest_event(cluster, group)
    return explain(message, gang) if message else ""
