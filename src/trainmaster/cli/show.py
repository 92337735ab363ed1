"""Printing what a backend returns (backends/base.py: JobStatus), the same for every backend."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trainmaster.backends.base import JobStatus, NodeStatus

out = Console()

# The node table's columns: (title, cell). A column nobody fills (pids on Kubernetes, pods'
# hosts locally) is left out, so each backend's table shows what it knows.
NODE_COLUMNS = (
    ("node", lambda n: str(n.index)),
    ("pod", lambda n: n.name if not n.name.startswith("node-") else ""),
    ("state", lambda n: n.state),
    ("k8s node", lambda n: n.host or ""),
    ("agent pid", lambda n: str(n.pid) if n.pid else ""),
    ("restarts", lambda n: str(n.restarts) if n.restarts else ""),
    ("exit code", lambda n: "-" if n.exit_code is None else str(n.exit_code)),
    ("rank 0", lambda n: "yes" if n.rank0 else ""),
    ("log", lambda n: n.log),
)


def _table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    table = Table(*columns)
    for row in rows:
        table.add_row(*row)
    out.print(table)


def nodes(items: tuple[NodeStatus, ...]) -> None:
    cells = [[cell(n) for _, cell in NODE_COLUMNS] for n in items]
    keep = [
        i
        for i, (title, _) in enumerate(NODE_COLUMNS)
        if title in ("node", "state", "exit code") or any(row[i] for row in cells)
    ]
    _table(tuple(NODE_COLUMNS[i][0] for i in keep), [tuple(row[i] for i in keep) for row in cells])


def status(s: JobStatus, as_json: bool = False) -> None:
    if as_json:
        typer.echo(json.dumps(s.to_json(), indent=2))
        return
    words = "  ".join(f"{k} {escape(v)}" for k, v in s.details.items())
    out.print(
        f"[bold]{escape(s.job)}[/bold]  phase [bold]{s.phase}[/bold]  backend {s.backend}  {words}"
    )
    out.print(f"  {s.handle}", markup=False, highlight=False)
    if s.message:
        out.print(f"  {s.message}", markup=False, highlight=False)
    for note in s.notes:
        out.print(f"  {note}" if not note.startswith("[") else note, markup=False, highlight=False)
    if s.nodes:
        nodes(s.nodes)
    if s.workers:
        _table(
            ("rank", "node", "local rank", "pid"),
            [(str(w.rank), str(w.node), str(w.local_rank), str(w.pid)) for w in s.workers],
        )


def jobs(items: list[JobStatus], as_json: bool = False) -> None:
    if as_json:
        typer.echo(json.dumps([s.to_json() for s in items], indent=2))
        return
    _table(
        ("job", "phase", "backend", "nodes", "created", "step", "loss", "handle"),
        [
            (
                s.job,
                str(s.phase),
                s.backend,
                f"{s.nnodes}x{s.nproc_per_node}" if s.nproc_per_node else str(s.nnodes),
                s.created.replace("T", " ")[:16],
                "-" if s.step is None else str(s.step),
                "-" if s.loss is None else f"{s.loss:.3f}",
                s.handle,
            )
            for s in items
        ],
    )
