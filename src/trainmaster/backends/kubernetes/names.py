"""Kubernetes names and what Volcano's admission webhook checks, done here before any API call.

The Volcano CRD schema validates shapes, not names, and the webhook's answer arrives only
after a round trip (or, for a pod name over 63 characters, only when the controller fails to
create the pod). The rules below are those of k8s.io/apimachinery/pkg/util/validation and of
Volcano's `validateJobCreate` (pkg/webhooks/admission/jobs/validate), so that a job we submit
is one the cluster accepts; each failure is a UserError naming the field to change.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from trainmaster.errors import UserError
from trainmaster.naming import (
    LABEL_MAX,
    is_dns1035_label,
    is_dns1123_label,
    is_dns1123_subdomain,
    is_label_value,
    is_qualified_name,
)

# The Volcano Job API (batch.volcano.sh/v1alpha1, Volcano v1.15 CRDs shipped in schemas/).
GROUP, VERSION, PLURAL = "batch.volcano.sh", "v1alpha1", "jobs"
API_VERSION = f"{GROUP}/{VERSION}"

# Volcano's policy events and actions that a user may set (policyEventMap / policyActionMap,
# pkg/webhooks/admission/jobs/validate/util.go at v1.15.1).
POLICY_EVENTS = frozenset(
    {"*", "PodFailed", "PodEvicted", "Unknown", "TaskCompleted", "TaskFailed", "JobUpdated"}
)
POLICY_ACTIONS = frozenset(
    {"AbortJob", "RestartJob", "RestartTask", "RestartPod", "RestartPartition", "TerminateJob",
     "CompleteJob", "ResumeJob"}
)  # fmt: skip
TOLERATION_KEYS = frozenset({"key", "operator", "value", "effect"})
# The taints the node lifecycle controller puts on a node that stopped answering (NoExecute:
# they evict; nodemark.given_up reads them); Kubernetes gives every pod a 300 s toleration of
# each, a training gang gets kubernetes.node_lost_after_s (podspec.node_lost_tolerations).
NODE_LOST_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def pod_name(job: str, task: str, index: int) -> str:
    """The name Volcano gives a pod (jobhelpers.PodNameFmt "%s-%s-%d"); also its host name."""
    return f"{job}-{task}-{index}"


def check_job_name(job: str, task: str, replicas: int, *, where: str = "job.name") -> None:
    """The job's own objects: a Service named after it (svc plugin) and its pods' host names."""
    if not is_dns1035_label(job):
        raise UserError(
            f"{job!r} is not a valid Kubernetes service name (lower-case letters, "
            "digits and '-', starting with a letter, at most 63 characters)",
            where=where,
        )
    last = pod_name(job, task, max(replicas - 1, 0))
    if len(last) > LABEL_MAX:
        longest = LABEL_MAX - (len(last) - len(job))
        raise UserError(
            f"{job!r} makes the pod name {last!r} {len(last)} characters long; "
            f"Kubernetes allows at most {LABEL_MAX}: use a job name of at most "
            f"{longest} characters",
            where=where,
        )


def check_settings(
    *,
    queue: str,
    pvc: str,
    namespace: str,
    mount: str,
    service_account: str | None,
    node_selector: dict[str, str],
    tolerations: Iterable[dict[str, str]],
) -> None:
    """The [kubernetes] section, field by field."""
    if not queue.strip():
        raise UserError(
            "the Volcano queue name is empty; set it (e.g. trainmaster)", where="kubernetes.queue"
        )
    if not is_dns1123_subdomain(queue):
        raise UserError(
            f"{queue!r} is not a valid queue name (DNS-1123: lower-case letters, "
            "digits, '-' and '.')",
            where="kubernetes.queue",
        )
    if not is_dns1123_subdomain(pvc):
        raise UserError(
            f"{pvc!r} is not a valid PersistentVolumeClaim name (DNS-1123: lower-case "
            "letters, digits, '-' and '.', at most 253 characters)",
            where="kubernetes.pvc",
        )
    if not is_dns1123_label(namespace):
        raise UserError(
            f"{namespace!r} is not a valid namespace (DNS-1123 label)", where="kubernetes.namespace"
        )
    if not mount.startswith("/") or mount.rstrip("/") == "":
        raise UserError(
            f"{mount!r} must be an absolute path other than /", where="kubernetes.mount"
        )
    if service_account is not None and not is_dns1123_subdomain(service_account):
        raise UserError(
            f"{service_account!r} is not a valid service account name",
            where="kubernetes.service_account",
        )
    for key, value in node_selector.items():
        if not is_qualified_name(key) or not is_label_value(value):
            raise UserError(
                f"{key}={value!r} is not a valid node label (key: [prefix/]name, "
                "value: at most 63 of A-Z a-z 0-9 - _ .)",
                where="kubernetes.node_selector",
            )
    for tol in tolerations:
        check_toleration(tol)


def check_toleration(tol: dict[str, str]) -> None:
    where = "kubernetes.tolerations"
    unknown = set(tol) - TOLERATION_KEYS
    if unknown:
        raise UserError(
            f"unknown toleration key(s) {sorted(unknown)}; use {sorted(TOLERATION_KEYS)}",
            where=where,
        )
    op = tol.get("operator", "Equal")
    if op not in ("Equal", "Exists"):
        raise UserError(f"operator {op!r} must be Equal or Exists", where=where)
    if op == "Exists" and tol.get("value"):
        raise UserError("a toleration with operator Exists takes no value", where=where)
    if tol.get("effect", "") not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise UserError(
            f"effect {tol['effect']!r} must be NoSchedule, PreferNoSchedule or NoExecute",
            where=where,
        )
    if "key" in tol and not is_qualified_name(tol["key"]):
        raise UserError(f"{tol['key']!r} is not a valid taint key", where=where)


def _policy_problems(policies: list[dict[str, Any]], where: str) -> list[str]:
    problems, seen = [], set()
    for p in policies:
        events = list(p.get("events", [])) + ([p["event"]] if p.get("event") else [])
        if not events and p.get("exitCode") is None:
            problems.append(f"{where}: a policy needs an event or an exitCode")
        for event in events:
            if event not in POLICY_EVENTS:
                problems.append(f"{where}: invalid policy event {event!r}")
            if event in seen:
                problems.append(f"{where}: duplicate policy event {event!r}")
            seen.add(event)
        if p.get("action") not in POLICY_ACTIONS:
            problems.append(f"{where}: invalid policy action {p.get('action')!r}")
    return problems


def webhook_problems(job: dict[str, Any]) -> list[str]:
    """What Volcano's validating webhook would reject in a built Job (empty when none)."""
    meta, spec = job["metadata"], job["spec"]
    problems: list[str] = []
    name = meta["name"]
    if not is_dns1035_label(name):
        problems.append(f"job name {name!r} is not a DNS-1035 label")
    if not spec.get("queue"):
        problems.append("spec.queue is empty")
    tasks = spec.get("tasks") or []
    if not tasks:
        problems.append("no task in spec.tasks")
    names: set[str] = set()
    total = 0
    for i, task in enumerate(tasks):
        tname, replicas = task.get("name", ""), int(task.get("replicas", 0))
        total += replicas
        if not is_dns1123_label(tname):
            problems.append(f"spec.tasks[{i}].name {tname!r} is not a DNS-1123 label")
        if tname in names:
            problems.append(f"duplicate task name {tname!r}")
        names.add(tname)
        if task.get("minAvailable") is not None and task["minAvailable"] > replicas:
            problems.append(
                f"task {tname}: minAvailable {task['minAvailable']} > replicas {replicas}"
            )
        last = pod_name(name, tname, max(replicas - 1, 0))
        if len(last) > LABEL_MAX:
            problems.append(f"pod name {last!r} is longer than {LABEL_MAX} characters")
        problems += _policy_problems(task.get("policies", []), f"spec.tasks[{i}].policies")
        pod = task.get("template", {})
        for key, value in pod.get("metadata", {}).get("labels", {}).items():
            if not is_qualified_name(key) or not is_label_value(value):
                problems.append(f"task {tname}: invalid label {key}={value!r}")
        for vol in pod.get("spec", {}).get("volumes", []):
            claim = vol.get("persistentVolumeClaim", {}).get("claimName")
            if claim is not None and not is_dns1123_subdomain(claim):
                problems.append(f"task {tname}: invalid PVC name {claim!r}")
    if spec.get("minAvailable", 0) > total:
        problems.append(f"spec.minAvailable {spec.get('minAvailable')} > total replicas {total}")
    if int(spec.get("maxRetry", 0)) < 0:
        problems.append("spec.maxRetry is negative")
    problems += _policy_problems(spec.get("policies", []), "spec.policies")
    for key, value in meta.get("labels", {}).items():
        if not is_qualified_name(key) or not is_label_value(value):
            problems.append(f"invalid job label {key}={value!r}")
    return problems


def check_job(job: dict[str, Any]) -> None:
    problems = webhook_problems(job)
    if problems:
        raise UserError(
            "the Volcano Job would be rejected: " + "; ".join(problems),
            where=f"job {job['metadata']['name']}",
        )
