"""`trainmaster launch | list | status | logs | cancel`: one code path for every backend.

Each command asks api.backend() for the backend of this invocation (the global options in
ctx.obj, for launch the job file, and for the others the job's handle) and talks to the
Backend interface (backends/base.py); what comes back is printed by cli/show.py.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from trainmaster import api
from trainmaster.backends.base import Backend
from trainmaster.cli.options import (
    ImageOpt,
    JobArg,
    JsonOpt,
    SetOpt,
    WaitLockOpt,
    lock_waiting,
    target,
    write_output,
)
from trainmaster.errors import JobFailed, UserError


def launch(
    ctx: typer.Context,
    file: Annotated[
        str,
        typer.Argument(
            metavar="FILE|SCRIPT.py",
            help="A job file (TOML; make one with `trainmaster init`), or a Python script to run with defaults (arguments for it after --)",
        ),
    ],
    overrides: SetOpt = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print what would run (local: the commands; kubernetes: every object as YAML); --dry-run=server has the API server check the objects",
        ),
    ] = False,
    dry_run_server: Annotated[bool, typer.Option("--dry-run-server", hidden=True)] = False,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Show progress until the job ends")
    ] = False,
    resume: Annotated[
        bool,
        typer.Option(
            help="Continue an existing job from its last checkpoint (one not there yet starts "
            "from step 0, so a retried launch needs no check first)"
        ),
    ] = False,
    wait_lock: WaitLockOpt = 0.0,
    image: ImageOpt = None,
    nnodes: Annotated[int | None, typer.Option(min=1, help="SCRIPT.py: nodes (default 1)")] = None,
    nproc_per_node: Annotated[
        int | None, typer.Option(min=1, help="SCRIPT.py: workers per node (default 1)")
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(help="SCRIPT.py: the job name (default: the script's, plus a suffix)"),
    ] = None,
    save_job: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="SCRIPT.py: write the job file of this launch once its checks pass (with --dry-run too: a job file without launching)",
        ),
    ] = None,
) -> None:
    """Start a job: one torchrun agent per node, each worker running the job's entrypoint.

    `trainmaster launch train.py --nnodes 2 -- --lr 3e-4` runs a script without a job file
    (local, c10d) and prints the job file it used; `--save-job job.toml` writes it."""
    where = target(ctx)
    if file.endswith(".py"):
        _one_way({"--nnodes": (nnodes, "job.nnodes"), "--name": (name, "job.name"),
                  "--nproc-per-node": (nproc_per_node, "job.nproc_per_node")}, overrides)  # fmt: skip
        cfg = api.script_job(file, list(ctx.args), nnodes=nnodes or 1,
                             nproc_per_node=nproc_per_node or 1, name=name, overrides=overrides)  # fmt: skip
        if save_job is None:
            typer.echo("# the job file of this launch (--save-job FILE writes it):\n"
                       + api.script_job_text(cfg), err=True)  # fmt: skip
    else:
        script_only = {"--nnodes": nnodes, "--nproc-per-node": nproc_per_node, "--name": name,
                       "--save-job": save_job}  # fmt: skip
        given = [k for k, v in script_only.items() if v is not None] + (
            ["ARGS"] if ctx.args else []
        )
        if given:
            raise UserError(f"{given[0]} is for a script launched without a job file; with a job "
                            "file, use --set (e.g. --set job.nnodes=2)", where=given[0])  # fmt: skip
        cfg = api.load_job_for(file, overrides, where)
    backend = api.backend(where, cfg, api.LaunchOptions(resume=resume, image=image))
    dry = backend.plan(cfg, wait_lock_s=wait_lock)
    if save_job is not None:  # checked, so the file names a job that can run; before submit(),
        # so a path the system refuses stops the launch before anything starts
        write_output(save_job, api.script_job_text(cfg), option="--save-job")
    if dry_run and not dry_run_server:
        _saved(save_job, launched=False)
        typer.echo(dry.render(), nl=False)
        return
    sub = backend.submit(
        dry,
        server_dry_run=dry_run_server,
        on_wait=lock_waiting(cfg.train.cacheset, wait_lock),
        on_note=lambda text: typer.echo(text, err=True),
    )
    for note in sub.notes:  # e.g. train.compile: is the cacheset warm (after precompile) or cold
        typer.echo(note, err=True)
    for line in sub.lines:
        typer.echo(line)
    _saved(save_job, launched=not dry_run_server)
    if follow and not dry_run_server:
        follow_job(backend, sub.job)


def _one_way(options: dict[str, tuple[object, str]], overrides: list[str] | None) -> None:
    """A script's option given both as itself and as --set would leave one silently unused."""
    for option, (value, key) in options.items():
        if value is not None and any(o.split("=", 1)[0].strip() == key for o in overrides or []):
            raise UserError(f"also set by --set {key}=...; pass one of the two", where=option)


def _saved(save_job: Path | None, *, launched: bool) -> None:
    """What to do with the job file --save-job wrote. After a launch it names a job that now
    exists, so launching it as it is would be refused (job exists): say what works."""
    if save_job is None:
        return
    if not launched:
        typer.echo(f"wrote {save_job}: `trainmaster launch {save_job}` runs this job", err=True)
        return
    typer.echo(
        f"wrote {save_job}: `trainmaster launch {save_job} --resume` continues this job; "
        "change job.name in it for a new one",
        err=True,
    )


def follow_job(backend: Backend, job: str) -> None:
    """A progress bar until the job ends; JobFailed (exit 1) unless it succeeded."""
    # rich here and in list/status, not at the top: a plain `launch` starts its job without it
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[steps]}"),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=False,
    ) as bar:
        task = bar.add_task(job, total=None, steps="", info="starting")
        while True:
            v = backend.status(job)
            steps = (
                ""
                if v.step is None
                else f"{v.step}/{v.max_steps} steps"
                if v.max_steps
                else f"step {v.step}"
            )
            bar.update(task, total=v.max_steps, completed=v.step or 0, steps=steps, info=v.info)
            if v.phase.final:
                break
            time.sleep(1.0)  # refreshing a display of another process's progress
    if v.phase != "succeeded":
        raise JobFailed(f"job {job} {v.phase}: {v.message or 'see trainmaster logs ' + job}")


def list_jobs(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List the jobs (local: under the storage root; kubernetes: trainmaster's Volcano jobs), newest first."""
    from trainmaster.cli import show

    show.jobs(api.backend(target(ctx)).list(), as_json)


def status(ctx: typer.Context, job: JobArg, as_json: JsonOpt = False) -> None:
    """Phase, nodes, ranks, restarts, last step, loss, seq/s and ETA of a job (--json: as data)."""
    from trainmaster.cli import show

    backend, name = api.backend_for_job(target(ctx), job)
    show.status(backend.status(name), as_json)


def logs(
    ctx: typer.Context,
    job: JobArg,
    rank: Annotated[int | None, typer.Option(help="Global rank (default 0)")] = None,
    node: Annotated[int | None, typer.Option(help="A node's agent log instead of a rank's")] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job ends")
    ] = False,
) -> None:
    """Print a rank's log (rank 0 by default), or a node agent's (kubernetes: a pod's)."""
    backend, name = api.backend_for_job(target(ctx), job)
    stream = backend.logs(name, rank=rank, node=node, follow=follow)
    if stream.source:
        typer.echo(stream.source, err=True)
    for chunk in stream.chunks:
        typer.echo(chunk, nl=False)


def cancel(
    ctx: typer.Context,
    job: JobArg,
    grace: Annotated[float, typer.Option(min=0, help="Seconds between SIGTERM and SIGKILL")] = 10.0,
) -> None:
    """Stop a job: SIGTERM to each node's process group, SIGKILL after the grace period (kubernetes: delete the Volcano job)."""
    backend, name = api.backend_for_job(target(ctx), job)
    typer.echo(backend.cancel(name, grace_s=grace))
