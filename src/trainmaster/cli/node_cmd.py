"""`trainmaster node list | clear NODE`: the nodes a training pod marked unhealthy.

A pod whose node fails a check taints it `trainmaster.io/unhealthy` before the job restarts, so
the restarted gang lands elsewhere (cluster/nodeguard.py). `clear` removes the mark once the
node is repaired (or replaced: a new node never carries it). Kubernetes only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from trainmaster.cli.options import target

if TYPE_CHECKING:
    from trainmaster.backends.kubernetes.client import Cluster

node_app = typer.Typer(
    help="Nodes marked unhealthy by trainmaster (Kubernetes)", no_args_is_help=True
)


def _cluster(ctx: typer.Context) -> Cluster:
    from trainmaster.backends.kubernetes.client import connect

    where = target(ctx)
    return connect(where.kubeconfig, where.context, where.namespace)


@node_app.command("list")
def list_marks(ctx: typer.Context) -> None:
    """Every node marked unhealthy: why, since when, by which job."""
    from trainmaster.backends.kubernetes import nodemark

    found = nodemark.marks(_cluster(ctx))
    for m in found:
        typer.echo(f"{m.line()} (job {m.job})")
    if not found:
        typer.echo("no node is marked unhealthy")


@node_app.command()
def clear(ctx: typer.Context, node: str = typer.Argument(..., metavar="NODE")) -> None:
    """Remove trainmaster's unhealthy mark (taint and annotations) from NODE."""
    from trainmaster.backends.kubernetes import nodemark

    if nodemark.clear(_cluster(ctx), node):
        typer.echo(f"{node}: mark cleared; new pods may land on it again")
    else:
        typer.echo(f"{node}: not marked")
