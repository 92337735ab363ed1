"""`cluster status`, the cluster's side: nodes with their accelerators, the queue, the claim.

cluster/status.py asks AWS; once the cluster is ACTIVE the CLI hands it fill() to read the
cluster itself through the one client module. A kubeconfig that points at another cluster is
not used (the endpoint EKS reports must match), and every failure becomes `kube_error`, a line
`cluster status` prints, never an exception: the AWS half of the answer is still worth seeing.
"""

from __future__ import annotations

import json
from typing import Any

from trainmaster.backends.kubernetes.client import ApiError, connect
from trainmaster.cluster.plan import LoadedPlan
from trainmaster.cluster.status import Status, node_of
from trainmaster.errors import UserError

TIMEOUT_S = 20


def fill(
    plan: LoadedPlan, st: Status, kubeconfig: str | None = None, context: str | None = None
) -> None:
    c = plan.cluster
    fix = f"run `aws eks update-kubeconfig --name {c['name']} --region {c['region']}`"
    try:
        cluster = connect(kubeconfig, context, c["namespace"])
    except UserError as exc:
        st.kube_error = f"{exc}; {fix}"
        return
    host = cluster.api.configuration.host
    endpoint = (st.cluster or {}).get("endpoint")
    if endpoint and host.rstrip("/") != str(endpoint).rstrip("/"):
        st.kube_error = f"the kubeconfig context points at {host}, not cluster {c['name']}; {fix} or pass --context"
        return
    try:
        nodes: Any = cluster.core.list_node(_preload_content=False, _request_timeout=TIMEOUT_S)
        st.nodes = sorted(
            (node_of(i) for i in json.loads(nodes.data).get("items", [])),
            key=lambda n: (n.role, n.name),
        )
    except (ApiError, OSError, ValueError) as exc:
        st.kube_error = f"cannot list nodes: {getattr(exc, 'reason', None) or exc}"
        return
    try:
        cluster.custom.get_cluster_custom_object(
            "scheduling.volcano.sh", "v1beta1", "queues", c["queue"], _request_timeout=TIMEOUT_S
        )
        st.queue = True
    except ApiError as exc:
        st.queue = False if exc.status == 404 else None
    try:
        pvc: Any = cluster.core.read_namespaced_persistent_volume_claim(
            c["pvc"], c["namespace"], _preload_content=False, _request_timeout=TIMEOUT_S
        )
        st.claim_phase = json.loads(pvc.data).get("status", {}).get("phase")
    except ApiError as exc:
        st.claim_phase = "missing" if exc.status == 404 else None
