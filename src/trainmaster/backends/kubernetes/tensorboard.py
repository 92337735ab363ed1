"""`trainmaster tensorboard` on Kubernetes: the add-ons' TensorBoard, port-forwarded.

The add-ons' TensorBoard (cluster/addons.py: Deployment and ClusterIP Service `tensorboard`,
port 6006, in the job namespace, reading /data/runs) is reached through `kubectl port-forward`
on 127.0.0.1 only, never a public load balancer: the Service is checked through the API first
(a clear error when the add-ons are missing), then kubectl does the forwarding. Without
kubectl the error gives the exact command to run.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

from trainmaster.backends.kubernetes.client import Cluster, NotFound, call
from trainmaster.cluster.addons import TENSORBOARD, TENSORBOARD_PORT
from trainmaster.errors import UserError
from trainmaster.monitor.tensorboard import check_port, serve


def forward_command(
    namespace: str, port: int, kubeconfig: str | None = None, context: str | None = None
) -> list[str]:
    """kubectl port-forward to the add-ons' TensorBoard Service, listening on 127.0.0.1 only."""
    cmd = [
        "kubectl",
        "port-forward",
        "--namespace",
        namespace,
        "--address",
        "127.0.0.1",
        f"service/{TENSORBOARD}",
        f"{port}:{TENSORBOARD_PORT}",
    ]
    cmd += ["--kubeconfig", kubeconfig] if kubeconfig else []
    cmd += ["--context", context] if context else []
    return cmd


def check_service(cluster: Cluster) -> Any:
    try:
        with call(cluster, "get", "services", TENSORBOARD):
            return cluster.core.read_namespaced_service(TENSORBOARD, cluster.namespace)
    except NotFound as exc:
        raise UserError(
            f"no TensorBoard Service {TENSORBOARD!r} in namespace {cluster.namespace}: "
            "the cluster add-ons install it (`trainmaster cluster up`); pass "
            "--namespace if they live elsewhere",
            where="kubernetes",
        ) from exc


def serve_k8s(
    cluster: Cluster,
    port: int,
    kubeconfig: str | None,
    context: str | None,
    announce: Callable[[str], None],
    job: str | None = None,
) -> None:
    check_port("127.0.0.1", port)
    check_service(cluster)
    cmd = forward_command(cluster.namespace, port, kubeconfig, cluster.context or context)
    if shutil.which("kubectl") is None:
        raise UserError(
            f"kubectl is not installed; install it, or forward the port yourself: {' '.join(cmd)}",
            where="kubectl",
        )
    url = f"http://127.0.0.1:{port}/"
    runs = f"runs of job {job} are named {job}/tensorboard" if job else "every run under /data/runs"
    serve(
        cmd,
        f"{url}  (cluster TensorBoard via kubectl port-forward; {runs}; Ctrl-C stops it)",
        url,
        "kubectl port-forward",
        announce,
    )
