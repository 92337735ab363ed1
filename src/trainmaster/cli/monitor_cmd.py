"""`trainmaster top | tensorboard | report`: watch a running job, browse its curves, sum a run up.

Registered by app.py as plain functions (`app.command()(monitor_cmd.top)` ...). The work is in
trainmaster.monitor (top, tensorboard, report; on Kubernetes backends/kubernetes/top.py); here:
options, printing, exit codes.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from trainmaster import api
from trainmaster.backends.base import SupportsTensorBoard, SupportsTop
from trainmaster.cli.options import JobArg, target
from trainmaster.errors import UserError
from trainmaster.monitor import report as report_mod
from trainmaster.monitor import tensorboard as tb
from trainmaster.monitor import top as top_mod
from trainmaster.storage import Storage

out = Console()


def top(
    ctx: typer.Context,
    job: JobArg,
    once: Annotated[bool, typer.Option("--once", help="Print one table and exit")] = False,
    interval: Annotated[
        float, typer.Option(help="Seconds per refresh (the CPU % sampling window, locally)")
    ] = 1.0,
) -> None:
    """A live table per node and rank: CPU, memory and accelerator use (GPU via NVML / nvidia-smi, NeuronCores via neuron-monitor)."""
    if not 0.1 <= interval <= 3600:
        raise UserError(f"{interval} is not between 0.1 and 3600 seconds", where="--interval")
    backend, name = api.backend_for_job(target(ctx), job)
    if not isinstance(backend, SupportsTop):
        raise UserError(f"the {backend.name} backend cannot sample its workers", where="top")
    sample, pause = backend.top(name, interval_s=interval, say=out.print)
    top_mod.watch(sample, once, pause, out.print, Live)


def tensorboard(
    ctx: typer.Context,
    job: Annotated[
        str | None, typer.Argument(metavar="[JOB]", help="One job's events (default: every run)")
    ] = None,
    port: Annotated[int, typer.Option(help="Local port")] = tb.DEFAULT_PORT,
    host: Annotated[
        str,
        typer.Option(
            help="Address to listen on (local backend); 0.0.0.0 exposes it to the network"
        ),
    ] = "127.0.0.1",
) -> None:
    """Serve TensorBoard on a run's (or every run's) events until Ctrl-C; kubernetes: port-forward to the cluster's TensorBoard."""

    def announce(url: str) -> None:
        typer.echo(f"TensorBoard: {url}")

    backend, name = (
        api.backend_for_job(target(ctx), job) if job else (api.backend(target(ctx)), None)
    )
    if not isinstance(backend, SupportsTensorBoard):
        raise UserError(f"the {backend.name} backend has no TensorBoard", where="tensorboard")
    backend.tensorboard(name, host=host, port=port, announce=announce)


def report(ctx: typer.Context, job: JobArg) -> None:
    """Sum a run up: steps, wall time, seq/s, MFU, restarts, compile cache, estimated cost; writes runs/JOB/report.png (loss, learning rate, throughput)."""
    rep = report_mod.make_report(Storage.at(target(ctx).storage), job)
    table = Table("", "", show_header=False, title=f"report {job}")
    for key, value in rep.rows():
        table.add_row(key, value)
    out.print(table)
