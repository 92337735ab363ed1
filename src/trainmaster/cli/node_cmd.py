"""`trainmaster node list | clear NODE`: the nodes a training pod marked unhealthy.

A pod whose node fails a check taints it `trainmaster.io/unhealthy` before the job restarts, so
the restarted gang lands elsewhere (cluster/nodeguard.py). `clear` removes the mark once the
node is repaired (or replaced: a new node never carries it). Kubernetes only.
"""

from __future__ import annotations

import typer

from trainmaster import api
from trainmaster.cli.options import target

node_app = typer.Typer(
    help="Nodes marked unhealthy by trainmaster (Kubernetes)", no_args_is_help=True
)


@node_app.command("list")
def list_marks(ctx: typer.Context) -> None:
    """Every node marked unhealthy: why, since when, by which job."""
    found = api.node_marks(target(ctx))
    for m in found:
        typer.echo(f"{m.line()} (job {m.job})")
    if not found:
        typer.echo("no node is marked unhealthy")


@node_app.command()
def clear(ctx: typer.Context, node: str = typer.Argument(..., metavar="NODE")) -> None:
    """Remove trainmaster's unhealthy mark (taint and annotations) from NODE."""
    if api.clear_node_mark(target(ctx), node):
        typer.echo(f"{node}: mark cleared; new pods may land on it again")
    else:
        typer.echo(f"{node}: not marked")
