"""Real nodes: each its own containerd (runc, CNI) and its own kubelet, in a cgroup of its own.

Node real-N keeps everything under RUN/nodes/real-N: containerd's root, state (its netns
mounts included: netns_mounts_under_state_dir) and socket, runc's state, the CNI config and the
host-local IPAM's leases, the kubelet's root dir and pod logs. Its processes and pods live in
the cgroup /trainmaster-real-N (kube_cgroups.py) and its pods in 10.244.N.0/24 on bridge
tm-br-N (kube_hostnet.py). What this machine imposes, found by running a kubelet here:
  - cgroup v1 only: the kubelet refuses it unless `failCgroupV1: false`;
  - root lacks CAP_SYS_RESOURCE: runc cannot lower a sandbox's oom_score_adj ("can't get final
    child's PID from pipe") unless containerd clamps it, `restrict_oom_score_adj = true`;
  - no registry: the sandbox image is made here (kube_images.py) and imported before the
    kubelet starts; image GC is kept off (thresholds 100/99 %), as nothing could be pulled back;
  - one shared disk: eviction thresholds at 1 % so that the nodes never evict for disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import kube_cgroups
import kube_hostnet
import kube_images
import yaml

NODE_PREFIX = "real-"
SHIM_SOCKETS = Path("/run/containerd/s")  # containerd 1.6's shims: a name hashed from its id
_MNT_DETACH = 2


def plan(run: Path, count: int, free_port: Any) -> list[dict[str, Any]]:
    """The state.json entry of each node, ports chosen (FREE_PORT() -> int)."""
    nodes = []
    for i in range(1, count + 1):
        name, d = f"{NODE_PREFIX}{i}", run / "nodes" / f"{NODE_PREFIX}{i}"
        nodes.append(
            {
                "name": name,
                "index": i,
                "node_ip": kube_hostnet.node_ip(i),
                "pod_cidr": kube_hostnet.pod_cidr(i),
                "bridge": kube_hostnet.bridge(i),
                "cgroup": kube_cgroups.path(name),
                "dir": str(d),
                "containerd_socket": str(d / "containerd.sock"),
                "kubelet_port": free_port(),
                "kubelet_healthz_port": free_port(),
                "stream_port": free_port(),
                "pids": {},
                "lost": False,
            }
        )
    return nodes


def containerd_config(node: dict[str, Any], bins: Path) -> str:
    d = Path(node["dir"])
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
[grpc]
  address = "{node["containerd_socket"]}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"
[{cri}]
  sandbox_image = "{kube_images.PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "{node["stream_port"]}"
  enable_selinux = false
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{d}/runc"
[{cri}.cni]
  bin_dir = "{kube_hostnet.CNI_BIN}"
  conf_dir = "{d}/cni"
  max_conf_num = 1
"""


def cni_config(node: dict[str, Any]) -> dict[str, Any]:
    """The bridge plugin, gateway on the bridge, no masquerade (the host routes between the
    nodes' bridges), hairpin so a pod reaches itself through a Service; and portmap."""
    subnet = node["pod_cidr"]
    ipam = {
        "type": "host-local",
        "ranges": [[{"subnet": subnet, "gateway": subnet.replace(".0/24", ".1")}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": f"{node['dir']}/ipam",
    }
    bridge = {
        "type": "bridge",
        "bridge": node["bridge"],
        "isGateway": True,
        "ipMasq": False,
        "hairpinMode": True,
        "ipam": ipam,
    }
    portmap = {"type": "portmap", "capabilities": {"portMappings": True}}
    return {"cniVersion": "1.0.0", "name": f"tm-{node['name']}", "plugins": [bridge, portmap]}


def kubelet_config(node: dict[str, Any], pki: Path, dns_ip: str) -> dict[str, Any]:
    d, name = node["dir"], node["name"]
    eviction = {s: "1%" for s in ("nodefs.available", "nodefs.inodesFree", "imagefs.available")}
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node["node_ip"],
        "port": node["kubelet_port"],
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": node["kubelet_healthz_port"],
        "tlsCertFile": f"{pki}/kubelet-{name}.crt",
        "tlsPrivateKeyFile": f"{pki}/kubelet-{name}.key",
        # the API server (kubectl logs, exec) presents apiserver-kubelet-client, of this CA;
        # the kubelet asks the API server whether a user may (SubjectAccessReview)
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": f"{pki}/ca.crt"},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{node['containerd_socket']}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node["cgroup"],
        "cgroupsPerQOS": True,
        "failCgroupV1": False,
        "failSwapOn": False,
        "clusterDNS": [dns_ip],
        "clusterDomain": "cluster.local",
        "resolvConf": "/etc/resolv.conf",
        "podLogsDir": f"{d}/pod-logs",
        "volumePluginDir": f"{d}/volume-plugins",
        "evictionHard": {"memory.available": "100Mi", **eviction},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "oomScoreAdj": 0,  # -999, the default, is a lowering that root may not make here
        "registerNode": True,
    }


def write_configs(node: dict[str, Any], bins: Path, pki: Path, dns_ip: str) -> None:
    d = Path(node["dir"])
    for sub in ("cni", "ipam", "kubelet", "pod-logs", "volume-plugins", "runc"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "containerd.toml").write_text(containerd_config(node, bins))
    (d / "cni" / "10-tm.conflist").write_text(json.dumps(cni_config(node), indent=1))
    config = kubelet_config(node, pki, dns_ip)
    (d / "kubelet.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def containerd_args(node: dict[str, Any]) -> list[str]:
    return ["--config", f"{node['dir']}/containerd.toml"]


def kubelet_args(node: dict[str, Any], kubeconfig: Path) -> list[str]:
    d = node["dir"]
    return [
        f"--config={d}/kubelet.yaml",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={d}/kubelet",
        f"--cert-dir={d}/kubelet/pki",
        f"--hostname-override={node['name']}",
        f"--node-ip={node['node_ip']}",
        "--node-labels=trainmaster.io/local-node=real",
    ]


def _mounts_under(prefix: str) -> list[str]:
    """Mount points at or below PREFIX, deepest (last mounted) first."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")  # \040 is a space
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return points[::-1]


def unmount_all(prefix: str) -> int:
    """Lazily unmount everything under PREFIX: containers' overlay roots, sandboxes' shm, netns
    bind mounts, the kubelet's volume tmpfs. Returns how many."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    count = 0
    for point in _mounts_under(prefix):
        if libc.umount2(point.encode(), _MNT_DETACH) == 0:
            count += 1
    return count


def _remove_host_files(node: dict[str, Any]) -> None:
    """What containerd 1.6 keeps outside its own dirs, per task or sandbox id (the directories
    of its v2 runtime's and its CRI's state): each shim's socket in /run/containerd/s, named
    sha256(containerd's address/namespace/id), and libcni's cached result of the loopback
    network (/var/lib/cni/results/cni-loopback-ID-lo; the pod network's is kube_hostnet's)."""
    state = Path(node["dir"]) / "containerd/state"
    for ns_dir in (state / "io.containerd.runtime.v2.task").glob("*"):
        for task in ns_dir.iterdir():
            key = f"{node['containerd_socket']}/{ns_dir.name}/{task.name}"
            with contextlib.suppress(OSError):
                os.unlink(SHIM_SOCKETS / hashlib.sha256(key.encode()).hexdigest())
    for sandbox in (state / "io.containerd.grpc.v1.cri/sandboxes").glob("*"):
        with contextlib.suppress(OSError):
            os.unlink(f"/var/lib/cni/results/cni-loopback-{sandbox.name}-lo")


def kill(node: dict[str, Any]) -> int:
    """A node's loss: every process of it SIGKILLed (kube_cgroups.kill: kubelet, containerd,
    shims, containers), then its bridge deleted, so its pods' IPs stop answering (the host's
    unreachable route takes them). Returns how many processes were killed."""
    killed = kube_cgroups.kill(node["name"])
    subprocess.run(["ip", "link", "del", node["bridge"]], capture_output=True, check=False)
    node["lost"], node["pids"] = True, {}
    return killed


def teardown(run: Path, nodes: list[dict[str, Any]]) -> None:
    """Kill every node (all of them, lost or not: nothing is left to stop politely), unmount
    what they mounted, remove their shims' sockets and their cgroups."""
    names = {n["name"] for n in nodes}
    if kube_hostnet.owner() == str(run):  # also subtrees a crashed `up` made but never recorded
        names |= {n for n in kube_cgroups.nodes_present() if n.startswith(NODE_PREFIX)}
    for name in sorted(names):
        kube_cgroups.kill(name)
    unmount_all(str(run / "nodes"))
    for node in nodes:
        _remove_host_files(node)
    for name in sorted(names):
        kube_cgroups.remove(name)
