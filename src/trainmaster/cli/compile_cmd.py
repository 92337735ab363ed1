"""`trainmaster precompile JOB.toml` and `trainmaster cache list | show | clear`.

The lead registers them: `app.command()(compile_cmd.precompile)` and
`app.add_typer(compile_cmd.cache_app, name="cache")`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from trainmaster import api
from trainmaster.cli.options import ImageOpt, JobFileArg, SetOpt, WaitLockOpt, lock_waiting, target
from trainmaster.compile import cache, fingerprint, lock
from trainmaster.compile import precompile as pre_mod
from trainmaster.errors import UserError
from trainmaster.storage import Storage

out = Console()
cache_app = typer.Typer(
    help="Look at and clear the shared compile caches (STORAGE/cache/).", no_args_is_help=True
)
CachesetArg = Annotated[str, typer.Argument(metavar="CACHESET", help="A cacheset (train.cacheset)")]


def _say(text: str) -> None:
    typer.echo(text, err=True)


def precompile(
    ctx: typer.Context,
    file: JobFileArg,
    overrides: SetOpt = None,
    steps: Annotated[
        int, typer.Option(help="Steps of the precompile run (train.steps_this_run)")
    ] = pre_mod.DEFAULT_STEPS,
    wait_lock: WaitLockOpt = 0.0,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print what would run (local: the commands; kubernetes: the objects as YAML)",
        ),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="A precompile awaited to its end (local): print the outcome as JSON"
        ),
    ] = False,
    image: ImageOpt = None,
) -> None:
    """Fill the job's compile cache: the same job, a few steps, in compile mode, on its backend."""
    where = target(ctx)
    cfg = api.load_job_for(file, overrides, where)
    if not cfg.train.compile:
        _say(
            f"note: train.compile is off in {file}: `launch` uses this cache only with "
            "--set train.compile=true (or compile = true in [train])"
        )
    backend = api.backend(where, cfg, api.LaunchOptions(image=image))
    dry = backend.plan(cfg, wait_lock_s=wait_lock, precompile_steps=steps)
    for note in dry.notes:
        _say(note)
    if dry_run:
        typer.echo(dry.render(), nl=False)
        return
    sub = backend.submit(dry, on_wait=lock_waiting(cfg.train.cacheset, wait_lock), on_start=_say)
    for line in sub.lines:
        typer.echo(line)
    if sub.result is None:  # submitted, not awaited: `status` follows it
        return
    if as_json:
        typer.echo(json.dumps(sub.result, indent=2))
        return
    result = sub.result
    counts = result["compile_counters"]
    entries = ", ".join(f"{k} {v}" for k, v in result["entries"].items()) or "none"
    first = result["time_to_first_step_s"]
    typer.echo(
        f"compile cache warm ({cfg.train.cacheset}) for {cfg.job.name}: fingerprint "
        f"written, entries {entries}"
        + (f"; first step after {first:.1f} s" if isinstance(first, (int, float)) else "")
    )
    if counts:
        typer.echo(
            f"  compiler: {counts.get('fxgraph_cache_miss', 0)} FX graph(s) compiled, "
            f"{counts.get('fxgraph_cache_hit', 0)} found in the cache"
        )
    typer.echo(f"  next: trainmaster launch {file} (with train.compile = true)")


# --- cache list | show | clear ------------------------------------------------------------------


def _root(storage: str | None) -> Path:
    return Storage.at(storage).caches


def _folder(storage: str | None, name: str) -> Path:
    folder = Storage.at(storage).cache_dir(name)
    if not folder.is_dir():
        known = (
            sorted(p.name for p in _root(storage).iterdir() if p.is_dir())
            if _root(storage).is_dir()
            else []
        )
        raise UserError(
            f"no cacheset {name!r} under {_root(storage)}"
            f"{'; cachesets: ' + ', '.join(known) if known else ' (no cachesets yet)'}",
            where="CACHESET",
        )
    return folder


def _size(n: int) -> str:
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"


def _lock_text(folder: Path) -> str:
    current = lock.read(folder)
    if current is None:
        return "free"
    holder, mtime = current
    stale = lock.stale_reason(holder, mtime)
    return f"stale ({stale}): {holder.describe()}" if stale else f"in use by {holder.describe()}"


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


@cache_app.command("list")
def list_caches(ctx: typer.Context) -> None:
    """The cachesets under STORAGE/cache: size, compiled entries, whose graphs, lock."""
    root = _root(target(ctx).storage)
    table = Table("cacheset", "size", "entries", "filled by", "lock")
    for folder in sorted(root.iterdir() if root.is_dir() else []):
        if not folder.is_dir():
            continue
        saved = fingerprint.read(folder)
        entries = ", ".join(f"{k} {v}" for k, v in cache.entries(folder).items()) or "-"
        table.add_row(
            folder.name,
            _size(cache.size_bytes(folder)),
            entries,
            f"{saved.job} ({_when(saved.written_at)})" if saved else "-",
            _lock_text(folder),
        )
    out.print(table)


@cache_app.command()
def show(
    ctx: typer.Context,
    name: CachesetArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON")] = False,
) -> None:
    """A cacheset: where, size, entries per compiler, its fingerprint, its lock."""
    folder = _folder(target(ctx).storage, name)
    saved = fingerprint.read(folder)
    current = lock.read(folder)
    data: dict[str, Any] = {
        "cacheset": name,
        "path": str(folder),
        "size_bytes": cache.size_bytes(folder),
        "entries": cache.entries(folder),
        "fingerprint": saved.to_json() if saved else None,
        "lock": None
        if current is None
        else {
            "holder": dataclasses.asdict(current[0]),
            "heartbeat": current[1],
            "stale": lock.stale_reason(*current),
        },
    }
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    out.print(f"[bold]{name}[/bold]  {folder}  {_size(data['size_bytes'])}", highlight=False)
    out.print(f"  entries: {', '.join(f'{k} {v}' for k, v in data['entries'].items()) or 'none'}")
    out.print(f"  lock: {_lock_text(folder)}", markup=False, highlight=False)
    if saved is None:
        out.print("  fingerprint: none (nothing compiled by a trainmaster job yet)")
        return
    out.print(
        f"  fingerprint: written by job {saved.job} on {saved.host}, {_when(saved.written_at)}",
        markup=False,
        highlight=False,
    )
    table = Table("field", "value")
    for key, value in saved.fields.items():
        table.add_row(key, "-" if value is None else str(value))
    out.print(table)


@cache_app.command()
def clear(
    ctx: typer.Context,
    name: CachesetArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask")] = False,
) -> None:
    """Delete a cacheset (refused while a job uses it)."""
    folder = _folder(target(ctx).storage, name)
    if not yes:
        if not sys.stdin.isatty():
            raise UserError(f"this deletes {folder}; pass --yes to confirm", where="cache clear")
        typer.confirm(f"delete {folder} ({_size(cache.size_bytes(folder))})?", abort=True)
    try:
        held = lock.acquire(folder, job="cache-clear", purpose="clear")
    except UserError as exc:
        raise UserError(
            f"compile cache {name} is {_lock_text(folder)}; clear it after that job has ended",
            where="CACHESET",
        ) from exc
    try:
        for entry in folder.iterdir():
            if entry.name == lock.FILE:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    finally:
        held.release()
    with contextlib.suppress(OSError):  # a job that started meanwhile keeps its new folder
        folder.rmdir()
    typer.echo(f"cleared {name} ({folder})")
