"""The Kubernetes backend: submit, status, logs, cancel and list Volcano jobs (one import).

Submits what the pure builder (volcano.py) made: a ConfigMap with the resolved job file, then
the Volcano Job. Status and logs live in status.py, the connection and error mapping in
client.py; both are re-exported here for the CLI.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainmaster.backends.kubernetes.client import (
    JOBS,
    Cluster,
    Conflict,
    NotFound,
    as_body,
    best_effort,
    call,
    connect,
    list_all,
    obj,
)
from trainmaster.backends.kubernetes.names import GROUP, PLURAL, VERSION
from trainmaster.backends.kubernetes.status import (
    JobStatus,
    PodInfo,
    as_run_state,
    logs,
    phase_of,
    pods,
    rank0_pod,
    status,
)
from trainmaster.backends.kubernetes.volcano import (
    MANAGED_SELECTOR,
    config_map_name,
    render_yaml,
)
from trainmaster.cluster.progressguard import map_name
from trainmaster.errors import JobFailed, UserError

__all__ = [
    "Cluster",
    "JobStatus",
    "JobSummary",
    "PodInfo",
    "as_run_state",
    "cancel",
    "connect",
    "list_jobs",
    "logs",
    "pods",
    "rank0_pod",
    "render_yaml",
    "status",
    "submit",
]


# How long a launch waits for a cancelled job of the same name to go: `cancel` deletes it in
# the Foreground, so the Job stays until its pods are gone, each after its grace period.
DELETING_WAIT_S = 180.0


def _job_state(cluster: Cluster, name: str, ns: str) -> str:
    """ "absent", "deleting" (cancelled, its pods still going) or "live"."""
    try:
        with call(cluster, "get", JOBS, name, ns):
            job = cluster.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    except NotFound:
        return "absent"
    return "deleting" if obj(job)["metadata"].get("deletionTimestamp") else "live"


def _job_exists(cluster: Cluster, name: str, ns: str) -> bool:
    return _job_state(cluster, name, ns) != "absent"


def _wait_until_deleted(
    cluster: Cluster,
    name: str,
    ns: str,
    timeout_s: float,
    say: Callable[[str], None] | None = None,
) -> None:
    """A job of this name being deleted (cancel, then launch again): wait for it to go, so the
    new one is not refused as existing. Polled: a launch waits here at most timeout_s."""
    deadline = time.monotonic() + timeout_s
    told = False
    while _job_state(cluster, name, ns) == "deleting":
        if say is not None and not told:
            say(f"waiting up to {timeout_s:.0f} s: the cancelled job {name} is still being deleted")
            told = True
        if time.monotonic() > deadline:
            raise UserError(
                f"job {name} in namespace {ns} is still being deleted after {timeout_s:.0f} s "
                "(its pods are terminating); launch again when `trainmaster list` no longer "
                "shows it, or choose another job.name",
                where="job.name",
            )
        time.sleep(0.5)


def submit(
    cluster: Cluster,
    objects: list[dict[str, Any]],
    *,
    dry_run: bool = False,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Create the ConfigMaps, then the Job; `dry_run` has the API server check them, persisting nothing.
    A cancelled job of the same name still being deleted is waited for (`say` tells the user).

    Fields are validated strictly (an unknown field is an error, not silently dropped). When the
    Job cannot be created, the ConfigMaps made for it are removed again; once the Job exists it
    owns them, so deleting the Job by any means removes them all.
    """
    *maps, job = objects
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    opts: dict[str, Any] = {"field_validation": "Strict"} | ({"dry_run": "All"} if dry_run else {})
    exists = UserError(
        f"job {name} exists in namespace {ns}; cancel it (`trainmaster cancel {name}`) "
        "or choose another job.name",
        where="job.name",
    )
    if not dry_run:
        _wait_until_deleted(cluster, name, ns, DELETING_WAIT_S, say)
    elif _job_state(cluster, name, ns) == "deleting":
        # The name is taken until the cancelled job has gone, which a launch waits for: the
        # server checks the same objects under names it generates, so the dry run answers for
        # the launch and not for the old job.
        if say is not None:
            say(
                f"the cancelled job {name} is still being deleted: a launch now waits up to "
                f"{DELETING_WAIT_S:.0f} s for it (the server checks the objects under generated names)"
            )
        *maps, job = [_generated_name(o) for o in objects]
    made: list[str] = []
    try:
        for cm in maps:
            cm_name = cm["metadata"].get("name") or cm["metadata"]["generateName"]
            try:
                with call(cluster, "create", "configmaps", cm_name, ns):
                    cluster.core.create_namespaced_config_map(ns, as_body(cm), **opts)
            except Conflict as exc:
                # The map of a live job, or one left by an interrupted submit: replace only the latter.
                if _job_exists(cluster, name, ns):
                    raise exists from exc
                with call(cluster, "update", "configmaps", cm_name, ns):
                    cluster.core.replace_namespaced_config_map(cm_name, ns, as_body(cm), **opts)
            made.append(cm_name)
        try:
            with call(cluster, "create", JOBS, name, ns):
                created = obj(
                    cluster.custom.create_namespaced_custom_object(
                        GROUP, VERSION, ns, PLURAL, job, **opts
                    )
                )
                created["metadata"]["name"] = name  # the job's own (a generated one above)
        except Conflict as exc:
            raise exists from exc
    except (UserError, JobFailed):
        if not dry_run:
            for cm_name in made:
                _delete_config_map(cluster, cm_name, ns)
        raise
    if not dry_run:
        owner = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Job",
            "name": name,
            "uid": created["metadata"]["uid"],
            "blockOwnerDeletion": False,
        }
        for cm_name in made:
            with best_effort():
                cluster.core.patch_namespaced_config_map(
                    cm_name, ns, {"metadata": {"ownerReferences": [owner]}}
                )
    return obj(created)


def _generated_name(o: dict[str, Any]) -> dict[str, Any]:
    """A copy that asks the server for a name of its own (kept within a DNS label's 63)."""
    meta = {k: v for k, v in o["metadata"].items() if k != "name"}
    meta["generateName"] = o["metadata"]["name"][:57] + "-"
    return {**o, "metadata": meta}


def _delete_config_map(cluster: Cluster, name: str, ns: str) -> None:
    with best_effort():
        cluster.core.delete_namespaced_config_map(name, ns)


def cancel(cluster: Cluster, name: str) -> None:
    """Delete the Job (Foreground: its pods go first) and its ConfigMaps."""
    with call(cluster, "delete", JOBS, name):
        cluster.custom.delete_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, PLURAL, name, propagation_policy="Foreground"
        )
    for cm_name in (config_map_name(name), map_name(name)):
        _delete_config_map(cluster, cm_name, cluster.namespace)


@dataclass
class JobSummary:
    name: str
    namespace: str
    phase: str
    volcano_phase: str
    nodes: int
    running: int
    created: str
    kind: str
    retries: int = 0  # Volcano's restarts of the gang (status.retryCount)


def list_jobs(cluster: Cluster, *, all_namespaces: bool = False) -> list[JobSummary]:
    """Jobs trainmaster made (label app.kubernetes.io/managed-by=trainmaster), newest first."""
    if all_namespaces:
        fetch = functools.partial(
            cluster.custom.list_cluster_custom_object,
            GROUP,
            VERSION,
            PLURAL,
            label_selector=MANAGED_SELECTOR,
        )
    else:
        fetch = functools.partial(
            cluster.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            cluster.namespace,
            PLURAL,
            label_selector=MANAGED_SELECTOR,
        )
    out = []
    for job in list_all(cluster, JOBS, fetch):  # in pages (k8s_client.list_all)
        meta, st = job["metadata"], job.get("status", {})
        vphase = st.get("state", {}).get("phase", "Pending")
        out.append(
            JobSummary(
                name=meta["name"],
                namespace=meta.get("namespace", cluster.namespace),
                phase=phase_of(vphase, bool(meta.get("deletionTimestamp"))),
                volcano_phase=vphase,
                nodes=sum(int(t.get("replicas", 0)) for t in job.get("spec", {}).get("tasks", [])),
                running=int(st.get("running", 0)),
                created=meta.get("creationTimestamp", ""),
                kind=meta.get("labels", {}).get("trainmaster.io/kind", ""),
                retries=int(st.get("retryCount", 0)),
            )
        )
    return sorted(out, key=lambda j: j.created, reverse=True)
