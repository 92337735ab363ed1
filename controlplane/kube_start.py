"""Starting the control plane: each process's command line, in order, and what "ready" means.

etcd, then kube-apiserver (ready: /readyz), then the controller manager; Volcano's CRDs and
webhook configurations go in before Volcano starts (its informers need the CRDs, and the webhook
manager only patches configurations that exist); then Volcano's three processes, kwok and the
nodes together. Ready means: nodes Ready, the `default` service account made (the controller
manager works), a dry-run Queue through the webhook, and the `default` queue Open (the
scheduler made it, the controllers opened it). Last, what a job needs that `cluster up` would
lay (kube_objects.job_objects): the presets' queue open and the shared-storage claim bound.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import kube_hostnet
import kube_objects
import kube_pki
import kube_procs
import kube_real


def start(procs: kube_procs.Processes, share: Path, state: dict[str, Any]) -> None:
    """Start everything, in order, and return once all of it is ready (StartError if not)."""
    run, p, pki = procs.run, state["ports"], procs.run / "pki"
    kubeconfigs = run / "kubeconfigs"
    etcd_url, peer_url = f"http://127.0.0.1:{p['etcd']}", f"http://127.0.0.1:{p['etcd-peer']}"
    # The state is thrown away at `down`: no fsync (a test plane, not a cluster's store).
    procs.start(
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
    procs.wait("etcd", lambda: kube_procs.http_ok(f"{etcd_url}/health"))
    # With real nodes, pods must reach the API server and it the kubelets: kube_real's flags.
    # Without, all on loopback, and the `kubernetes` Service has no endpoint: its endpoint would
    # be 127.0.0.1, which endpoint validation refuses, and nothing in a pod ever dials it.
    loopback = [
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        "--endpoint-reconciler-type=none",
    ]
    real = state.get("real_nodes")
    procs.start(
        "kube-apiserver",
        f"--etcd-servers={etcd_url}",
        *(kube_real.apiserver_flags(pki) if real else loopback),
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
        # the front-proxy (request header) CA that components reading the
        # extension-apiserver-authentication ConfigMap expect; no certificate here has the
        # allowed name, so no request can authenticate this way
        f"--requestheader-client-ca-file={pki}/ca.crt",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        "--allow-privileged=true",
        "--profiling=false",
    )
    # Import the client and parse the big YAML files (1 MB of CRDs) while the API server starts.
    from kubernetes import client, config

    crds = kube_objects.crds(share)
    webhook_url = f"https://127.0.0.1:{p['webhook']}"
    hooks = kube_objects.webhook_configurations(share, webhook_url, pki / "ca.crt")
    (run / "kwok.yaml").write_text(kube_objects.kwok_stages(share))
    procs.wait("kube-apiserver /readyz", lambda: kube_procs.api_healthy(run, state))
    procs.start(
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
        *(
            [f"--node-monitor-grace-period={state['node_grace_s']}s"]
            if state.get("node_grace_s")
            else []
        ),
    )

    api = config.new_client_from_config(config_file=str(run / "kubeconfig"))
    core, ext = client.CoreV1Api(api), client.ApiextensionsV1Api(api)
    core.create_namespace({"metadata": {"name": kube_objects.VOLCANO_NAMESPACE}})
    for crd in crds:
        ext.create_custom_resource_definition(crd)
    admission = client.AdmissionregistrationV1Api(api)
    for hook in hooks:
        create = (
            admission.create_mutating_webhook_configuration
            if hook["kind"].startswith("Mutating")
            else admission.create_validating_webhook_configuration
        )
        create(hook)
    procs.mark("CRDs and webhooks created")
    procs.wait(
        "Volcano's CRDs established",
        lambda: all(_established(ext, c["metadata"]["name"]) for c in crds),
    )

    volcano = [f"--kubeconfig={kubeconfigs}/volcano.kubeconfig", "--enable-healthz=true"]
    procs.start(
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
    # No kube-scheduler runs here: Volcano's scheduler also places the pods that name the
    # default scheduler (the add-ons' Deployments: etcd, the node watcher, TensorBoard), each
    # in a PodGroup of its own that the controllers make for it, as EKS's scheduler would.
    schedulers = ["--scheduler-name=volcano", "--scheduler-name=default-scheduler"]
    procs.start(
        "vc-controller-manager",
        *volcano,
        *schedulers,
        "--leader-elect=false",
        f"--healthz-address=127.0.0.1:{p['vc-controllers-healthz']}",
        f"--listen-address=127.0.0.1:{p['vc-controllers-metrics']}",
        env=env,
    )
    (run / "volcano-scheduler.conf").write_text(
        (share / "volcano" / "volcano-scheduler.conf").read_text()
    )
    procs.start(
        "vc-scheduler",
        *volcano,
        *schedulers,
        "--leader-elect=false",
        f"--scheduler-conf={run}/volcano-scheduler.conf",
        "--schedule-period=1s",
        f"--healthz-address=127.0.0.1:{p['vc-scheduler-healthz']}",
        f"--listen-address=127.0.0.1:{p['vc-scheduler-metrics']}",
        f"--cache-dump-dir={run}",
        env=env,
    )
    key, value = kube_objects.KWOK_ANNOTATION
    procs.start(
        "kwok",
        f"--kubeconfig={kubeconfigs}/kwok.kubeconfig",
        f"--config={run}/kwok.yaml",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={key}={value}",
        # fake pod IPs; beside real nodes, clear of their subnets (10.244.N.0/24)
        f"--cidr={kube_hostnet.KWOK_CIDR if real else '10.244.0.0/16'}",
        "--node-ip=10.0.0.1",
        "--node-lease-duration-seconds=40",
        f"--server-address=127.0.0.1:{p['kwok']}",
    )
    names = kube_objects.node_names(state["instance_type"], state["nodes"])
    for name in names:
        core.create_node(kube_objects.node(name, state["instance_type"]))

    procs.wait("the nodes Ready (kwok)", lambda: _nodes_ready(core, names))
    procs.wait(
        "the default service account (controller manager)",
        lambda: _exists(lambda: core.read_namespaced_service_account("default", "default")),
    )
    custom = client.CustomObjectsApi(api)
    procs.wait("Volcano's webhook answering", lambda: _webhook_answers(custom))
    procs.wait(
        "the default queue open (scheduler, controllers)",
        lambda: _queue_open(custom, "default"),
    )
    objs = kube_objects.job_objects(run / "fsx")
    lay_job_objects(api, objs)
    queue, _, claim = objs
    procs.wait(
        f"queue {queue['metadata']['name']} open, claim {claim['metadata']['name']} bound",
        lambda: _queue_open(custom, queue["metadata"]["name"]) and _bound(core, claim),
    )


def lay_job_objects(api: Any, objs: list[dict[str, Any]]) -> None:
    """Create each object (kube_objects.job_objects) unless it exists."""
    from kubernetes import utils
    from kubernetes.client import CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    for obj in objs:
        try:
            if obj["kind"] == "Queue":
                group, version = obj["apiVersion"].split("/")
                CustomObjectsApi(api).create_cluster_custom_object(group, version, "queues", obj)
            else:
                utils.create_from_dict(api, obj)
        except ApiException as exc:
            if exc.status != 409:
                raise
        except utils.FailToCreateError as exc:
            if any(e.status != 409 for e in exc.api_exceptions):
                raise


def _bound(core: Any, claim: dict[str, Any]) -> bool:
    meta = claim["metadata"]
    found = core.read_namespaced_persistent_volume_claim(meta["name"], meta["namespace"])
    return bool(found.status.phase == "Bound")


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
