"""`trainmaster estimate FILE`: time to train, node-hours and cost per node count, before launch.

Registered by app.py as a plain function. The figures and their sources are in
trainmaster.estimate and trainmaster.catalog; here: options, the table, --json. The
storage root (for --from-run and --measure's dataset) is the global --storage, read from the
root callback (options.target); this command is the same for every backend.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from trainmaster import api
from trainmaster.cli.options import JobFileArg, SetOpt, target
from trainmaster.errors import UserError
from trainmaster.estimate import figures, rates
from trainmaster.estimate.spot import spot_price
from trainmaster.monitor import cost
from trainmaster.storage import Storage

out = Console()


def estimate(
    ctx: typer.Context,
    file: JobFileArg,
    nodes: Annotated[
        str,
        typer.Option("--nodes", metavar="N,N,...", help="Node counts to estimate, comma-separated"),
    ] = figures.DEFAULT_NODES,
    rate: Annotated[
        float | None,
        typer.Option(
            "--rate",
            metavar="SEQ_PER_S_PER_NODE",
            help="One node's training rate (sequences/s), e.g. measured elsewhere; default: the catalog's published figure for the instance type",
        ),
    ] = None,
    from_run: Annotated[
        str | None,
        typer.Option(
            "--from-run",
            metavar="JOB",
            help="Use the rate a finished run of the same shape measured (its summary.json, under the storage root: --storage, job.storage, $TRAINMASTER_STORAGE)",
        ),
    ] = None,
    measure: Annotated[
        bool,
        typer.Option(
            "--measure",
            help="Run the job here for --measure-steps steps (local jobs) and use the rate it measures",
        ),
    ] = False,
    measure_steps: Annotated[
        int,
        typer.Option(
            "--measure-steps",
            min=3,
            max=100_000,
            help="Steps of the --measure run (the first is left out of the rate)",
        ),
    ] = 20,
    spot: Annotated[
        bool,
        typer.Option(
            "--spot",
            help="Price the node-hours at EC2's Spot price now (the highest of cluster.region's zones; AWS credentials needed), as a Spot node group pays; the default when the job file sets cluster.spot. [cluster] price_per_hour still wins",
        ),
    ] = False,
    overrides: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the estimate as JSON")] = False,
) -> None:
    """Time to train (max_steps x global batch), node-hours and cost for each node count, from a measured, given or published rate and published scaling."""
    counts = figures.parse_nodes(nodes)
    if sum((rate is not None, from_run is not None, measure)) > 1:
        raise UserError("give one of --rate, --from-run and --measure", where="--rate")
    if rate is not None and not 0 < rate < math.inf:
        raise UserError(
            f"{rate} is not a rate; give one node's sequences per second, above 0", where="--rate"
        )
    cfg = api.load_job(file, overrides)
    store = Storage.at(target(ctx).storage, cfg.job.storage)
    if rate is not None:
        one = figures.Rate(rate, "given", "--rate")
    elif from_run is not None:
        one = rates.rate_of_run(store, from_run, cfg)
    elif measure:
        one = rates.measure(
            Path(file),
            list(overrides or []),
            cfg,
            store,
            measure_steps,
            lambda line: typer.echo(line, err=True),
        )
    else:
        one = rates.published_rate(cfg)
    priced = None
    if (spot or cfg.cluster.spot) and cfg.cluster.price_per_hour is None:
        priced = spot_price(cfg)
    result = figures.estimate(cfg, one, counts, priced)
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2))
        return
    out.print(table(result))
    out.print(f"one node: {one.per_node:,.2f} seq/s, {one.basis} ({one.source})", soft_wrap=True)
    out.print(f"scaling: {result.scaling}", soft_wrap=True)
    out.print(
        f"price: {cost.money(result.price_per_node_hour)}/node-hour ({result.price_source})",
        soft_wrap=True,
    )
    for line in result.assumptions:
        out.print(f"assumed: {line}", soft_wrap=True)


def table(e: figures.Estimate) -> Table:
    t = Table(
        "nodes",
        "workers",
        "accum",
        "seq/worker/step",
        "efficiency",
        "seq/s",
        "time to train",
        "node-hours",
        "cost",
        "notes",
        title=f"estimate {e.job}: {e.sequences:,} sequences on {e.instance} (rate: {e.rate.basis})",
    )
    for r in e.rows:
        t.add_row(
            f"{r.nodes:,}",
            f"{r.workers:,}",
            "-" if r.grad_accum is None else str(r.grad_accum),
            _num(r.per_worker) + (" *" if r.below_published else ""),
            f"{r.efficiency:.1%} ({r.efficiency_basis})",
            f"{r.seq_per_s:,.1f}",
            cost.duration(r.time_s),
            _num(r.node_hours),
            cost.money(r.cost),
            "; ".join(r.notes),
        )
    return t


def _num(value: float) -> str:
    """1,234 / 35.7 / 0.25: three significant digits below 100."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
