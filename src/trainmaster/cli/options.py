"""Options shared by several commands, declared once.

--storage, --backend, --kubeconfig, --context and --namespace are the root command's (app.py),
stored in ctx.obj as an api.Target; a command reads them with target(ctx).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from trainmaster import api

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


def target(ctx: typer.Context) -> api.Target:
    """The global options of this invocation (the root callback's ctx.obj)."""
    obj = ctx.find_root().obj
    return obj if isinstance(obj, api.Target) else api.Target()
