"""`trainmaster export torchx FILE`: the job for teams that launch with `torchx run`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainmaster import api
from trainmaster.cli.options import ImageOpt, JobFileArg, SetOpt, target
from trainmaster.export import torchx

export_app = typer.Typer(help="Write a job for another launcher.", no_args_is_help=True)


@export_app.command("torchx")
def torchx_component(
    ctx: typer.Context,
    file: JobFileArg,
    overrides: SetOpt = None,
    image: ImageOpt = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", metavar="FILE.py", help="Write the component here (default: print it)"
        ),
    ] = None,
) -> None:
    """A TorchX component (a Python file) whose role runs what the job's Volcano pods run: `torchx run -s kubernetes FILE.py:JOB`."""
    cfg = api.load_job_for(file, overrides, target(ctx))
    text = torchx.component(cfg, image=image)
    if out is None:
        typer.echo(text, nl=False)
        return
    out.write_text(text, encoding="utf-8")
    fn = cfg.job.name.replace("-", "_")
    typer.echo(
        f"wrote {out}; run it with `torchx run -s kubernetes -cfg queue={cfg.kubernetes.queue} "
        f"{out}:{fn} --image IMAGE`"
    )
