"""The control plane's processes: their command lines, start order, readiness and stop.

Each process is started in a session (so a process group) of its own, with its pid in
RUN/pids/NAME.pid and its output in RUN/logs/NAME.log, so that `down` can stop it, and every
child it may have, from another shell. Readiness is polled with a deadline, never slept for,
and a process that exits while we wait ends the wait at once with the tail of its log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kube_objects
import kube_pki

ORDER = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "vc-webhook-manager",
    "vc-controller-manager",
    "vc-scheduler",
    "kwok",
]
PORT_NAMES = [
    "etcd",
    "etcd-peer",
    "controller-manager",
    "webhook",
    "webhook-healthz",
    "vc-controllers-healthz",
    "vc-controllers-metrics",
    "vc-scheduler-healthz",
    "vc-scheduler-metrics",
    "kwok",
]


class StartError(RuntimeError):
    pass


def _pid(run: Path, name: str) -> int | None:
    try:
        return int((run / "pids" / f"{name}.pid").read_text())
    except (OSError, ValueError):
        return None


def _ours(pid: int, run: Path) -> bool:
    """Whether PID is still the process we started: every command line here names the run dir
    (a pid file may outlive its process, and the pid be reused)."""
    try:
        return str(run) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def liveness(run: Path) -> dict[str, bool]:
    return {name: (pid := _pid(run, name)) is not None and _ours(pid, run) for name in ORDER}


def all_alive(run: Path) -> bool:
    return all(liveness(run).values())


def stop_recorded(run: Path, grace: float = 10.0) -> int:
    """SIGTERM each recorded process group, newest first; SIGKILL what is left after GRACE s."""
    groups = [pid for name in reversed(ORDER) if (pid := _pid(run, name)) and _ours(pid, run)]
    for pid in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(_ours(pid, run) for pid in groups) and time.monotonic() < deadline:
        time.sleep(0.1)  # waiting for other processes to exit, bounded by grace
    for pid in groups:
        if _ours(pid, run):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    return len(groups)


def _https(run: Path, port: int, path: str, client: bool = True) -> int:
    ctx = ssl.create_default_context(cafile=str(run / "pki" / "ca.crt"))
    if client:
        ctx.load_cert_chain(str(run / "pki" / "admin.crt"), str(run / "pki" / "admin.key"))
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=ctx, timeout=2) as r:
            return int(r.status)
    except OSError:  # refused, TLS not ready, HTTP errors (urllib's are OSErrors too)
        return 0


def api_healthy(run: Path, state: dict[str, Any]) -> bool:
    return _https(run, state["ports"]["apiserver"], "/readyz") == 200


class Plane:
    def __init__(self, run: Path, bins: Path, share: Path, state: dict[str, Any]) -> None:
        self.run, self.bins, self.share, self.state = run, bins, share, state
        self.ports: dict[str, int] = state["ports"]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.deadline = 0.0

    def _start(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        with open(self.run / "logs" / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [str(self.bins / name), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.run,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        (self.run / "pids" / f"{name}.pid").write_text(str(proc.pid))
        self.procs[name] = proc

    def _wait(self, what: str, ready: Callable[[], bool]) -> None:
        while not ready():
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    tail = (self.run / "logs" / f"{name}.log").read_text(errors="replace")[-2000:]
                    raise StartError(
                        f"{name} exited ({proc.returncode}) while waiting for "
                        f"{what}; end of logs/{name}.log:\n{tail}"
                    )
            if time.monotonic() > self.deadline:
                raise StartError(f"timed out waiting for {what}")
            time.sleep(0.2)  # polling other processes' readiness, bounded by the deadline

    def stop(self) -> None:
        stop_recorded(self.run)

    def start_all(self, deadline: float) -> None:
        from kubernetes import client, config

        self.deadline = deadline
        run, p, pki = self.run, self.ports, self.run / "pki"
        kubeconfigs = run / "kubeconfigs"
        etcd_url, peer_url = f"http://127.0.0.1:{p['etcd']}", f"http://127.0.0.1:{p['etcd-peer']}"
        # The state is thrown away at `down`: no fsync (a test plane, not a cluster's store).
        self._start(
            "etcd",
            "--name=local",
            f"--data-dir={run}/etcd",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=local={peer_url}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        )
        self._wait("etcd", lambda: _http_ok(f"{etcd_url}/health"))
        self._start(
            "kube-apiserver",
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={p['apiserver']}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki}/apiserver.crt",
            f"--tls-private-key-file={pki}/apiserver.key",
            f"--client-ca-file={pki}/ca.crt",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki}/sa.pub",
            f"--service-account-signing-key-file={pki}/sa.key",
            f"--service-cluster-ip-range={kube_pki.SERVICE_CIDR}",
            # the `kubernetes` Service's endpoint would be 127.0.0.1, which endpoint
            # validation refuses (loopback): no endpoint reconciler, as nothing in a
            # pod here ever dials it
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--profiling=false",
        )
        self._wait("kube-apiserver /readyz", lambda: api_healthy(run, self.state))
        self._start(
            "kube-controller-manager",
            f"--kubeconfig={kubeconfigs}/controller-manager.kubeconfig",
            f"--authentication-kubeconfig={kubeconfigs}/controller-manager.kubeconfig",
            f"--authorization-kubeconfig={kubeconfigs}/controller-manager.kubeconfig",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['controller-manager']}",
            f"--cert-dir={pki}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki}/sa.key",
            f"--root-ca-file={pki}/ca.crt",
            f"--cluster-signing-cert-file={pki}/ca.crt",
            f"--cluster-signing-key-file={pki}/ca.key",
            f"--service-cluster-ip-range={kube_pki.SERVICE_CIDR}",
        )

        api = config.new_client_from_config(config_file=str(run / "kubeconfig"))
        core, ext = client.CoreV1Api(api), client.ApiextensionsV1Api(api)
        core.create_namespace({"metadata": {"name": kube_objects.VOLCANO_NAMESPACE}})
        crds = kube_objects.crds(self.share)
        for crd in crds:
            ext.create_custom_resource_definition(crd)
        webhook_url = f"https://127.0.0.1:{p['webhook']}"
        hooks = kube_objects.webhook_configurations(self.share, webhook_url, pki / "ca.crt")
        admission = client.AdmissionregistrationV1Api(api)
        for hook in hooks:
            create = (
                admission.create_mutating_webhook_configuration
                if hook["kind"].startswith("Mutating")
                else admission.create_validating_webhook_configuration
            )
            create(hook)
        self._wait(
            "Volcano's CRDs established",
            lambda: all(_established(ext, c["metadata"]["name"]) for c in crds),
        )

        volcano = [f"--kubeconfig={kubeconfigs}/volcano.kubeconfig", "--enable-healthz=true"]
        self._start(
            "vc-webhook-manager",
            *volcano,
            "--listen-address=127.0.0.1",
            f"--port={p['webhook']}",
            f"--webhook-url={webhook_url}",
            f"--healthz-address=127.0.0.1:{p['webhook-healthz']}",
            f"--enabled-admission={','.join(kube_objects.admission_paths(hooks))}",
            f"--ca-cert-file={pki}/ca.crt",
            f"--tls-cert-file={pki}/webhook.crt",
            f"--tls-private-key-file={pki}/webhook.key",
        )
        env = {"KUBE_POD_NAMESPACE": kube_objects.VOLCANO_NAMESPACE}
        self._start(
            "vc-controller-manager",
            *volcano,
            "--leader-elect=false",
            f"--healthz-address=127.0.0.1:{p['vc-controllers-healthz']}",
            f"--listen-address=127.0.0.1:{p['vc-controllers-metrics']}",
            env=env,
        )
        (run / "volcano-scheduler.conf").write_text(
            (self.share / "volcano" / "volcano-scheduler.conf").read_text()
        )
        self._start(
            "vc-scheduler",
            *volcano,
            "--leader-elect=false",
            f"--scheduler-conf={run}/volcano-scheduler.conf",
            "--schedule-period=1s",
            f"--healthz-address=127.0.0.1:{p['vc-scheduler-healthz']}",
            f"--listen-address=127.0.0.1:{p['vc-scheduler-metrics']}",
            f"--cache-dump-dir={run}",
            env=env,
        )
        (run / "kwok.yaml").write_text(kube_objects.kwok_stages(self.share))
        key, value = kube_objects.KWOK_ANNOTATION
        self._start(
            "kwok",
            f"--kubeconfig={kubeconfigs}/kwok.kubeconfig",
            f"--config={run}/kwok.yaml",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            "--cidr=10.244.0.0/16",
            "--node-ip=10.0.0.1",
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{p['kwok']}",
        )
        names = kube_objects.node_names(self.state["instance_type"], self.state["nodes"])
        for name in names:
            core.create_node(kube_objects.node(name, self.state["instance_type"]))

        self._wait("the nodes Ready (kwok)", lambda: _nodes_ready(core, names))
        self._wait(
            "the default service account (controller manager)",
            lambda: _exists(lambda: core.read_namespaced_service_account("default", "default")),
        )
        custom = client.CustomObjectsApi(api)
        self._wait("Volcano's webhook answering", lambda: _webhook_answers(custom))
        self._wait(
            "the default queue open (scheduler, controllers)",
            lambda: _queue_open(custom, "default"),
        )


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _exists(read: Callable[[], object]) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        read()
    except ApiException:
        return False
    return True


def _established(ext: Any, name: str) -> bool:
    conditions = ext.read_custom_resource_definition(name).status.conditions or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def _nodes_ready(core: Any, names: list[str]) -> bool:
    ready = {
        n.metadata.name
        for n in core.list_node().items
        if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
    }
    return set(names) <= ready


def _webhook_answers(custom: Any) -> bool:
    """A dry-run Queue create goes through Volcano's mutating and validating queue webhooks
    (failurePolicy Fail): it succeeds only once the webhook manager answers over TLS."""
    body = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": "trainmaster-webhook-probe"},
        "spec": {"weight": 1},
    }
    return _exists(
        lambda: custom.create_cluster_custom_object(
            "scheduling.volcano.sh", "v1beta1", "queues", body, dry_run="All"
        )
    )


def _queue_open(custom: Any, name: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        queue = custom.get_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues", name)
    except ApiException:
        return False
    return bool(queue.get("status", {}).get("state") == "Open")
