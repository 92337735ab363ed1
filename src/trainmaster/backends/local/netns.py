"""Local nodes on a real network: each node in a network namespace of its own (job.network =
"netns"; root and iproute2), with its own address on a bridge, so that the rendezvous and the
collectives cross a network as on a cluster, and a test can cut one node's link (a partition,
not a kill).

    bridge tm<ID>b (root namespace)
      ├── tm<ID>h0 ─ veth ─ eth0 10.213.S.1/24   namespace tm<ID>-0   (node 0: the c10d store)
      └── tm<ID>h1 ─ veth ─ eth0 10.213.S.2/24   namespace tm<ID>-1

ID and the subnet S come from a hash of the run folder, so that two runs do not collide and the
names stay within the kernel's 15 characters. Each node's agent gets --local-addr (its address:
the workers' MASTER_ADDR) and GLOO_SOCKET_IFNAME=eth0 (gloo would otherwise pick the address of
the machine's host name, which no namespace has). The file system is shared as before.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from trainmaster.errors import UserError
from trainmaster.launch.torchrun import AGENT_MODULES

IFNAME = "eth0"
C10D_PORT = 29400  # a fresh namespace has every port free


@dataclass(frozen=True)
class Network:
    id: str
    subnet: str  # "10.213.S"
    nnodes: int

    @property
    def bridge(self) -> str:
        return f"tm{self.id}b"

    def namespace(self, node: int) -> str:
        return f"tm{self.id}-{node}"

    def host_link(self, node: int) -> str:
        """The root namespace's end of the node's veth: `ip link set ... down` cuts the node off."""
        return f"tm{self.id}h{node}"

    def address(self, node: int) -> str:
        return f"{self.subnet}.{node + 1}"

    def wrap(self, node: int, cmd: list[str]) -> list[str]:
        """The agent's command run in the node's namespace, told its own address and whether it
        hosts the c10d store: torch decides that by matching the endpoint against the machine's
        host name (c10d_rendezvous_backend.py _create_tcp_store, _matches_machine_hostname),
        which no namespace's address does, so without is_host every agent waits as a client."""
        out = []
        for a in cmd:
            if a.startswith("--rdzv-conf="):
                a = f"{a},is_host={'true' if node == 0 else 'false'}"
            out.append(a)
            if a.endswith(AGENT_MODULES):  # torchrun's options follow its module
                out.append(f"--local-addr={self.address(node)}")
        return ["ip", "netns", "exec", self.namespace(node), *out]


def plan(run_dir: Path, nnodes: int) -> Network:
    """Pure: the names and addresses of a run's network."""
    if nnodes > 250:
        raise UserError("job.network = netns: at most 250 nodes", where="job.network")
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).digest()
    return Network(digest[:3].hex()[:5], f"10.213.{digest[3]}", nnodes)


def check() -> None:
    """Namespaces need root and iproute2: say so before anything starts."""
    if os.geteuid() != 0:
        raise UserError(
            'job.network = "netns" needs root (network namespaces)', where="job.network"
        )
    if shutil.which("ip") is None:
        raise UserError('job.network = "netns" needs iproute2 (`ip`)', where="job.network")


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def up(net: Network) -> None:
    down(net)  # leftovers of a killed supervisor of the same run
    _ip("link", "add", net.bridge, "type", "bridge")
    _ip("link", "set", net.bridge, "up")
    for i in range(net.nnodes):
        ns, host = net.namespace(i), net.host_link(i)
        _ip("netns", "add", ns)
        _ip("link", "add", host, "type", "veth", "peer", "name", IFNAME, "netns", ns)
        _ip("link", "set", host, "master", net.bridge, "up")
        _ip("-n", ns, "addr", "add", f"{net.address(i)}/24", "dev", IFNAME)
        _ip("-n", ns, "link", "set", IFNAME, "up")
        _ip("-n", ns, "link", "set", "lo", "up")


def down(net: Network) -> None:
    """Remove the namespaces (their veths go with them) and the bridge; what is gone is fine."""
    for i in range(net.nnodes):
        subprocess.run(["ip", "netns", "del", net.namespace(i)], capture_output=True)
    subprocess.run(["ip", "link", "del", net.bridge], capture_output=True)


def set_link(net: Network, node: int, state: str) -> None:
    """`up` or `down`: connect or cut one node (its namespace and processes live on)."""
    _ip("link", "set", net.host_link(node), state)
