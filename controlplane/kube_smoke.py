"""The smoke check `kube.py up --real-nodes N` ends with: proof that the nodes run containers.

One pod per real node (the nettest image, bound to the node by nodeName) must run, get an IP of
its node's pod subnet and answer on it from the host (runtime, CNI, the host's routes); the
API server must return one's log through its kubelet (kubectl logs: the kubelet's serving
certificate and authorization); CoreDNS must answer kubernetes.default's name with its
ClusterIP, and the `kubernetes` Service must lead to the advertised host address. The pods are
deleted afterwards (nothing waits for their end: the nodes keep no trace that matters).
"""

from __future__ import annotations

import ipaddress
import random
import socket
import struct
from typing import Any

import kube_images
import kube_procs

PORT = 8080
NAMESPACE = "default"


def dial(ip: str, port: int = PORT, timeout: float = 2.0) -> str | None:
    """The first line a nettest server at IP answers with, or None if it does not."""
    try:
        with socket.create_connection((ip, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            return conn.makefile().readline().strip() or None
    except OSError:
        return None


def dns_a(server: str, name: str, timeout: float = 2.0) -> list[str]:
    """The A records SERVER gives for NAME (one UDP query, no recursion asked of us)."""
    qid = random.randrange(1 << 16)
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split("."))
    query = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + question + b"\0" + b"\0\1\0\1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        try:
            s.sendto(query, (server, 53))
            reply = s.recv(4096)
        except OSError:
            return []
    rid, _, _, count = struct.unpack(">HHHH", reply[:8])
    if rid != qid:
        return []
    at, found = len(query), []
    for _ in range(count):  # each answer: name (a pointer here), type, class, ttl, length, data
        at += 2 if reply[at] >= 0xC0 else reply.index(b"\0", at) + 1 - at
        rtype, _, _, length = struct.unpack(">HHIH", reply[at : at + 10])
        at += 10
        if rtype == 1 and length == 4:
            found.append(socket.inet_ntoa(reply[at : at + 4]))
        at += length
    return found


def pod(name: str, node: str, args: list[str], **spec: Any) -> dict[str, Any]:
    """A pod of the nettest image bound to NODE (no scheduler involved)."""
    container = {
        "name": "main",
        "image": kube_images.NETTEST_IMAGE,
        "imagePullPolicy": "Never",  # nothing can be pulled here
        "args": args,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"trainmaster.io/smoke": name}},
        "spec": {
            "nodeName": node,
            "containers": [container],
            "terminationGracePeriodSeconds": 1,
            **spec,
        },
    }


def _running_ip(core: Any, name: str) -> str | None:
    found = core.read_namespaced_pod(name, NAMESPACE)
    return found.status.pod_ip if found.status.phase == "Running" else None


def run(procs: kube_procs.Processes, core: Any, state: dict[str, Any]) -> None:
    nodes = state["real_nodes"]
    names = {n["name"]: f"trainmaster-smoke-{n['name']}" for n in nodes}
    for node in nodes:
        core.create_namespaced_pod(
            NAMESPACE, pod(names[node["name"]], node["name"], ["serve", str(PORT)])
        )
    try:
        procs.wait(
            f"{len(nodes)} smoke pods running",
            lambda: all(_running_ip(core, p) for p in names.values()),
        )
        for node in nodes:
            ip = _running_ip(core, names[node["name"]]) or ""
            if ipaddress.ip_address(ip) not in ipaddress.ip_network(node["pod_cidr"]):
                raise kube_procs.StartError(
                    f"pod on {node['name']} got {ip}, not in {node['pod_cidr']}"
                )
            want = f"hello from {names[node['name']]}"
            procs.wait(
                f"{ip}:{PORT} answering (on {node['name']})",
                lambda ip=ip, want=want: dial(ip) == want,
            )
        first = names[nodes[0]["name"]]
        procs.wait(
            "a pod's log through the API server and its kubelet",
            lambda: "listening on" in core.read_namespaced_pod_log(first, NAMESPACE),
        )
        dns = state["real_host"]["dns_ip"]
        kubernetes = core.read_namespaced_service("kubernetes", "default").spec.cluster_ip
        procs.wait(
            "CoreDNS answering kubernetes.default.svc.cluster.local",
            lambda: dns_a(dns, "kubernetes.default.svc.cluster.local") == [kubernetes],
        )
        procs.wait(
            f"the kubernetes Service's endpoint at {state['real_host']['host_ip']}",
            lambda: _endpoint_ips(core) == [state["real_host"]["host_ip"]],
        )
    finally:
        for name in names.values():
            core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)


def _endpoint_ips(core: Any) -> list[str]:
    found = core.read_namespaced_endpoints("kubernetes", "default")
    return [a.ip for s in found.subsets or [] for a in s.addresses or []]
