"""Options shared by several commands, declared once.

--storage, --backend, --kubeconfig, --context and --namespace are the root command's (app.py),
stored in ctx.obj as an api.Target; a command reads them with target(ctx).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from trainmaster import api, files
from trainmaster.errors import UserError

if TYPE_CHECKING:
    from trainmaster.compile import lock

SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="SECTION.KEY=VALUE",
        help="Override a job-file value, typed as TOML (repeatable), e.g. --set train.batch_size=8",
    ),
]
StorageOpt = Annotated[
    str | None,
    typer.Option(
        "--storage",
        metavar="PATH",
        help="Storage root; else job.storage, else $TRAINMASTER_STORAGE, else ./trainmaster-data",
    ),
]
JobArg = Annotated[
    str,
    typer.Argument(
        metavar="JOB",
        help="Job name (job.name of its job file), or the handle `launch` printed: local://JOB, kubernetes://NAMESPACE/JOB",
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print it as JSON (the fields of backends/base.py JobStatus)")
]
JobFileArg = Annotated[
    str, typer.Argument(metavar="FILE", help="A job file (TOML); make one with `trainmaster init`")
]
BackendOpt = Annotated[
    str | None,
    typer.Option(
        "--backend",
        metavar="local|kubernetes",
        help="Where the job runs (default: job.backend for commands that read a job file; $TRAINMASTER_BACKEND or local otherwise)",
    ),
]
KubeconfigOpt = Annotated[
    str | None, typer.Option(help="kubernetes: kubeconfig file (else $KUBECONFIG, ~/.kube/config)")
]
ContextOpt = Annotated[
    str | None, typer.Option(help="kubernetes: kubeconfig context (else the current one)")
]
NamespaceOpt = Annotated[
    str | None,
    typer.Option(help="kubernetes: namespace (else kubernetes.namespace / the context's)"),
]
WaitLockOpt = Annotated[
    float,
    typer.Option(
        "--wait-lock",
        metavar="SECONDS",
        min=0,
        help="Compile jobs: how long to wait while another job uses the cacheset (then fail)",
    ),
]


def lock_waiting(cacheset: str, wait_s: float) -> Callable[[lock.Holder], None]:
    """What `launch` and `precompile` say while another job holds the cacheset's lock."""

    def say(holder: lock.Holder) -> None:
        typer.echo(
            f"waiting up to {wait_s:g} s: compile cache {cacheset} is in use by "
            f"{holder.describe()}",
            err=True,
        )

    return say


ImageOpt = Annotated[
    str | None, typer.Option(help="kubernetes: training image (else kubernetes.image)")
]


def write_output(path: Path, text: str, *, option: str) -> None:
    """Write a file the user named with OPTION whole or not at all (files.write_atomic: a
    temporary beside it, renamed over it), so a full disk or a Ctrl-C never leaves half a job
    file; a path the system refuses is the user's to fix, so it is a UserError, not a trace."""
    try:
        files.write_atomic(path, text)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {_why(exc, path)}", where=option) from exc


def _why(exc: OSError, path: Path) -> str:
    """What the system said, and the fix."""
    if isinstance(exc, IsADirectoryError) or path.is_dir():
        return "it is a folder; name a file (one inside it, say)"
    if isinstance(exc, FileNotFoundError):
        return f"no folder {path.parent}; create it first, or name a file in an existing folder"
    return f"{exc.strerror or exc}; name a file in a folder you can write to"


def target(ctx: typer.Context) -> api.Target:
    """The global options of this invocation (the root callback's ctx.obj)."""
    obj = ctx.find_root().obj
    return obj if isinstance(obj, api.Target) else api.Target()
