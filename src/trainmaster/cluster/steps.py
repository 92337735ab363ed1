"""A step of building or taking down the cluster, as data, and the command that resizes it.

One list of steps drives three things: runbook.sh (each step a shell function), `cluster up`
(runs them with progress, skipping what exists, resuming after a failure) and `--dry-run`
(prints them); plan.json carries the lists from `cluster plan` to `cluster up`. A step is a few
shell lines plus an optional check that exits 0 when the step's work is already done. The lists
are upsteps.py (with servicesteps.py) and downsteps.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Step:
    id: str
    title: str
    commands: tuple[str, ...]
    check: str | None = None  # exits 0 when the work is done already
    tools: tuple[str, ...] = field(default=("aws",))
    echo: bool = False  # show the step's output (what it tells the user), not only its log

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"commands": list(self.commands), "tools": list(self.tools)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Step:
        return cls(
            id=data["id"],
            title=data["title"],
            commands=tuple(data["commands"]),
            check=data.get("check"),
            tools=tuple(data.get("tools", ())),
            echo=bool(data.get("echo", False)),
        )


def helm_install(
    release: str,
    chart: str,
    version: str,
    repo_name: str,
    repo: str,
    values: str,
    namespace: str = "kube-system",
) -> tuple[str, ...]:
    """A pinned chart, waited for: the next step needs what it runs."""
    create = " --create-namespace" if namespace != "kube-system" else ""
    return (
        f"helm repo add {repo_name} {repo} --force-update",
        f"helm upgrade --install {release} {chart} --version {version} --namespace {namespace}"
        f'{create} --values "$PLAN_DIR/{values}" --wait --timeout 10m',
    )


def scale_command(cluster: str, region: str, nodegroup: str, nodes: int) -> list[str]:
    """Resize the accelerator node group (max stays >= 1: EKS refuses a maximum of 0)."""
    return [
        "eksctl",
        "scale",
        "nodegroup",
        "--cluster",
        cluster,
        "--region",
        region,
        "--name",
        nodegroup,
        "--nodes",
        str(nodes),
        "--nodes-min",
        str(nodes),
        "--nodes-max",
        str(max(nodes, 1)),
    ]
