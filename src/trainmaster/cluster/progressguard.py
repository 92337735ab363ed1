"""Who may publish a job's progress: a training pod, into its own job's progress ConfigMap only.

`status` of a Kubernetes job shows step, loss, seq/s, ETA and cost as it does locally. The run
folder holding them is on the cluster's shared storage, so the pod that holds rank 0 publishes
them (backends/kubernetes/publish.py) into `<job>-progress`, a ConfigMap the launch creates
and the Volcano Job owns, which `status` reads with one GET. Why this path and not the others:

- a read of the run folder through a pod (exec, or a helper pod mounting the claim) needs
  pods/exec or pod-create rights for everyone who runs `status`, and fails once the pods are
  gone; the ConfigMap outlives them until the job is deleted, so a finished job keeps its summary;
- pods posting to a controller (Kubeflow Trainer's KEP-2779) needs a service of our own in
  the cluster; the API server is already there and already audited;
- one small write per job every PUBLISH_S (a record is ~2 KB): no load an API server notices.

Least privilege, as for the node mark (cluster/nodeguard.py): RBAC cannot say "only the map of
your own job", so the Role grants `patch` on ConfigMaps of the namespace and a
ValidatingAdmissionPolicy narrows it: for the job's service account an update is allowed only
on `<job>-progress` where the caller's token names a pod `<job>-worker-<n>` (a pod-bound
token carries `authentication.kubernetes.io/pod-name`), and may change nothing but its
`progress.json`. No get, list, create or delete: a compromised pod can at worst misreport its
own job's progress.
"""

from __future__ import annotations

from typing import Any

from trainmaster.cluster import nodeguard

NAME = "trainmaster-job-progress"
SUFFIX = "-progress"  # the ConfigMap of job J is J-progress
KEY = "progress.json"
PUBLISH_S = 15.0  # rank 0's pod publishes this often; `status` is at most this far behind
LABEL = "trainmaster.io/progress-of"  # on the map: the job whose progress it holds
WORKER = "-worker-"  # Volcano names the pods of task `worker` J-worker-<n> (pod_script.TASK)
MANAGED = {"app.kubernetes.io/managed-by": "trainmaster"}
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"

_POD = f"request.userInfo.extra['{POD_NAME_EXTRA}'][0]"
_OWN_JOB_ONLY = [
    (
        f"'{POD_NAME_EXTRA}' in request.userInfo.extra && {_POD}.lastIndexOf('{WORKER}') > 0 && "
        f"{_POD}.substring({_POD}.lastIndexOf('{WORKER}') + {len(WORKER)}).matches('^[0-9]+$') && "
        f"oldObject.metadata.name == {_POD}.substring(0, {_POD}.lastIndexOf('{WORKER}')) + "
        f"'{SUFFIX}'",
        "a training pod may publish only its own job's progress",
    ),
    *(
        (
            f"(has(object.metadata.{part}) ? object.metadata.{part} : {empty}) == "
            f"(has(oldObject.metadata.{part}) ? oldObject.metadata.{part} : {empty})",
            f"a training pod may not change a ConfigMap's {part}",
        )
        for part, empty in (("labels", "{}"), ("annotations", "{}"), ("ownerReferences", "[]"))
    ),
    (
        f"!has(object.binaryData) && (has(object.data) ? object.data.all(k, k == '{KEY}') : true)",
        f"a training pod may write no key but {KEY}",
    ),
]


def map_name(job: str) -> str:
    return f"{job}{SUFFIX}"


def rbac(namespace: str, service_account: str) -> list[dict[str, Any]]:
    """The Role and its binding to the job's service account, and the admission policy that
    narrows them (module docstring). k8s/job-progress.yaml of the plan."""
    rbac_v1 = "rbac.authorization.k8s.io"
    user = f"system:serviceaccount:{namespace}:{service_account}"
    meta = {"name": NAME, "labels": dict(MANAGED)}
    return [
        {
            "apiVersion": f"{rbac_v1}/v1",
            "kind": "Role",
            "metadata": {**meta, "namespace": namespace},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["patch"]}],
        },
        {
            "apiVersion": f"{rbac_v1}/v1",
            "kind": "RoleBinding",
            "metadata": {**meta, "namespace": namespace},
            "roleRef": {"apiGroup": rbac_v1, "kind": "Role", "name": NAME},
            "subjects": [
                {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
            ],
        },
        *nodeguard.admission_policy(meta, user, "configmaps", _OWN_JOB_ONLY),
    ]
