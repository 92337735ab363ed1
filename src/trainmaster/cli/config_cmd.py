"""`trainmaster init` and `trainmaster config validate|show`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainmaster import api
from trainmaster.cli.options import JobFileArg, SetOpt, target, write_output
from trainmaster.config.job import ETCD_VERSIONS
from trainmaster.errors import UserError

config_app = typer.Typer(
    help="Check a job file and show its resolved and derived values.", no_args_is_help=True
)
out = Console()


def init(
    preset: Annotated[
        str, typer.Option(help=f"One of: {', '.join(api.JOB_PRESETS)}")
    ] = "local-cpu",
    out_file: Annotated[
        Path | None, typer.Option("--out", metavar="FILE", help="Write here instead of stdout")
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace FILE if it exists")] = False,
    overrides: SetOpt = None,
) -> None:
    """Write a commented job file for a preset (every key, with its meaning)."""
    text = api.init_job(preset, overrides)
    if out_file is None:
        typer.echo(text, nl=False)
        return
    # a folder is no file to --force over: write_output refuses it, saying so
    if out_file.exists() and not out_file.is_dir() and not force:
        raise UserError("exists; pass --force to replace it", where=str(out_file))
    write_output(out_file, text, option="--out")
    typer.echo(
        f"wrote {out_file} (preset {preset}); next: trainmaster config show {out_file}", err=True
    )


@config_app.command()
def validate(file: JobFileArg, overrides: SetOpt = None) -> None:
    """Check a job file; exit 0 when it is valid, 2 with the field and the fix when not."""
    cfg = api.load_job(file, overrides)
    d = cfg.derived
    typer.echo(
        f"{file}: valid (world size {d.world_size}, gradient accumulation {d.grad_accum}, "
        f"hash {d.config_hash})"
    )
    if cfg.rendezvous.backend in ("etcd", "etcd-v2"):
        # Said at validation, not found at the first rendezvous: torch's etcd rendezvous speaks
        # etcd's v2 API, which etcd 3.6 removed (pytorch/pytorch issues 158326 and 170707).
        typer.echo(
            f"note: rendezvous.backend = {cfg.rendezvous.backend} works with {ETCD_VERSIONS}; "
            "rendezvous.backend = c10d needs no etcd"
        )


@config_app.command()
def show(
    ctx: typer.Context,
    file: JobFileArg,
    overrides: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON")] = False,
) -> None:
    """Print the resolved job: every value, the derived values and the config hash."""
    info = api.describe(api.load_job(file, overrides), target(ctx).storage)
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    for section, values in info["config"].items():
        table = Table(
            title=escape(f"[{section}]"), title_justify="left", show_header=False, box=None
        )
        for key, value in values.items():
            table.add_row(key, "[dim]unset[/dim]" if value is None else json.dumps(value))
        out.print(table)
    d = info["derived"]
    inst = d["instance"]
    table = Table(title="derived", title_justify="left", show_header=False, box=None)
    rows = [
        (
            "world size",
            f"{d['world_size']} ({info['config']['job']['nnodes']} nodes x "
            f"{info['config']['job']['nproc_per_node']} workers)",
        ),
        ("gradient accumulation", str(d["grad_accum"])),
        (
            "global batch",
            f"{info['config']['train']['global_batch_size']} sequences, "
            f"{d['tokens_per_step']} tokens per step",
        ),
        ("model", ", ".join(f"{k} {v}" for k, v in d["model"].items())),
        (
            "node type",
            f"{inst['name']}: {inst['devices']} x {inst['accelerator']}, "
            f"{inst['vcpu']} vCPU, {inst['memory_gib']} GiB, ${inst['price_per_hour']}/h",
        ),
        *_stack_row(inst["accelerator"], info["config"]["train"]["device"]),
        ("storage", d["storage"]),
        ("dataset", d["dataset_path"]),
        ("config hash", d["config_hash"]),
    ]
    for key, value in rows:
        table.add_row(key, value)
    out.print(table)


def _stack_row(accelerator: str, device: str) -> list[tuple[str, str]]:
    """Trainium's training stack: trn1's frozen PyTorch/XLA, or TorchNeuron's beta."""
    from trainmaster.cluster import versions

    if accelerator == "trainium1" or device == "xla":
        return [("training stack", versions.FROZEN_XLA_NOTE)]
    if device == "neuron" or accelerator.startswith("trainium"):
        return [
            (
                "training stack",
                f"{versions.TORCHNEURON_BETA}: torch-neuronx "
                f"{versions.TORCHNEURON_VERSION}, Trn2/Trn3 only",
            )
        ]
    return []
