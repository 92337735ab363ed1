"""The `trainmaster` command: the typer app and the one place where errors become exit codes.

Each invocation builds the app with the one command it runs (build, command_of), so that the
command's start-up pays for its own imports only; the root's --help and full() hold them all.

Bad input (UserError) -> one line on stderr, exit 2, no traceback (`--debug` shows it);
a failed job or tool -> exit 1; usage errors (unknown option, missing argument) -> exit 2.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any

import typer

from trainmaster import __version__, api
from trainmaster.cli.options import BackendOpt, ContextOpt, KubeconfigOpt, NamespaceOpt, StorageOpt
from trainmaster.errors import EXIT_BAD_INPUT, EXIT_FAILED, JobFailed, UserError

# Every command: (name, module, attribute, sub-app?, command settings), in the order they are
# registered (--help lists the commands, then the sub-apps, each in this order).
# A module is imported only when its command runs (or for the full --help): `launch` would
# otherwise pay for rich, yaml and every other command's imports before the job starts.
COMMANDS: tuple[tuple[str, str, str, bool, dict[str, Any]], ...] = (
    ("demo", "demo_cmd", "demo", False, {}),
    ("init", "config_cmd", "init", False, {}),
    ("config", "config_cmd", "config_app", True, {}),
    ("precompile", "compile_cmd", "precompile", False, {}),
    ("launch", "job_cmd", "launch", False, {"context_settings": {"allow_extra_args": True}}),
    ("list", "job_cmd", "list_jobs", False, {}),
    ("status", "job_cmd", "status", False, {}),
    ("logs", "job_cmd", "logs", False, {}),
    ("cancel", "job_cmd", "cancel", False, {}),
    ("top", "monitor_cmd", "top", False, {}),
    ("tensorboard", "monitor_cmd", "tensorboard", False, {}),
    ("report", "monitor_cmd", "report", False, {}),
    ("estimate", "estimate_cmd", "estimate", False, {}),
    ("data", "data_cmd", "data_app", True, {}),
    ("cluster", "cluster_cmd", "cluster_app", True, {}),
    ("node", "node_cmd", "node_app", True, {}),
    ("cache", "compile_cmd", "cache_app", True, {}),
    ("export", "export_cmd", "export_app", True, {}),
)
NAMES = frozenset(c[0] for c in COMMANDS)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"trainmaster {__version__}")
        raise typer.Exit()


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


def build(names: frozenset[str] = NAMES) -> typer.Typer:
    """The app with the root options and the commands in names (all: the full --help)."""
    app = typer.Typer(
        name="trainmaster",
        help="Multi-node BERT pretraining on EKS (Trainium, GPUs) and on one machine, from one job file.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
        epilog="The options above (--storage, --backend, --kubeconfig, --context, --namespace) "
        "apply to every command and may also follow it: trainmaster status demo --storage ./data",
    )
    app.callback()(_root)
    for name, module, attr, group, settings in COMMANDS:
        if name in names:
            obj = getattr(importlib.import_module(f"trainmaster.cli.{module}"), attr)
            if group:
                app.add_typer(obj, name=name)
            else:
                app.command(name, **settings)(obj)
    return app


@functools.cache
def full() -> typer.Typer:
    """The app with every command (what tests and tools that inspect the CLI see)."""
    return build()


def command_of(args: list[str]) -> str | None:
    """The command args run (after hoist_global_options), or None where the root speaks
    (--help, --version, no or an unknown command): then every command is loaded."""
    i = 0
    while i < len(args):
        a = args[i]
        if a in GLOBAL_OPTIONS:
            i += 2
        elif a.split("=", 1)[0] in GLOBAL_OPTIONS or a == "--debug":
            i += 1
        elif a.startswith("-"):
            return None
        else:
            return a if a in NAMES else None
    return None


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
        name = command_of(args)
        app = build(frozenset({name}) if name else NAMES)
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
