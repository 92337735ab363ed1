"""The node mark: a restarted gang must not land on the node that failed it.

A training pod whose node fails a check marks that node itself, before it exits, with a taint of
trainmaster's own, `trainmaster.io/unhealthy=<reason>:NoSchedule`, and annotations saying why,
when and for which job (backends/kubernetes/nodemark.py). Why the pod and not a watcher:
Volcano's RestartJob kills and recreates the whole gang within a second of the pod's Failed
phase (measured on the local control plane), and the scheduler places the new pods at once; only
a mark written before the pod ends is sure to be there when they are placed. `status` names the
marked node; `trainmaster node clear NODE` removes the mark once the node is repaired.

Least privilege. Nodes are cluster-wide and RBAC cannot say "only your own node", so the
ClusterRole grants get/patch on nodes and a ValidatingAdmissionPolicy narrows it: for the job's
service account a node update is allowed only on the node named in the caller's own token (a
pod's service-account token carries `authentication.kubernetes.io/node-name`, Kubernetes 1.32+,
GA; seen here on v1.35) and may change nothing but trainmaster's taint and annotations. So a
compromised training pod can at worst keep its own node free of new pods.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

TAINT_KEY = "trainmaster.io/unhealthy"
ANN_PREFIX = "trainmaster.io/unhealthy"
ANN_REASON, ANN_DETAIL = f"{ANN_PREFIX}-reason", f"{ANN_PREFIX}-detail"
ANN_TIME, ANN_JOB = f"{ANN_PREFIX}-since", f"{ANN_PREFIX}-job"
NAME = "trainmaster-node-marker"
MANAGED = {"app.kubernetes.io/managed-by": "trainmaster"}
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"

_OURS_ONLY = [
    (
        f"'{NODE_NAME_EXTRA}' in request.userInfo.extra && "
        f"request.userInfo.extra['{NODE_NAME_EXTRA}'][0] == object.metadata.name",
        "a training pod may mark only the node it runs on",
    ),
    (
        "(has(object.metadata.labels) ? object.metadata.labels : {}) == "
        "(has(oldObject.metadata.labels) ? oldObject.metadata.labels : {})",
        "a training pod may not change a node's labels",
    ),
    (
        f"(has(object.spec.taints) ? object.spec.taints.filter(t, t.key != '{TAINT_KEY}') : []) "
        f"== (has(oldObject.spec.taints) ? oldObject.spec.taints.filter(t, t.key != "
        f"'{TAINT_KEY}') : [])",
        f"a training pod may change no taint but {TAINT_KEY}",
    ),
    (
        "(has(object.spec.unschedulable) ? object.spec.unschedulable : false) == "
        "(has(oldObject.spec.unschedulable) ? oldObject.spec.unschedulable : false)",
        "a training pod may not cordon a node",
    ),
    (
        "(has(object.metadata.annotations) ? object.metadata.annotations : {}).all(k, "
        f"k.startsWith('{ANN_PREFIX}') || (has(oldObject.metadata.annotations) && "
        "k in oldObject.metadata.annotations && "
        "oldObject.metadata.annotations[k] == object.metadata.annotations[k])) && "
        "(has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}).all(k, "
        f"k.startsWith('{ANN_PREFIX}') || (has(object.metadata.annotations) && "
        "k in object.metadata.annotations))",
        f"a training pod may change no annotation but {ANN_PREFIX}-*",
    ),
]


def _cluster_role(
    meta: dict[str, Any], rules: list[dict[str, Any]], service_account: str, namespace: str
) -> list[dict[str, Any]]:
    """A ClusterRole named meta["name"] and its binding to one service account."""
    rbac_v1 = "rbac.authorization.k8s.io"
    return [
        {"apiVersion": f"{rbac_v1}/v1", "kind": "ClusterRole", "metadata": meta, "rules": rules},
        {
            "apiVersion": f"{rbac_v1}/v1",
            "kind": "ClusterRoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": rbac_v1, "kind": "ClusterRole", "name": meta["name"]},
            "subjects": [
                {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
            ],
        },
    ]


def rbac(namespace: str, service_account: str) -> list[dict[str, Any]]:
    """The ClusterRole and its binding to the job's service account, and the admission policy
    that narrows them (module docstring). k8s/node-marker.yaml of the plan."""
    user = f"system:serviceaccount:{namespace}:{service_account}"
    meta = {"name": NAME, "labels": dict(MANAGED)}
    return [
        *_cluster_role(
            meta,
            [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}],
            service_account,
            namespace,
        ),
        *admission_policy(meta, user, "nodes", _OURS_ONLY),
    ]


def admission_policy(
    meta: dict[str, Any], user: str, resource: str, checks: list[tuple[str, str]]
) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy and its binding (Deny): every UPDATE by `user` of the core
    `resource` must pass each (CEL expression, message) of `checks`."""
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": meta,
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["UPDATE"],
                            "resources": [resource],
                        }
                    ]
                },
                "matchConditions": [
                    {
                        "name": "the-job-service-account",
                        "expression": f"request.userInfo.username == '{user}'",
                    }
                ],
                "validations": [
                    {"expression": expr, "message": message} for expr, message in checks
                ],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": meta,
            "spec": {"policyName": meta["name"], "validationActions": ["Deny"]},
        },
    ]


# The node watcher (backends/kubernetes/nodewatch.py): a lost node lets go of its gang without a
# person. It reads nodes and trainmaster's pods and patches nodes (its mark and Kubernetes'
# out-of-service taint), reads the nodes' leases and deletes a pod given up by its job on a node
# whose kubelet went silent; it runs from the training image on a system node.
# k8s/node-watcher.yaml.
WATCHER = "trainmaster-node-watcher"
WATCHER_NAMESPACE = "trainmaster-system"
WATCHER_COMMAND = ["python", "-m", "trainmaster.backends.kubernetes.nodewatch"]


def watcher(image: str, node_selector: dict[str, str]) -> list[dict[str, Any]]:
    ns, labels = WATCHER_NAMESPACE, {"app": WATCHER, **MANAGED}
    meta = {"name": WATCHER, "labels": dict(MANAGED)}
    container = {
        "name": "watcher",
        "image": image,
        "command": WATCHER_COMMAND,
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns, "labels": dict(MANAGED)},
        },
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {**meta, "namespace": ns}},
        *_cluster_role(
            meta,
            [
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
                # delete: a pod given up by its job on a node whose kubelet went silent
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "delete"]},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list"]},
            ],
            WATCHER,
            ns,
        ),
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {**meta, "namespace": ns},
            "spec": {
                "replicas": 1,
                "strategy": {"type": "Recreate"},  # never two watchers patching one node
                "selector": {"matchLabels": {"app": WATCHER}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": WATCHER,
                        "nodeSelector": dict(node_selector),
                        "containers": [container],
                    },
                },
            },
        },
    ]


def ready_condition(conditions: Iterable[Any] | None) -> tuple[str, str]:
    """(status, "reason: message") of a node's Ready condition; ("Unknown", "") when it reports
    none. The one reader of it: `conditions` are the kubernetes client's models (nodemark,
    nodewatch) or the API's JSON dicts (cluster status), read the same way."""
    for c in conditions or []:
        get = c.get if isinstance(c, dict) else lambda key, c=c: getattr(c, key, None)
        if get("type") == "Ready":
            return str(get("status")), ": ".join(filter(None, [get("reason"), get("message")]))
    return "Unknown", ""
