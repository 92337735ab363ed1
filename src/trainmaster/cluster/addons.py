"""Kubernetes objects and Helm values of the cluster's add-ons, pinned (versions.py).

- Device plugins: Neuron (Neuron's Helm chart, with its node problem detector and recovery;
  resources aws.amazon.com/neuron and aws.amazon.com/neuroncore) or NVIDIA (Helm chart), and
  EFA (Helm chart). The charts' defaults do not tolerate the accelerator taint, so the values add it;
  without that the EFA plugin never lands on the nodes that have EFA.
- Volcano's job queue (scheduling.volcano.sh/v1beta1) with kubernetes.queue_weight and, only
  when set, kubernetes.queue_capability: the tutorial's `cpu: 2` would refuse every job whose
  pods request CPU, as ours do, so a capability smaller than one gang is refused (spec.py).
- etcd 3.5 with the v2 API (torch's etcd rendezvous), as a one-replica Deployment on the
  system nodes, with Services etcd-server (2379, 2380) and etcd-client (2379): ClusterIP, in
  its own namespace trainmaster-etcd (jobs reach etcd-server.trainmaster-etcd.svc:2379). etcd
  runs without authentication (torch's etcd handler has no credentials to give), so a
  NetworkPolicy lets only pods labelled app.kubernetes.io/managed-by=trainmaster, from any
  namespace, reach port 2379; the VPC CNI's network policy agent enforces it (eksctl.py).
"""

from __future__ import annotations

from typing import Any

from trainmaster import catalog
from trainmaster.cluster import versions
from trainmaster.cluster.spec import ROLE_LABEL, ClusterSpec

SYSTEM_SELECTOR = {ROLE_LABEL: "system"}
MANAGED = {"app.kubernetes.io/managed-by": "trainmaster"}
NPD_SERVICE_ACCOUNT = "node-problem-detector"  # the chart's npd.serviceAccount.name
ETCD = "etcd-server"
ETCD_NAMESPACE = (
    "trainmaster-etcd"  # backends/kubernetes/volcano.py DEFAULT_ETCD names this namespace too
)


def _meta(name: str, namespace: str | None = None, **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {**MANAGED, **labels}}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def accelerator_tolerations(spec: ClusterSpec) -> list[dict[str, str]]:
    tols = [
        {"key": "CriticalAddonsOnly", "operator": "Exists"},
        {"key": spec.taint_key, "operator": "Exists", "effect": "NoSchedule"},
    ]
    if spec.efa:
        tols.append({"key": catalog.EFA, "operator": "Exists", "effect": "NoSchedule"})
    return tols


# --- device plugins ---------------------------------------------------------------------------


def neuron_values(spec: ClusterSpec) -> dict[str, Any]:
    """Values of Neuron's Helm chart (versions.NEURON_CHART): its device plugin on the
    accelerator nodes, and its node problem detector (NPD) with node recovery on.

    Neuron documents the chart as the way to install the device plugin, the scheduler extension
    and the NPD (aws-neuron-sdk deploy/eks/helm-chart.rst). The NPD watches the kernel log for
    Neuron hardware errors (SRAM/NC/HBM uncorrectable, DMA) and sets the node condition
    NeuronHealth; with `npd.nodeRecovery.enabled` it also marks the instance unhealthy in its
    Auto Scaling group, which replaces it (deploy/infrastructure/problem-detector.rst). Its
    service account comes from eksctl/npd-irsa.yaml (the documented IRSA policy), so the chart
    does not create one. A job on a node marked so loses a pod, and Volcano restarts the gang on
    the nodes left (the node-loss handling of backends/kubernetes/volcano.py).
    """
    tolerations = accelerator_tolerations(spec)
    return {
        "devicePlugin": {"enabled": True, "tolerations": tolerations},
        "scheduler": {"enabled": False},  # Volcano schedules the gangs
        "npd": {
            "enabled": True,
            "serviceAccount": {"create": False, "name": NPD_SERVICE_ACCOUNT},
            "nodeRecovery": {"enabled": True},
        },
    }


def efa_values(spec: ClusterSpec) -> dict[str, Any]:
    """Values of eks/aws-efa-k8s-device-plugin: tolerate the accelerator taint."""
    return {
        "tolerations": accelerator_tolerations(spec),
        "nodeSelector": {ROLE_LABEL: "accelerator"},
    }


def nvidia_values(spec: ClusterSpec) -> dict[str, Any]:
    """Values of nvdp/nvidia-device-plugin (its default affinity wants nvidia.com/gpu.present)."""
    return {
        "tolerations": accelerator_tolerations(spec),
        "nodeSelector": {ROLE_LABEL: "accelerator"},
    }


# --- Volcano queue, etcd -----------------------------------------------------------------------


def queue(spec: ClusterSpec) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": _meta(spec.queue),
        "spec": {"weight": spec.queue_weight, "reclaimable": False}
        | ({"capability": dict(spec.queue_capability)} if spec.queue_capability else {}),
    }


def etcd(spec: ClusterSpec) -> list[dict[str, Any]]:
    ns, labels = ETCD_NAMESPACE, {"app": "etcd", "etcd_node": ETCD}
    args = [
        "--name",
        ETCD,
        "--data-dir",
        "/var/lib/etcd",
        "--enable-v2",
        "--listen-client-urls",
        "http://0.0.0.0:2379",
        "--advertise-client-urls",
        f"http://{ETCD}:2379",
        "--listen-peer-urls",
        "http://0.0.0.0:2380",
        "--initial-advertise-peer-urls",
        f"http://{ETCD}:2380",
        "--initial-cluster",
        f"{ETCD}=http://{ETCD}:2380",
        "--initial-cluster-state",
        "new",
    ]
    container = {
        "name": "etcd",
        "image": versions.ETCD_IMAGE,
        "command": ["/usr/local/bin/etcd", *args],
        "ports": [
            {"name": "client", "containerPort": 2379},
            {"name": "peer", "containerPort": 2380},
        ],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "readinessProbe": {"httpGet": {"path": "/health", "port": 2379}, "periodSeconds": 10},
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(ETCD, ns),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": SYSTEM_SELECTOR,
                    "containers": [container],
                    "volumes": [{"name": "data", "emptyDir": {}}],
                },
            },
        },
    }

    def service(name: str, ports: list[tuple[str, int]]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(name, ns),
            "spec": {
                "type": "ClusterIP",
                "selector": labels,
                "ports": [
                    {"name": n, "port": p, "targetPort": p, "protocol": "TCP"} for n, p in ports
                ],
            },
        }

    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(ns)}
    # One `from` entry holding both selectors: pods with the label in ANY namespace (an empty
    # namespaceSelector matches every namespace). Nothing else may open 2379; the single member
    # has no peers, so 2380 stays closed too.
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta("etcd-clients", ns),
        "spec": {
            "podSelector": {"matchLabels": labels},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {"namespaceSelector": {}, "podSelector": {"matchLabels": dict(MANAGED)}}
                    ],
                    "ports": [{"protocol": "TCP", "port": 2379}],
                }
            ],
        },
    }
    return [
        namespace,
        deployment,
        service(ETCD, [("client", 2379), ("peer", 2380)]),
        service("etcd-client", [("client", 2379)]),
        policy,
    ]


# --- TensorBoard ------------------------------------------------------------------------------

TENSORBOARD = "tensorboard"
TENSORBOARD_PORT = 6006
IMAGE = "@IMAGE@"  # the training image (it has tensorboard); runbook.sh fills it in


def tensorboard(spec: ClusterSpec) -> list[dict[str, Any]]:
    """TensorBoard over every run (STORAGE/runs), behind a ClusterIP Service: reached with
    `kubectl port-forward`, never through a public load balancer (the tutorial's, on plain HTTP
    with a password baked into an image)."""
    ns, labels = spec.namespace, {"app": TENSORBOARD}
    logdir = f"{spec.mount.rstrip('/')}/runs"
    container = {
        "name": TENSORBOARD,
        "image": IMAGE,
        "command": [
            "tensorboard",
            "--logdir",
            logdir,
            "--host",
            "0.0.0.0",
            "--port",
            str(TENSORBOARD_PORT),
            "--reload_interval",
            "60",
        ],
        "ports": [{"name": "http", "containerPort": TENSORBOARD_PORT}],
        "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        "readinessProbe": {"httpGet": {"path": "/", "port": TENSORBOARD_PORT}, "periodSeconds": 15},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": False},
        "volumeMounts": [{"name": "storage", "mountPath": spec.mount, "readOnly": True}],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(TENSORBOARD, ns),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": SYSTEM_SELECTOR,
                    "containers": [container],
                    "volumes": [
                        {
                            "name": "storage",
                            "persistentVolumeClaim": {"claimName": spec.pvc, "readOnly": True},
                        }
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(TENSORBOARD, ns),
        "spec": {
            "type": "ClusterIP",
            "selector": labels,
            "ports": [
                {
                    "name": "http",
                    "port": TENSORBOARD_PORT,
                    "targetPort": TENSORBOARD_PORT,
                    "protocol": "TCP",
                }
            ],
        },
    }
    return [deployment, service]
