"""`trainmaster launch | list | status | logs | cancel` for the local backend."""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from trainmaster import api
from trainmaster.cli import k8s_cmd
from trainmaster.cli.compile_cmd import lock_waiting
from trainmaster.cli.k8s_cmd import backend_of
from trainmaster.cli.options import (
    BackendOpt,
    ContextOpt,
    JobArg,
    JobFileArg,
    KubeconfigOpt,
    NamespaceOpt,
    SetOpt,
    StorageOpt,
    WaitLockOpt,
)
from trainmaster.errors import JobFailed, UserError
from trainmaster.launch import state
from trainmaster.monitor import cost, runinfo
from trainmaster.monitor import logs as logs_mod
from trainmaster.storage import Storage

out = Console()


def launch(
    file: JobFileArg,
    overrides: SetOpt = None,
    storage: StorageOpt = None,
    backend: BackendOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would run (local: the commands; kubernetes: every object as YAML); --dry-run=server has the API server check the objects")] = False,
    dry_run_server: Annotated[bool, typer.Option("--dry-run-server", hidden=True)] = False,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Show progress until the job ends")] = False,
    resume: Annotated[bool, typer.Option(help="Continue an existing job from its last checkpoint")] = False,
    wait_lock: WaitLockOpt = 0.0,
    image: Annotated[str | None, typer.Option(help="kubernetes: training image (else kubernetes.image)")] = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Start a job: one torchrun agent per node, each worker running `python -m trainmaster.train`."""
    extra = [f'job.backend="{backend_of(backend)}"'] if backend else []
    extra += [f'kubernetes.namespace="{namespace}"'] if namespace else []
    cfg = api.load_job(file, [*(overrides or []), *extra])
    if cfg.job.backend == "kubernetes":
        mode = "server" if dry_run_server else "client" if dry_run else None
        if mode == "client":  # check what we print against Volcano's CRD: no cluster needed
            from trainmaster import schemas
            from trainmaster.launch import volcano

            schemas.check_objects(volcano.objects(cfg, image=image))
        k8s_cmd.launch(cfg, image=image, dry_run=mode, kubeconfig=kubeconfig, context=context)
        return
    store, plan = api.plan_launch(cfg, storage, resume=resume)
    if dry_run or dry_run_server:
        typer.echo(f"# job {cfg.job.name}: {cfg.job.nnodes} node(s) x {cfg.job.nproc_per_node} "
                   f"worker(s), rendezvous {plan.rdzv.backend} at {plan.rdzv.endpoint}")
        for i, cmd in enumerate(plan.commands):
            typer.echo(f"# node {i}\n{' '.join(cmd)}")
        return
    st = api.start_launch(cfg, store, dataclasses.replace(plan, lock_wait_s=wait_lock),
                          on_wait=lock_waiting(cfg.train.cacheset, wait_lock))
    if plan.compile_note:  # train.compile: is the cacheset warm (after precompile) or cold
        typer.echo(plan.compile_note, err=True)
    typer.echo(f"{st.job}  (runs in {plan.run.dir}; `trainmaster status {st.job}`, "
               f"`trainmaster logs {st.job} -f`)")
    if follow:
        follow_job(store, cfg.job.name, cfg.train.max_steps)


def follow_job(store: Storage, job: str, max_steps: int) -> None:
    """A progress bar until the job ends; JobFailed (exit 1) unless it succeeded."""
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                  TextColumn("{task.fields[info]}"), TimeRemainingColumn(), console=Console(stderr=True),
                  transient=False) as bar:
        task = bar.add_task(job, total=max_steps, info="starting")
        while True:
            s = runinfo.status(store, job)
            if s.last:
                bar.update(task, completed=int(s.last["step"]),
                           info=f"loss {s.last['loss']:.3f} {s.last['seq_per_s']:.1f} seq/s")
            if s.state.phase in state.FINAL:
                break
            time.sleep(1.0)  # refreshing a display of another process's progress
    if s.state.phase != "succeeded":
        raise JobFailed(f"job {job} {s.state.phase}: {s.state.message or 'see trainmaster logs ' + job}")


def list_jobs(storage: StorageOpt = None, backend: BackendOpt = None, kubeconfig: KubeconfigOpt = None,
              context: ContextOpt = None, namespace: NamespaceOpt = None) -> None:
    """List the jobs (local: under the storage root; kubernetes: trainmaster's Volcano jobs), newest first."""
    if backend_of(backend) == "kubernetes":
        k8s_cmd.list_jobs(k8s_cmd.connect(kubeconfig, context, namespace))
        return
    store = Storage.at(storage)
    table = Table("job", "phase", "nodes", "created", "step", "loss")
    rows = []
    for job in runinfo.list_jobs(store):
        s = runinfo.status(store, job)
        rows.append((s.state.created_at, job, s))
    for created, job, s in sorted(rows, key=lambda r: r[0], reverse=True):
        table.add_row(job, s.state.phase, f"{s.state.nnodes}x{s.state.nproc_per_node}",
                      datetime.fromtimestamp(created).strftime("%Y-%m-%d %H:%M"),
                      str(s.last["step"]) if s.last else "-", f"{s.last['loss']:.3f}" if s.last else "-")
    out.print(table)


def status(job: JobArg, storage: StorageOpt = None, backend: BackendOpt = None, kubeconfig: KubeconfigOpt = None,
           context: ContextOpt = None, namespace: NamespaceOpt = None) -> None:
    """Phase, nodes, ranks, restarts, last step, loss, seq/s and ETA of a job."""
    if backend_of(backend) == "kubernetes":
        k8s_cmd.status(k8s_cmd.connect(kubeconfig, context, namespace), job)
        return
    store = Storage.at(storage)
    s = runinfo.status(store, job)
    st = s.state
    out.print(f"[bold]{st.job}[/bold]  phase [bold]{st.phase}[/bold]  backend {st.backend}  "
              f"rendezvous {st.rendezvous.get('backend')} {st.rendezvous.get('endpoint')}")
    if st.message:
        out.print(f"  {st.message}")
    if s.last:
        out.print(f"  step {s.last['step']}/{s.max_steps}  loss {s.last['loss']:.4f}  "
                  f"{s.last['seq_per_s']:.1f} seq/s  restarts {s.restarts}")
    line = cost.progress_line(s, store)
    if line:
        out.print(line, markup=False, highlight=False)
    nodes = Table("node", "agent pid", "alive", "exit code", "log")
    for n in st.nodes:
        nodes.add_row(str(n.index), str(n.pid or "-"), "yes" if state.pid_alive(n.pid) else "no",
                      "-" if n.exit_code is None else str(n.exit_code), n.log)
    out.print(nodes)
    if s.workers:
        ranks = Table("rank", "node", "local rank", "pid")
        for w in s.workers:
            ranks.add_row(str(w.rank), str(w.node), str(w.local_rank), str(w.pid))
        out.print(ranks)
    if s.summary:
        out.print(f"  summary: {s.summary.get('status')}, {s.summary.get('steps')} steps, final loss "
                  f"{s.summary.get('final_loss')}, {s.summary.get('avg_seq_per_s')} seq/s average")


def logs(
    job: JobArg,
    rank: Annotated[int | None, typer.Option(help="Global rank (default 0)")] = None,
    node: Annotated[int | None, typer.Option(help="A node's agent log instead of a rank's")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends")] = False,
    storage: StorageOpt = None,
    backend: BackendOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Print a rank's log (rank 0 by default), or a node agent's (kubernetes: a pod's)."""
    if backend_of(backend) == "kubernetes":
        if rank not in (None, 0):
            raise UserError("kubernetes jobs: logs shows rank 0's pod or --node N's pod", where="--rank")
        k8s_cmd.logs(k8s_cmd.connect(kubeconfig, context, namespace), job, node, follow)
        return
    run = runinfo.run_paths(Storage.at(storage), job)
    path = logs_mod.log_file(run, rank, node)
    if follow:
        for line in logs_mod.follow(path, run):
            typer.echo(line, nl=False)
    else:
        typer.echo(path.read_text(encoding="utf-8", errors="replace"), nl=False)


def cancel(
    job: JobArg,
    grace: Annotated[float, typer.Option(help="Seconds between SIGTERM and SIGKILL")] = 10.0,
    storage: StorageOpt = None,
    backend: BackendOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Stop a job: SIGTERM to each node's process group, SIGKILL after the grace period (kubernetes: delete the Volcano job)."""
    if backend_of(backend) == "kubernetes":
        k8s_cmd.cancel(k8s_cmd.connect(kubeconfig, context, namespace), job)
        return
    asked = time.time()
    st = api.cancel_job(job, storage, grace)
    if st.phase in state.FINAL and st.finished_at is not None and st.finished_at < asked:
        # Ended before we asked: its pids may be other processes' by now, so nothing was signalled.
        typer.echo(f"{job}: already {st.phase}; nothing to cancel, nothing signalled")
        return
    typer.echo(f"{job}: {st.phase}")
