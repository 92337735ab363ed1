"""The processes of a local run, found through /proc: each node agent's worker children.

torchrun starts workers in sessions of their own, so signalling an agent's process group does
not reach them; `cancel` and the tools find them here, by the RANK torchrun put in their
environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainmaster.run import state


@dataclass
class Worker:
    rank: int
    local_rank: int
    node: int
    pid: int


def workers(st: state.RunState) -> list[Worker]:
    """Live worker processes of a local run: the children of each node's agent, by their RANK."""
    found = []
    for node in st.nodes:
        if not state.pid_alive(node.pid, node.start_time):
            continue
        for child in _children(node.pid or 0):
            env = _environ(child)
            if "RANK" in env and "LOCAL_RANK" in env:
                found.append(Worker(int(env["RANK"]), int(env["LOCAL_RANK"]), node.index, child))
    return sorted(found, key=lambda w: w.rank)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}
