"""cgroup v1 subtrees for the real nodes: one per node, in every mounted hierarchy.

Each real node (kube_nodes.py) lives in /trainmaster-<node> of each hierarchy: its containerd
and kubelet are put there before they exec (enter(), run in the child), containerd's shims
inherit it, and the kubelet, whose cgroupRoot it is, puts every pod under it
(/trainmaster-<node>/kubepods/...). So the whole node is one subtree, which the freezer can
stop at once: kill() freezes it, so that nothing forks or exits while the list of its processes
is read, SIGKILLs every one, and thaws it so that the signals are delivered. This machine mounts
the v1 controllers (cpu, cpuacct, cpuset, memory, devices, freezer, blkio, pids, name=systemd)
beside an empty v2 "unified" hierarchy; all of them get the subtree, as runc and the kubelet
create their cgroups in each.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PREFIX = "trainmaster-"  # node real-1's cgroup is /trainmaster-real-1


def hierarchies() -> list[Path]:
    """The mounted hierarchies (ROOT/cpu, ROOT/memory, ..., ROOT/unified)."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    return [
        Path(fields[1])
        for fields in (line.split() for line in mounts)
        if fields[2] in ("cgroup", "cgroup2") and fields[1].startswith(f"{ROOT}/")
    ]


def path(node: str) -> str:
    """The node's cgroup, as the kubelet's cgroupRoot names it."""
    return f"/{PREFIX}{node}"


def available() -> str | None:
    """Why real nodes cannot have cgroups here, or None."""
    names = {h.name for h in hierarchies()}
    missing = {"freezer", "memory", "cpu", "cpuset", "pids"} - names
    return f"cgroup v1 controllers not mounted under {ROOT}: {sorted(missing)}" if missing else None


def create(node: str) -> None:
    for h in hierarchies():
        d = h / path(node).lstrip("/")
        d.mkdir(exist_ok=True)
        if h.name == "cpuset":  # a v1 cpuset cgroup takes no process until it has cpus and mems
            for f in ("cpuset.cpus", "cpuset.mems"):
                (d / f).write_text((h / f).read_text())


def enter(node: str) -> None:
    """Move the calling process into the node's cgroup in every hierarchy (a Popen preexec_fn:
    the child joins before it execs, so nothing it starts can begin outside)."""
    pid = str(os.getpid())
    for h in hierarchies():
        (h / path(node).lstrip("/") / "cgroup.procs").write_text(pid)


def _dirs(node: str, hierarchy: Path) -> list[Path]:
    """The node's cgroup and all below it in one hierarchy, deepest first."""
    top = hierarchy / path(node).lstrip("/")
    if not top.is_dir():
        return []
    found = [Path(d) for d, _, _ in os.walk(top)]
    return sorted(found, key=lambda d: len(d.parts), reverse=True)


def pids(node: str) -> list[int]:
    """Every process in the node's subtree (the freezer hierarchy holds them all)."""
    out: list[int] = []
    for d in _dirs(node, ROOT / "freezer"):
        with contextlib.suppress(OSError):
            out += [int(p) for p in (d / "cgroup.procs").read_text().split()]
    return out


def _wait(done: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)  # the kernel freezes or reaps asynchronously: poll, bounded
    return True


def kill(node: str, timeout: float = 20.0) -> int:
    """SIGKILL every process of the node, none escaping: freeze, signal, thaw. Returns how many
    were killed; raises TimeoutError if some outlive TIMEOUT."""
    freezer = ROOT / "freezer" / path(node).lstrip("/")
    if not freezer.is_dir():
        return 0
    state = freezer / "freezer.state"
    state.write_text("FROZEN")
    # FREEZING until every task stopped; a task in uninterruptible sleep may hold it there, and
    # SIGKILL still reaches the frozen ones once thawed, so a slow freeze is not an error
    _wait(lambda: state.read_text().strip() == "FROZEN", 5.0)
    victims = pids(node)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    state.write_text("THAWED")
    if not _wait(lambda: not pids(node), timeout):
        raise TimeoutError(f"processes of {node} still alive after SIGKILL: {pids(node)}")
    return len(victims)


def remove(node: str) -> None:
    """rmdir the (empty) subtree in every hierarchy, deepest first."""
    for h in hierarchies():
        for d in _dirs(node, h):
            with contextlib.suppress(OSError):
                d.rmdir()


def nodes_present() -> list[str]:
    """Nodes whose subtree exists (a plane that crashed may have left them)."""
    freezer = ROOT / "freezer"
    if not freezer.is_dir():
        return []
    return sorted(d.name[len(PREFIX) :] for d in freezer.iterdir() if d.name.startswith(PREFIX))
