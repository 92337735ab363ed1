"""Printing what a backend returns (backends/base.py: View, Grid), the same for every backend."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from trainmaster.backends.base import Grid, Line, View

out = Console()


def grid(g: Grid) -> None:
    table = Table(*g.columns)
    for row in g.rows:
        table.add_row(*row)
    out.print(table)


def view(v: View) -> None:
    for block in v.blocks:
        if isinstance(block, Grid):
            grid(block)
        elif isinstance(block, Line):
            out.print(block.text, markup=block.markup, highlight=block.markup)
