"""The host's side of the real nodes' network: addresses, routes, forwarding, and its cleanup.

All real nodes are on this one host, each with a bridge of its own (tm-br-N, made by the CNI
bridge plugin on its first pod) and pod subnet 10.244.N.0/24; the host routes between the
bridges (ip_forward=1, no masquerade), so a pod reaches another node's pod by its IP as on a
flat VPC network. Pods must also reach what runs on the host (the API server through the
`kubernetes` Service, CoreDNS): HOST_IP, on the loopback device (this kernel has no dummy
interfaces) with each node's IP beside it (10.250.1.N; the kubelet refuses a 127.x node IP).
Traffic must never leave the machine: an `unreachable` route covers the whole pod range, so a
dead node's pod IPs fail at once instead of following the default route out, and the chain
TM-REAL-NODES rejects forwarding from pods to anything but pods.

Only one plane on a host can have real nodes (the names above are the host's): MARKER names
the run dir that owns them, and only that plane's `down` takes them away.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
from pathlib import Path

from kube_pki import HOST_IP, SERVICE_CIDR

CLUSTER_CIDR = "10.244.0.0/16"  # every real node's pods (kube-proxy's clusterCIDR)
KWOK_CIDR = "10.244.128.0/17"  # kwok's fake pod IPs beside real nodes: no overlap with theirs
HOST_NET = "10.250.0.0/16"  # HOST_IP and the node IPs, on lo
CHAIN = "TM-REAL-NODES"
MARKER = Path("/run/trainmaster-kube-real-nodes")
BRIDGE_PREFIX = "tm-br-"
CNI_BIN = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
TOOLS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "ip", "conntrack")


def node_ip(index: int) -> str:
    return f"10.250.1.{index}"


def pod_cidr(index: int) -> str:
    return f"10.244.{index}.0/24"


def bridge(index: int) -> str:
    return f"{BRIDGE_PREFIX}{index}"


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def owner() -> str | None:
    try:
        return MARKER.read_text().strip() or None
    except OSError:
        return None


def problem(run: Path) -> str | None:
    """Why real nodes cannot start here, or None."""
    if os.geteuid() != 0:
        return "real nodes need root (cgroups, bridges, iptables, mounts)"
    missing = [t for t in TOOLS if not shutil.which(t)]
    missing += [
        p for p in ("bridge", "host-local", "loopback", "portmap") if not (CNI_BIN / p).exists()
    ]
    if missing:
        return (
            f"missing for real nodes: {', '.join(missing)} (Debian: apt-get install containerd "
            "runc containernetworking-plugins iptables conntrack)"
        )
    other = owner()
    if other and other != str(run) and Path(other).exists():
        return (
            f"the plane in {other} has the real nodes of this host: "
            f"TRAINMASTER_KUBE_DIR={other} python controlplane/kube.py down, first"
        )
    return None


def setup(run: Path, count: int) -> dict[str, str]:
    """Make the host ready for COUNT nodes; returns what teardown() restores."""
    if owner() and owner() != str(run):
        teardown(Path(owner() or ""), None)  # leftovers of a plane whose run dir is gone
    MARKER.write_text(str(run))
    forward = Path("/proc/sys/net/ipv4/ip_forward")
    before = forward.read_text().strip()
    forward.write_text("1")
    for ip in [HOST_IP] + [node_ip(i) for i in range(1, count + 1)]:
        _run("ip", "addr", "replace", f"{ip}/32", "dev", "lo")
    _run("ip", "route", "replace", "unreachable", CLUSTER_CIDR)
    # The host's own connections to a ClusterIP (kube-proxy DNATs them in OUTPUT, after the
    # route lookup): routed to lo, from HOST_IP, rather than out of the machine.
    _run("ip", "route", "replace", SERVICE_CIDR, "dev", "lo", "src", HOST_IP)
    _run("iptables", "-N", CHAIN, check=False)
    _run("iptables", "-F", CHAIN)
    _run("iptables", "-A", CHAIN, "-s", CLUSTER_CIDR, "-d", CLUSTER_CIDR, "-j", "RETURN")
    _run("iptables", "-A", CHAIN, "-s", CLUSTER_CIDR, "-j", "REJECT")
    if _run("iptables", "-C", "FORWARD", "-j", CHAIN, check=False).returncode != 0:
        _run("iptables", "-I", "FORWARD", "-j", CHAIN)
    return {"ip_forward_before": before}


# What the kubelets (pkg/kubelet/kubelet_network_linux.go) and kube-proxy leave in the host's
# iptables and ip6tables after `kube-proxy --cleanup`: (table, chain, chains that jump to it).
KUBELET_CHAINS = [
    ("filter", "KUBE-FIREWALL", ("INPUT", "OUTPUT")),
    ("mangle", "KUBE-IPTABLES-HINT", ()),
    ("mangle", "KUBE-KUBELET-CANARY", ()),
    ("nat", "KUBE-KUBELET-CANARY", ()),
    ("filter", "KUBE-KUBELET-CANARY", ()),
]


def _drop_chain(tool: str, table: str, chain: str, jumps: tuple[str, ...]) -> None:
    for parent in jumps:
        while _run(tool, "-t", table, "-D", parent, "-j", chain, check=False).returncode == 0:
            pass  # one rule removed per call; the kubelet may have added it more than once
    _run(tool, "-t", table, "-F", chain, check=False)
    _run(tool, "-t", table, "-X", chain, check=False)


def teardown(run: Path, kube_proxy: Path | None, restore: dict[str, str] | None = None) -> None:
    """Undo setup() and what the nodes' processes made on the host (all dead by now): the
    bridges, kube-proxy's rules (`kube-proxy --cleanup`), the kubelets' chains, CNI's cached
    results. Only for the plane in RUN that owns the host's real nodes."""
    if owner() != str(run):
        return
    links = _run("ip", "-o", "link", "show", "type", "bridge", check=False).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(BRIDGE_PREFIX):
            _run("ip", "link", "del", name, check=False)
    if kube_proxy and kube_proxy.exists():
        _run(str(kube_proxy), "--cleanup", check=False)
    for tool in ("iptables", "ip6tables"):
        for table, chain, jumps in KUBELET_CHAINS:
            _drop_chain(tool, table, chain, jumps)
    _drop_chain("iptables", "filter", CHAIN, ("FORWARD",))
    _run("ip", "route", "del", "unreachable", CLUSTER_CIDR, check=False)
    _run("ip", "route", "del", SERVICE_CIDR, "dev", "lo", check=False)
    addrs = _run("ip", "-o", "-4", "addr", "show", "dev", "lo", check=False).stdout.split()
    for addr in addrs:
        if addr.startswith("10.250.") and "/" in addr:
            _run("ip", "addr", "del", addr, "dev", "lo", check=False)
    for cached in glob.glob("/var/lib/cni/results/tm-real-*"):  # libcni's, keyed by network
        with contextlib.suppress(OSError):
            os.unlink(cached)
    if restore and "ip_forward_before" in restore:
        Path("/proc/sys/net/ipv4/ip_forward").write_text(restore["ip_forward_before"])
    MARKER.unlink(missing_ok=True)
