"""Mid-save hooks for the checkpoint writer tests. The writer process gets its hooks pickled,
so they are functions of a module it can import, not closures of a test."""

from __future__ import annotations

from pathlib import Path

HELD = "in-write"  # next to the checkpoints folder: the step a held write is at
RELEASE = "release"  # a FIFO there: a held write goes on when the test opens it for writing


class Crash(Exception):
    pass


def crash_at(target: int, folder: Path, step: int) -> None:
    if step == target:
        raise Crash(f"disk full at step {step}")


def hold_at(target: int, folder: Path, step: int) -> None:
    """Stop the write of step `target` half-way until the test releases it (a blocking read of
    a FIFO, no polling)."""
    if step == target:
        (folder.parent / HELD).write_text(str(step))
        with open(folder.parent / RELEASE, encoding="utf-8") as f:
            f.read()
