"""`trainmaster top | tensorboard | report`: watch a running job, browse its curves, sum a run up.

Registered by app.py as plain functions (`app.command()(monitor_cmd.top)` ...). The work is in
trainmaster.monitor (top, top_k8s, tensorboard, report); here: options, printing, exit codes.
"""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from trainmaster.cli.k8s_cmd import backend_of, connect
from trainmaster.cli.options import (
    BackendOpt,
    ContextOpt,
    JobArg,
    KubeconfigOpt,
    NamespaceOpt,
    StorageOpt,
)
from trainmaster.errors import UserError
from trainmaster.launch import state
from trainmaster.monitor import report as report_mod
from trainmaster.monitor import tensorboard as tb
from trainmaster.monitor import top as top_mod
from trainmaster.storage import Storage

out = Console()


def top(
    job: JobArg,
    once: Annotated[bool, typer.Option("--once", help="Print one table and exit")] = False,
    interval: Annotated[float, typer.Option(help="Seconds per refresh (the CPU % sampling window, locally)")] = 1.0,
    storage: StorageOpt = None,
    backend: BackendOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """A live table per node and rank: CPU, memory and accelerator use (GPU via NVML / nvidia-smi, NeuronCores via neuron-monitor)."""
    if not 0.1 <= interval <= 3600:
        raise UserError(f"{interval} is not between 0.1 and 3600 seconds", where="--interval")
    if backend_of(backend) == "kubernetes":
        from trainmaster.monitor import top_k8s

        cluster = connect(kubeconfig, context, namespace)

        def sample_k8s() -> Table | None:  # the first call fails clearly: no job, no running pods
            rows = top_k8s.k8s_rows(cluster, job)
            stamp = time.strftime("%H:%M:%S")
            return top_mod.table(rows, f"{job}  (kubernetes, namespace {cluster.namespace})  {stamp}")

        top_mod.watch(sample_k8s, once, interval, out.print, Live)
        return
    store = Storage.at(storage)
    top_mod.running_state(store, job)  # no such job / not running: exit 2 before sampling

    def sample_local() -> Table | None:
        st = state.observed(store.run_dir(job) / "state.json")
        if st.phase in state.FINAL:
            out.print(f"{job}: {st.phase}")
            return None
        rows = top_mod.local_rows(st, interval)
        title = f"{job}  ({st.phase}, {st.nnodes} node(s) x {st.nproc_per_node})  {time.strftime('%H:%M:%S')}"
        note = "" if rows else "no worker processes yet (the job is starting)"
        return top_mod.table(rows, title, " ".join(filter(None, [top_mod.host_line(), note])))

    top_mod.watch(sample_local, once, 0.0, out.print, Live)


def tensorboard(
    job: Annotated[str | None, typer.Argument(metavar="[JOB]", help="One job's events (default: every run)")] = None,
    port: Annotated[int, typer.Option(help="Local port")] = tb.DEFAULT_PORT,
    host: Annotated[str, typer.Option(help="Address to listen on (local backend); 0.0.0.0 exposes it to the network")] = "127.0.0.1",
    storage: StorageOpt = None,
    backend: BackendOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Serve TensorBoard on a run's (or every run's) events until Ctrl-C; kubernetes: port-forward to the cluster's TensorBoard."""
    def announce(url: str) -> None:
        typer.echo(f"TensorBoard: {url}")

    if backend_of(backend) == "kubernetes":
        cluster = connect(kubeconfig, context, namespace)
        tb.serve_k8s(cluster, port, kubeconfig, context, announce, job)
        return
    tb.serve_local(Storage.at(storage), job, host, port, announce)


def report(job: JobArg, storage: StorageOpt = None) -> None:
    """Sum a run up: steps, wall time, seq/s, MFU, restarts, compile cache, estimated cost; writes runs/JOB/report.png (loss, learning rate, throughput)."""
    rep = report_mod.make_report(Storage.at(storage), job)
    table = Table("", "", show_header=False, title=f"report {job}")
    for key, value in rep.rows():
        table.add_row(key, value)
    out.print(table)
