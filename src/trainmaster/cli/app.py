"""The `trainmaster` command: the typer app and the one place where errors become exit codes.

Bad input (UserError) -> one line on stderr, exit 2, no traceback (`--debug` shows it);
a failed job or tool -> exit 1; usage errors (unknown option, missing argument) -> exit 2.
"""

from __future__ import annotations

import sys

import typer

from trainmaster import __version__
from trainmaster.cli import compile_cmd, job_cmd, monitor_cmd
from trainmaster.cli.cluster_cmd import cluster_app
from trainmaster.cli.config_cmd import config_app, init
from trainmaster.cli.data_cmd import data_app
from trainmaster.cli.demo_cmd import demo
from trainmaster.errors import EXIT_BAD_INPUT, EXIT_FAILED, JobFailed, UserError

app = typer.Typer(
    name="trainmaster",
    help="Multi-node BERT pretraining on EKS (Trainium, GPUs) and on one machine, from one job file.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command()(demo)
app.command()(init)
app.add_typer(config_app, name="config")
app.command()(compile_cmd.precompile)
app.command()(job_cmd.launch)
app.command("list")(job_cmd.list_jobs)
app.command()(job_cmd.status)
app.command()(job_cmd.logs)
app.command()(job_cmd.cancel)
app.command()(monitor_cmd.top)
app.command()(monitor_cmd.tensorboard)
app.command()(monitor_cmd.report)
app.add_typer(data_app, name="data")
app.add_typer(cluster_app, name="cluster")
app.add_typer(compile_cmd.cache_app, name="cache")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"trainmaster {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit"),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors"),
) -> None:
    """trainmaster: one job file, the same torchrun command line locally and on Kubernetes."""


def _err(message: str) -> None:
    sys.stderr.write(f"error: {' '.join(message.split())}\n")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # `--dry-run=server` (kubectl's spelling) selects the API server's dry run.
    args = ["--dry-run-server" if a == "--dry-run=server" else "--dry-run" if a == "--dry-run=client" else a
            for a in args]
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
