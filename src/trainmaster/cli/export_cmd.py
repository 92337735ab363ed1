"""`trainmaster export torchx FILE | checkpoint JOB DEST`: a job for `torchx run`; a checkpoint out of the run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trainmaster import api
from trainmaster.cli.options import ImageOpt, JobArg, JobFileArg, SetOpt, target, write_output
from trainmaster.errors import UserError
from trainmaster.export import torchx
from trainmaster.storage import RunPaths, Storage

export_app = typer.Typer(
    help="Write a job for another launcher, or copy a checkpoint out of a run.",
    no_args_is_help=True,
)


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
    write_output(out, text, option="--out")
    fn = cfg.job.name.replace("-", "_")
    typer.echo(
        f"wrote {out}; run it with `torchx run -s kubernetes -cfg queue={cfg.kubernetes.queue} "
        f"{out}:{fn} --image IMAGE`"
    )


@export_app.command("checkpoint")
def checkpoint(
    ctx: typer.Context,
    job: JobArg,
    dest: Annotated[str, typer.Argument(metavar="DEST", help="A folder, or s3://BUCKET/PREFIX")],
    step: Annotated[
        int | None, typer.Option(help="This step's checkpoint (default: the newest)")
    ] = None,
) -> None:
    """Copy a run's newest complete checkpoint to DEST/JOB/step_N (a folder or S3), verified
    file by file against SHA-256 sums; keep results before `cluster down` deletes the storage."""
    from trainmaster.run import export

    where = target(ctx)
    backend, name = api.backend_for_job(where, job)
    if backend.name != "local":
        raise UserError(
            "kubernetes jobs keep their checkpoints on the cluster's FSx, where this machine "
            "cannot read them; copy them from a pod (kubectl cp) before `cluster down`",
            where="JOB",
        )
    run = RunPaths(Storage.at(where.storage).run_dir(name))
    if not run.state.exists():
        raise UserError(f"no job {name!r} under {run.dir.parent}; check --storage", where="JOB")
    ckpt = export.choose(run, step)
    if dest.startswith("s3://"):
        from trainmaster.cluster import aws

        url = f"{dest.rstrip('/')}/{name}/{ckpt.name}"
        want = export.manifest(name, ckpt)
        count = aws.s3_put_tree(ckpt, url, export.MANIFEST, want)
        typer.echo(f"{url}: {count} file(s), each checked by S3 against its SHA-256")
        return
    final = export.to_folder(name, ckpt, Path(dest))
    typer.echo(f"{final}: {len(export.manifest(name, ckpt)['files'])} file(s), verified")
