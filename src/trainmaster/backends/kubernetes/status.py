"""Status and logs of a Volcano job: its phase, pods, restarts, and which pod holds rank 0.

Rank 0 is not the pod with index 0: torchrun assigns ranks at the rendezvous. Rank 0 writes
rank0.json naming its pod when it starts (and again after every restart), and the pod holding
it publishes that name in the job's progress record (publish.py, progressmap.py): rank0_pod()
takes it from there, one small read. Only where no record names a pod of this attempt yet
(rank 0 still starting, the cluster lacks k8s/job-progress.yaml, or a job whose pods predate
the record's field) does it read the head of each pod's log for the trainer's
`trainmaster: rank 0 on pod <POD_NAME>` line: RANK0_SCAN_BYTES each, CONNECTIONS pods at a
time (at 1,024 pods one after another, every round trip to the API server would add up).

At scale: pods are listed in pages (k8s_client.list_all) as plain JSON and put in node order
by one sort, O(n log n); nothing here looks a pod up in a list.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from trainmaster.backends.kubernetes import names as k8s_names
from trainmaster.backends.kubernetes import progressmap, waiting
from trainmaster.backends.kubernetes.client import (
    CONNECTIONS,
    JOBS,
    Cluster,
    call,
    lines,
    list_all,
    obj,
)
from trainmaster.backends.kubernetes.names import GROUP, PLURAL, VERSION
from trainmaster.backends.kubernetes.volcano import (
    ANN_CONFIG_HASH,
    ANN_STORAGE,
    LABEL_JOB,
    TASK,
)
from trainmaster.errors import JobFailed, UserError
from trainmaster.monitor.progress import RunProgress
from trainmaster.run import state

RANK0_LINE = re.compile(r"trainmaster: rank 0 on pod (\S+)")
# per pod, the fallback's: the line comes once the trainer has started, after the pod script's
# and torchrun's first lines; a later claim (rank 0 moved at a restart) is the record's to tell
RANK0_SCAN_BYTES = 256 << 10
PHASES = {
    "Pending": "pending",
    "Running": "running",
    "Restarting": "running",
    "Completing": "running",
    "Completed": "succeeded",
    "Aborting": "cancelled",
    "Aborted": "cancelled",
    "Terminating": "failed",
    "Terminated": "failed",
    "Failed": "failed",
}


def phase_of(vphase: str, deleting: bool) -> str:
    """Volcano's phase in our words; a live job being deleted (cancel deletes in the
    Foreground: the Job stays until its pods are gone) is cancelled, an ended one keeps its
    outcome."""
    phase = PHASES.get(vphase, "pending")
    return "cancelled" if deleting and phase in ("pending", "running") else phase


@dataclass
class PodInfo:
    name: str
    index: int  # the node index: Volcano's pod name suffix
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    node: str | None = None
    restarts: int = 0
    exit_code: int | None = None
    reason: str = ""
    started: str = ""  # status.startTime: when the kubelet took this pod (RFC 3339, UTC)


@dataclass
class JobStatus:
    name: str
    namespace: str
    phase: str  # ours (run/state.py): pending | running | succeeded | failed | cancelled
    volcano_phase: str
    retries: int  # Volcano's restarts of the gang (status.retryCount): JobStatus.job_retries
    min_available: int
    replicas: int
    pods: list[PodInfo] = field(default_factory=list)
    rank0_pod: str | None = None
    message: str = ""
    config_hash: str = ""
    storage: str = ""
    created: str = ""
    attempt: int = 0  # Volcano's status.version: bumped by every restart (the pods' job-version)
    record: RunProgress | None = None  # the progress record rank 0's pod published (find_rank0)


def _pod_info(pod: dict[str, Any]) -> PodInfo:
    """A pod as the API serves it (JSON: v1 Pod field names)."""
    name = pod["metadata"]["name"]
    suffix = name.rpartition("-")[2]
    spec, st = pod.get("spec") or {}, pod.get("status") or {}
    info = PodInfo(
        name=name,
        index=int(suffix) if suffix.isdigit() else -1,
        phase=st.get("phase") or "Unknown",
        node=spec.get("nodeName"),
        started=st.get("startTime") or "",
    )
    for cs in st.get("containerStatuses") or []:
        info.restarts += cs.get("restartCount") or 0
        term = (cs.get("state") or {}).get("terminated")
        if term is not None:
            info.exit_code, info.reason = term.get("exitCode"), term.get("reason") or ""
    return info


def pods(cluster: Cluster, name: str) -> list[PodInfo]:
    """The job's pods in node order (the API lists by name: worker-10 before worker-2)."""
    found = list_all(
        cluster,
        "pods",
        functools.partial(
            cluster.core.list_namespaced_pod,
            cluster.namespace,
            label_selector=f"{LABEL_JOB}={name}",
        ),
    )
    return sorted((_pod_info(p) for p in found), key=lambda p: (p.index, p.name))


def status(cluster: Cluster, name: str, *, find_rank0: bool = True) -> JobStatus:
    with call(cluster, "get", JOBS, name):
        job = obj(
            cluster.custom.get_namespaced_custom_object(
                GROUP, VERSION, cluster.namespace, PLURAL, name
            )
        )
    meta, spec, st = job["metadata"], job.get("spec", {}), job.get("status", {})
    vphase = st.get("state", {}).get("phase", "Pending")
    ann = meta.get("annotations", {})
    out = JobStatus(
        name=name,
        namespace=cluster.namespace,
        phase=phase_of(vphase, bool(meta.get("deletionTimestamp"))),
        volcano_phase=vphase,
        retries=int(st.get("retryCount", 0)),
        min_available=int(spec.get("minAvailable", 0)),
        replicas=sum(int(t.get("replicas", 0)) for t in spec.get("tasks", [])),
        message=st.get("state", {}).get("message", ""),
        config_hash=ann.get(ANN_CONFIG_HASH, ""),
        storage=ann.get(ANN_STORAGE, ""),
        created=meta.get("creationTimestamp", ""),
        attempt=int(st.get("version", 0)),
    )
    out.pods = pods(cluster, name)
    if out.phase != PHASES.get(vphase, "pending"):  # phase_of: cancelled while it goes
        out.message = "being deleted (its pods go first)"
    unbound = len(out.pods) < out.min_available or any(not p.node for p in out.pods)
    if out.phase in ("pending", "running") and unbound:
        # the gang waits: the scheduler's reason is on the PodGroup (waiting.py)
        why = waiting.reason(cluster, name, meta.get("uid", ""), out.min_available)
        out.message = why or out.message
    if find_rank0:
        out.record = progressmap.read(cluster, name)
        out.rank0_pod = rank0_pod(cluster, out.pods, out.record)
    return out


def _timestamp(stamp: str) -> tuple[str, int]:
    """RFC3339Nano (trailing zeros trimmed) -> comparable (seconds, nanoseconds)."""
    seconds, _, frac = stamp.rstrip("Z").partition(".")
    return seconds, int((frac + "000000000")[:9])


def _rank0_claim(cluster: Cluster, pod: str) -> tuple[str, int] | None:
    """When the head of the pod's own log (RANK0_SCAN_BYTES) last said `trainmaster: rank 0 on
    pod <pod>`, if it did: rank0_pod()'s fallback."""
    try:
        with call(cluster, "read log of", "pods", pod):
            resp = cluster.core.read_namespaced_pod_log(
                pod,
                cluster.namespace,
                timestamps=True,
                limit_bytes=RANK0_SCAN_BYTES,
                _preload_content=False,
            )
    except (UserError, JobFailed):
        # gone or not started since it was listed, or its node serves no logs (a lost node:
        # the API server answers 500): not known as rank 0 now
        return None
    newest: tuple[str, int] | None = None
    for line in lines(resp):
        stamp, _, text = line.partition(" ")
        m = RANK0_LINE.search(text)
        if m and m.group(1) == pod and (newest is None or _timestamp(stamp) >= newest):
            newest = _timestamp(stamp)
    return newest


STARTED = ("Running", "Succeeded", "Failed")


def _epoch(stamp: str) -> float | None:
    """RFC 3339 UTC ("2026-12-04T12:00:05Z", a pod's startTime) -> Unix time."""
    try:
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def claimed_rank0(infos: list[PodInfo], record: RunProgress | None) -> str | None:
    """The pod the record says holds rank 0 (rank0.json as that pod last published it), if it
    is one of these pods, started, and started no later than rank 0 wrote the claim: the pods
    of every attempt have the same names, so a claim older than the pod is an earlier attempt's
    (startTime and rank0.json's time are both that node's clock). A move of rank 0 at a restart
    shows once the new holder publishes (publish.PUBLISH_S)."""
    if record is None or not record.rank0_pod:
        return None
    pod = next((p for p in infos if p.name == record.rank0_pod and p.phase in STARTED), None)
    if pod is None:
        return None
    began = _epoch(pod.started)
    if began is not None and record.rank0_at is not None and record.rank0_at < began:
        return None
    return pod.name


def rank0_pod(
    cluster: Cluster, infos: list[PodInfo], record: RunProgress | None = None
) -> str | None:
    """The pod holding rank 0: the record's claim (claimed_rank0). Without one, the fallback:
    the pod whose own log, in its first RANK0_SCAN_BYTES, has the newest
    `trainmaster: rank 0 on pod <itself>` line (a tie: the later pod in node order); the logs
    are read CONNECTIONS at a time."""
    claimed = claimed_rank0(infos, record)
    if claimed is not None:
        return claimed
    started = [p.name for p in infos if p.phase in STARTED]
    if not started:
        return None
    with ThreadPoolExecutor(max_workers=min(CONNECTIONS, len(started))) as pool:
        claims = list(pool.map(functools.partial(_rank0_claim, cluster), started))
    best: tuple[tuple[str, int], str] | None = None
    for name, claim in zip(started, claims, strict=True):
        if claim is not None and (best is None or claim >= best[0]):
            best = (claim, name)
    return best[1] if best else None


def logs(
    cluster: Cluster,
    name: str,
    *,
    node: int | None = None,
    follow: bool = False,
    tail_lines: int | None = None,
) -> tuple[str, Iterator[str]]:
    """(pod, its lines): rank 0's pod by default (pod 0 until the trainer has said which), or a node's."""
    infos = pods(cluster, name)
    if not infos:
        status(cluster, name, find_rank0=False)  # "no job NAME" when there is none
        raise UserError(f"job {name} has no pods yet; see `trainmaster status {name}`", where="JOB")
    if node is not None:
        pod = k8s_names.pod_name(name, TASK, node)
        if pod not in {p.name for p in infos}:
            have = ", ".join(p.name for p in infos)
            raise UserError(f"no pod {pod} (pods: {have})", where="--node")
    else:
        pod = rank0_pod(cluster, infos, progressmap.read(cluster, name)) or infos[0].name
    opts: dict[str, Any] = {"follow": follow, "_preload_content": False}
    if tail_lines is not None:
        opts["tail_lines"] = tail_lines
    with call(cluster, "read log of", "pods", pod):
        resp = cluster.core.read_namespaced_pod_log(pod, cluster.namespace, **opts)
    return pod, lines(resp)


def as_run_state(st: JobStatus) -> state.RunState:
    """The local backend's state shape, so `status` can print both backends alike."""
    nodes = [state.NodeState(index=p.index, exit_code=p.exit_code, log=p.name) for p in st.pods]
    return state.RunState(
        job=st.name,
        backend="kubernetes",
        phase=st.phase,
        config_hash=st.config_hash,
        nnodes=st.replicas,
        nodes=nodes,
        message=st.message or f"Volcano phase {st.volcano_phase}, {st.retries} job retry(s)",
    )
