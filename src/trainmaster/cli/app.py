"""The `trainmaster` command: the typer app and the one place where errors become exit codes.

Bad input (UserError) -> one line on stderr, exit 2, no traceback (`--debug` shows it);
a failed job or tool -> exit 1; usage errors (unknown option, missing argument) -> exit 2.
"""

from __future__ import annotations

import sys

import typer

from trainmaster import __version__, api
from trainmaster.cli import compile_cmd, job_cmd, monitor_cmd
from trainmaster.cli.cluster_cmd import cluster_app
from trainmaster.cli.config_cmd import config_app, init
from trainmaster.cli.data_cmd import data_app
from trainmaster.cli.demo_cmd import demo
from trainmaster.cli.estimate_cmd import estimate
from trainmaster.cli.export_cmd import export_app
from trainmaster.cli.node_cmd import node_app
from trainmaster.cli.options import BackendOpt, ContextOpt, KubeconfigOpt, NamespaceOpt, StorageOpt
from trainmaster.errors import EXIT_BAD_INPUT, EXIT_FAILED, JobFailed, UserError

app = typer.Typer(
    name="trainmaster",
    help="Multi-node BERT pretraining on EKS (Trainium, GPUs) and on one machine, from one job file.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="The options above (--storage, --backend, --kubeconfig, --context, --namespace) apply "
    "to every command and may also follow it: trainmaster status demo --storage ./data",
)
app.command()(demo)
app.command()(init)
app.add_typer(config_app, name="config")
app.command()(compile_cmd.precompile)
app.command(context_settings={"allow_extra_args": True})(job_cmd.launch)
app.command("list")(job_cmd.list_jobs)
app.command()(job_cmd.status)
app.command()(job_cmd.logs)
app.command()(job_cmd.cancel)
app.command()(monitor_cmd.top)
app.command()(monitor_cmd.tensorboard)
app.command()(monitor_cmd.report)
app.command()(estimate)
app.add_typer(data_app, name="data")
app.add_typer(cluster_app, name="cluster")
app.add_typer(node_app, name="node")
app.add_typer(compile_cmd.cache_app, name="cache")
app.add_typer(export_app, name="export")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"trainmaster {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit"
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors"),
    storage: StorageOpt = None,
    backend: BackendOpt = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """trainmaster: one job file, the same torchrun command line locally and on Kubernetes.

    --storage, --backend, --kubeconfig, --context and --namespace apply to every command and
    may stand before or after it: `trainmaster status demo --storage ./data`.
    """
    ctx.obj = api.Target(
        storage=storage,
        backend=backend,
        kubeconfig=kubeconfig,
        context=context,
        namespace=namespace,
    )


# The root's options that may also be written after the command (where users put them).
GLOBAL_OPTIONS = ("--storage", "--backend", "--kubeconfig", "--context", "--namespace")


def hoist_global_options(args: list[str]) -> list[str]:
    """Move the global options (with their values) in front of the command, where click looks
    for the root's options; everything after `--` stays as it is."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            rest += args[i:]
            break
        name = a.split("=", 1)[0]
        if name in GLOBAL_OPTIONS and ("=" in a or i + 1 < len(args)):
            taken = [a] if "=" in a else [a, args[i + 1]]
            front += taken
            i += len(taken)
            continue
        rest.append(a)
        i += 1
    return front + rest


def _err(message: str) -> None:
    sys.stderr.write(f"error: {' '.join(message.split())}\n")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # `--dry-run=server` (kubectl's spelling) selects the API server's dry run.
    args = [
        "--dry-run-server"
        if a == "--dry-run=server"
        else "--dry-run"
        if a == "--dry-run=client"
        else a
        for a in args
    ]
    args = hoist_global_options(args)
    debug = "--debug" in args
    try:
        result = app(args=args, prog_name="trainmaster", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.TyperException as exc:  # usage errors: unknown option, missing argument, ...
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        _err(f"{message} (see `trainmaster --help`)")
        return int(getattr(exc, "exit_code", EXIT_BAD_INPUT))
    except (typer.Abort, KeyboardInterrupt):
        _err("interrupted")
        return 130
    except UserError as exc:
        if debug:
            raise
        _err(str(exc))
        return EXIT_BAD_INPUT
    except JobFailed as exc:
        if debug:
            raise
        _err(str(exc))
        return EXIT_FAILED
