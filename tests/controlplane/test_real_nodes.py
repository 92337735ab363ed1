"""Real nodes (controlplane/kube.py up --real-nodes 6): containers run, and talk to each other.

Each real node is its own containerd and kubelet; pods get IPs of their node's subnet and reach
each other across nodes by pod IP, by a headless Service's per-pod DNS name (what Volcano's svc
plugin gives a job's pods), through a ClusterIP Service (kube-proxy) and reach the API server
through the `kubernetes` Service with their in-cluster credentials. The API server reads a
container's log from its kubelet. An image archive loads into every live node, and
`kube.py kill-node` is a node's loss: its pods stop answering, the node goes NotReady after the
controller manager's node-monitor grace period (its default, 50 s: kube_start sets none).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

from tests.controlplane.conftest import controlplane_module
from tests.controlplane.realnodes import COUNT, RealNodes

pytestmark = [pytest.mark.realnodes, pytest.mark.timeout(600)]
smoke = controlplane_module("kube_smoke")  # pod(), dial(): the same the smoke check uses
images = controlplane_module("kube_images")
cgroups = controlplane_module("kube_cgroups")
PORT = smoke.PORT
NOT_READY_S = 50 + 5 + 60  # grace period, node-monitor period, a loaded machine's slack


def _phase(plane: RealNodes, ns: str, name: str) -> str:
    return str(plane.core.read_namespaced_pod(name, ns).status.phase)


def _running(plane: RealNodes, ns: str, name: str, timeout: float = 90) -> Any:
    plane.wait_for(lambda: _phase(plane, ns, name) == "Running", timeout, f"pod {name} Running")
    return plane.core.read_namespaced_pod(name, ns)


def _server(plane: RealNodes, ns: str, name: str, node: str, **spec: Any) -> Any:
    body = smoke.pod(name, node, ["serve", str(PORT)], **spec)
    body["metadata"]["labels"]["app"] = name
    plane.core.create_namespaced_pod(ns, body)
    pod = _running(plane, ns, name)
    assert pod.spec.node_name == node
    cidr = plane.node(node)["pod_cidr"]
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(cidr), (
        pod.status.pod_ip,
        cidr,
    )
    return pod


def _ready(plane: RealNodes, name: str) -> str:
    conditions = plane.core.read_node(name).status.conditions or []
    return next((c.status for c in conditions if c.type == "Ready"), "missing")


def test_nodes_are_real_and_ready(real_nodes: RealNodes) -> None:
    state = real_nodes.state
    assert [n["name"] for n in state["real_nodes"]] == [f"real-{i}" for i in range(1, COUNT + 1)]
    assert state["nodes"] == 0
    # the nodes no test has lost yet (test_real_job.py loses one of real-4..6, maybe first)
    for entry in [n for n in state["real_nodes"] if not n["lost"]]:
        node = real_nodes.core.read_node(entry["name"])
        assert _ready(real_nodes, entry["name"]) == "True"
        assert node.metadata.labels["trainmaster.io/local-node"] == "real"
        assert node.metadata.labels["kubernetes.io/hostname"] == entry["name"]
        assert not node.spec.taints
        assert node.status.node_info.kubelet_version == "v1.35.4"
        assert node.status.node_info.container_runtime_version.startswith("containerd://1.6")
        internal = [a.address for a in node.status.addresses if a.type == "InternalIP"]
        assert internal == [entry["node_ip"]]
        # the kubelet, containerd and nothing else outside the subtree
        assert set(entry["pids"].values()) <= set(cgroups.pids(entry["name"]))


def test_pods_reach_each_other_across_nodes(real_nodes: RealNodes) -> None:
    plane, ns = real_nodes, real_nodes.namespace()
    core = plane.core
    core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": "peers"},
            "spec": {
                "clusterIP": "None",
                "selector": {"app": "server"},
                "ports": [{"port": PORT}],
                "publishNotReadyAddresses": True,  # as Volcano's svc plugin makes it
            },
        },
    )
    service = core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": "front"},
            "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": PORT}]},
        },
    )
    server = _server(plane, ns, "server", "real-1", hostname="server-0", subdomain="peers")
    ip = server.status.pod_ip
    assert smoke.dial(ip) == "hello from server-0"  # from the host, through tm-br-1

    targets = [
        f"{ip}:{PORT}",
        f"server-0.peers.{ns}.svc.cluster.local:{PORT}",
        f"front.{ns}.svc.cluster.local:80",
        f"{service.spec.cluster_ip}:80",
        "api",  # GET /version through the kubernetes Service, in-cluster credentials
    ]
    client = smoke.pod("client", "real-2", ["probe", *targets], restartPolicy="Never")
    core.create_namespaced_pod(ns, client)
    plane.wait_for(
        lambda: _phase(plane, ns, "client") in ("Succeeded", "Failed"), 180, "the probe's end"
    )
    log = core.read_namespaced_pod_log("client", ns)  # kubectl logs: API server -> kubelet
    assert _phase(plane, ns, "client") == "Succeeded", log
    for target in targets[:-1]:
        assert f"ok {target}: hello from server-0" in log, log
    assert "ok api: 200 OK" in log and '"gitVersion": "v1.35.4"' in log, log
    assert "all ok" in log
    pod = core.read_namespaced_pod("client", ns)
    assert pod.spec.node_name == "real-2"
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(
        plane.node("real-2")["pod_cidr"]
    )
    # the server saw the connections: its log through real-1's kubelet
    assert "connection from" in core.read_namespaced_pod_log("server", ns)


def test_load_image_into_every_node(real_nodes: RealNodes, tmp_path: Path) -> None:
    plane, ns = real_nodes, real_nodes.namespace()
    nettest = Path(plane.state["bin_dir"]) / "nettest"
    ref = "localhost/trainmaster/loaded:test"
    archive = images.write_archive(
        tmp_path / "loaded.tar", ref, {"/nettest": nettest}, ["/nettest"]
    )
    done = plane.kube("load-image", str(archive))
    assert done.returncode == 0, done.stderr
    for name in ("real-1", "real-2", "real-3"):
        assert f"{name}: {ref}" in done.stdout, done.stdout
    body = smoke.pod("loaded", "real-3", ["serve", str(PORT)])
    body["spec"]["containers"][0]["image"] = ref
    plane.core.create_namespaced_pod(ns, body)
    pod = _running(plane, ns, "loaded")
    assert smoke.dial(pod.status.pod_ip) == "hello from loaded"


def test_kill_node(real_nodes: RealNodes) -> None:
    plane, ns = real_nodes, real_nodes.namespace()
    victim = plane.node("real-3")
    assert cgroups.pids("real-3")
    pod = _server(plane, ns, "doomed", "real-3")
    survivor = _server(plane, ns, "survivor", "real-1")
    assert smoke.dial(pod.status.pod_ip) == "hello from doomed"

    done = plane.kube("kill-node", "real-3")
    assert done.returncode == 0, done.stderr
    assert "real-3 lost" in done.stdout
    assert cgroups.pids("real-3") == []  # kubelet, containerd, shims, containers: all gone
    assert plane.node("real-3")["lost"] is True
    assert smoke.dial(pod.status.pod_ip, timeout=1) is None  # its bridge is gone
    assert smoke.dial(survivor.status.pod_ip) == "hello from survivor"
    assert plane.kube("kill-node", "real-9").returncode == 2

    plane.wait_for(
        lambda: _ready(plane, "real-3") == "Unknown", NOT_READY_S, "real-3 NotReady (Unknown)"
    )
    assert _ready(plane, "real-1") == "True" and _ready(plane, "real-2") == "True"
    status = plane.kube("status")
    assert status.returncode == 0, status.stdout  # a lost node is expected dead
    assert "LOST" in status.stdout
    # an image now loads into the live nodes only
    loaded = images.load_image(plane.run_dir, plane.run_dir / "images" / "pause.tar")
    live = [n["name"] for n in plane.state["real_nodes"] if not n["lost"]]
    assert sorted(loaded) == sorted(live) and "real-3" not in loaded
    assert victim["bridge"] == "tm-br-3"
