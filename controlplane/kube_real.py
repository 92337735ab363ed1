"""`kube.py up --real-nodes N`: real nodes beside the control plane, their DNS and Services.

prepare() runs before the control plane starts (the host's addresses must exist when the API
server advertises one of them), start() once it is ready: each node's containerd, the local
images imported into it, CoreDNS, the kubelets, then kube-proxy (it takes real-1's name), and a
smoke check (kube_smoke.py). teardown() undoes all of it, kill_node() takes one node away.
State (state.json): "real_nodes", one entry per node (kube_nodes.plan: name, node_ip,
containerd_socket, cgroup, bridge, pod_cidr, kubelet_port, pids, lost, ...), and "real_host"
(host_ip, dns_ip, cluster_cidr, what teardown restores).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kube_cgroups
import kube_hostnet
import kube_images
import kube_nodes
import kube_pki
import kube_procs
import kube_seed
import kube_services

BINARIES = ["kubelet", "kube-proxy", "coredns", "pause", "nettest"]
PORT_NAMES = ["coredns-health", "coredns-ready", "kube-proxy-healthz", "kube-proxy-metrics"]
HOST_PROCESSES = ["kube-proxy", "coredns"]
TIMEOUT = 150.0  # seconds more for `up`: ~25 s here on a quiet machine


def problem(run: Path, bins: Path, count: int) -> str | None:
    """Why COUNT real nodes cannot start, or None."""
    if count < 0:
        return f"--real-nodes {count}: not negative"
    if count > 100:
        return f"--real-nodes {count}: at most 100 (10.244.N.0/24 under kwok's 10.244.128.0/17)"
    missing = [b for b in BINARIES if not (bins / b).exists()]
    if missing:
        return f"not built ({', '.join(missing)}): run `make kube-build` (controlplane/build.sh)"
    sock = run / "nodes" / f"{kube_nodes.NODE_PREFIX}{count}" / "containerd.sock.ttrpc"
    if len(str(sock)) > 100:  # a unix socket's path has 108 bytes
        return (
            f"run dir {run} too long for containerd's sockets: use a shorter TRAINMASTER_KUBE_DIR"
        )
    return kube_hostnet.problem(run) or kube_cgroups.available()


def prepare(run: Path, state: dict[str, Any], count: int, free_port: Any) -> None:
    """Host network, the nodes' plan and identities; STATE gains real_nodes and real_host."""
    state["real_nodes"] = kube_nodes.plan(run, count, free_port)
    state["ports"].update({name: free_port() for name in PORT_NAMES})
    state["real_host"] = {
        "host_ip": kube_pki.HOST_IP,
        "dns_ip": kube_services.DNS_IP,
        "cluster_cidr": kube_hostnet.CLUSTER_CIDR,
    }
    write_state(run, state)  # before anything is made: teardown reads it
    state["real_host"].update(kube_hostnet.setup(run, count))
    write_state(run, state)
    pki, server = run / "pki", f"https://127.0.0.1:{state['ports']['apiserver']}"
    kube_services.make_certs(pki, state["real_nodes"])
    for client in ["kube-proxy", "coredns"] + [f"node-{n['name']}" for n in state["real_nodes"]]:
        kube_pki.write_kubeconfig(run / "kubeconfigs" / f"{client}.kubeconfig", pki, client, server)


def apiserver_flags(pki: Path) -> list[str]:
    """Reachable from pods (all addresses, HOST_IP advertised: the `kubernetes` Service's
    endpoint, kept by the lease reconciler) and able to reach the kubelets (logs, exec)."""
    return [
        "--bind-address=0.0.0.0",
        f"--advertise-address={kube_pki.HOST_IP}",
        "--endpoint-reconciler-type=lease",
        f"--kubelet-client-certificate={pki}/apiserver-kubelet-client.crt",
        f"--kubelet-client-key={pki}/apiserver-kubelet-client.key",
        f"--kubelet-certificate-authority={pki}/ca.crt",
        # the nodes' Hostname address (real-N) resolves nowhere; their InternalIP is on lo
        "--kubelet-preferred-address-types=InternalIP,Hostname",
    ]


def write_state(run: Path, state: dict[str, Any]) -> None:
    tmp = run / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(run / "state.json")


def start(procs: kube_procs.Processes, state: dict[str, Any], api: Any) -> None:
    """Start every node and the host's DNS and proxy; return once the nodes are Ready and the
    smoke check passed (kube_procs.StartError if not)."""
    import kube_smoke
    from kubernetes import client

    run, bins, ports = procs.run, procs.bins, state["ports"]
    nodes = state["real_nodes"]
    seed = None
    if state.get("image_archives"):  # made once per set of images (minutes), then found
        seed, made = kube_seed.make([Path(a) for a in state["image_archives"]])
        procs.mark(f"the image store {'made' if made else 'found'} ({seed.parent.name})")
    procs.deadline += TIMEOUT
    for node in nodes:
        kube_nodes.write_configs(node, bins, run / "pki", kube_services.DNS_IP)
        if seed:
            kube_seed.give(seed, Path(node["dir"]) / "containerd" / "root")
        kube_cgroups.create(node["name"])
        procs.start(
            f"{node['name']}-containerd",
            *kube_nodes.containerd_args(node),
            exe="containerd",
            preexec=lambda name=node["name"]: kube_cgroups.enter(name),
        )
    archives = kube_images.node_images(bins, run / "images")
    kube_services.coredns_rbac(api)
    kube_services.start_coredns(procs, ports)
    procs.wait(
        f"{len(nodes)} containerd sockets",
        lambda: all(Path(n["containerd_socket"]).exists() for n in nodes),
    )
    with ThreadPoolExecutor(len(nodes)) as pool:  # ctr takes ~0.5 s an image, most of it waiting
        list(pool.map(lambda a: kube_images.import_into(a[0], a[1]), _pairs(nodes, archives)))
    procs.mark("the images imported (pause, nettest)")
    for node in nodes:
        kubeconfig = run / "kubeconfigs" / f"node-{node['name']}.kubeconfig"
        procs.start(
            f"{node['name']}-kubelet",
            *kube_nodes.kubelet_args(node, kubeconfig),
            exe=str(bins / "kubelet"),
            preexec=lambda name=node["name"]: kube_cgroups.enter(name),
        )
    for node in nodes:
        node["pids"] = {
            part: procs.procs[f"{node['name']}-{part}"].pid for part in ("containerd", "kubelet")
        }
    write_state(run, state)
    core = client.CoreV1Api(api)
    names = [n["name"] for n in nodes]
    procs.wait(f"the real nodes Ready ({', '.join(names)})", lambda: _ready(core, names))
    kube_services.start_kube_proxy(procs, ports, names[0])
    procs.wait("CoreDNS ready", lambda: kube_services.coredns_ready(ports))
    procs.wait("kube-proxy synced", lambda: kube_services.kube_proxy_ready(ports))
    state["real_host"]["pids"] = {p: procs.procs[p].pid for p in HOST_PROCESSES}
    write_state(run, state)
    kube_smoke.run(procs, core, state)


def _pairs(nodes: list[dict[str, Any]], archives: list[Path]) -> list[tuple[str, Path]]:
    return [(n["containerd_socket"], a) for n in nodes for a in archives]


def _ready(core: Any, names: list[str]) -> bool:
    ready = {
        n.metadata.name
        for n in core.list_node(label_selector="trainmaster.io/local-node=real").items
        if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
    }
    return set(names) <= ready


def liveness(run: Path, state: dict[str, Any]) -> dict[str, bool]:
    """Each process of the real nodes (a lost node's are not expected to live) and the host's."""
    names = [p for p in HOST_PROCESSES if state.get("real_nodes")]
    for node in state.get("real_nodes", []):
        if not node.get("lost"):
            names += [f"{node['name']}-containerd", f"{node['name']}-kubelet"]
    return {name: kube_procs.alive(run, name) for name in names}


def _stop_host_processes(run: Path, grace: float = 5.0) -> None:
    groups = [pid for name in HOST_PROCESSES if (pid := kube_procs.recorded(run, name))]
    for pid in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(kube_procs.ours(pid, run) for pid in groups) and time.monotonic() < deadline:
        time.sleep(0.05)  # waiting for other processes to exit, bounded by grace
    for pid in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def teardown(run: Path, state: dict[str, Any] | None) -> None:
    """Stop the real nodes and everything they made on the host (a no-op for a plane without).
    kube-proxy stops before its rules are cleaned, so that it cannot write them again."""
    state = state or {}
    nodes = state.get("real_nodes", [])
    if not nodes and kube_hostnet.owner() != str(run):
        return
    kube_nodes.teardown(run, nodes)
    _stop_host_processes(run)
    bins = Path(state["bin_dir"]) if state.get("bin_dir") else None
    kube_hostnet.teardown(run, bins / "kube-proxy" if bins else None, state.get("real_host"))


def kill_node(run: Path, state: dict[str, Any], name: str) -> str:
    """kube.py kill-node NAME: the node's loss (kube_nodes.kill); state.json marks it lost."""
    node = next((n for n in state.get("real_nodes", []) if n["name"] == name), None)
    if node is None:
        known = ", ".join(n["name"] for n in state.get("real_nodes", [])) or "none"
        raise KeyError(f"no real node {name!r} in {run} (real nodes: {known})")
    if node.get("lost"):
        return f"{name} was lost already"
    killed = kube_nodes.kill(node)
    node["lost_at"] = time.time()
    write_state(run, state)
    return f"{name} lost: {killed} processes killed, bridge {node['bridge']} deleted"


def cli_kill_node(run: Path, name: str) -> int:
    """kube.py kill-node NAME: 0, 2 for an unknown node, 3 without a plane."""
    try:
        state = json.loads((run / "state.json").read_text())
        print(kill_node(run, state, name))
    except OSError:
        print(f"control plane not running ({run})", file=sys.stderr)
        return 3
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return 2
    return 0


def cli_load_image(run: Path, archive: str) -> int:
    """kube.py load-image ARCHIVE: prints each live node and the image names it got."""
    try:
        loaded = kube_images.load_image(run, archive)
    except (OSError, RuntimeError) as e:
        print(e, file=sys.stderr)
        return 1
    for node, names in loaded.items():
        print(f"  {node}: {', '.join(names) or '(no image named in the archive)'}")
    return 0
