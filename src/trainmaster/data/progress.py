"""Progress of `data prepare` on stderr: a rich bar on a terminal, plain lines in logs.

A bar in a CI log or a pipe is noise (and control characters), so without a TTY we print
one line when a stage starts and at most one every few seconds; --quiet prints nothing.
Stage lines start with "prepare:" so scripts and tests can wait for them.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class Reporter:
    """Silent; the base of the others."""

    def stage(self, name: str, total: int) -> None:
        """A new stage of `total` steps begins (the previous one is complete)."""

    def advance(self, steps: int = 1, tokens: int = 0) -> None:
        """Steps of the current stage are done, having consumed `tokens` input tokens."""

    def close(self) -> None:
        """The run ended, either way."""


class LineReporter(Reporter):
    def __init__(self, stream: TextIO | None = None, every_s: float = 5.0) -> None:
        self._out = stream or sys.stderr
        self._every = every_s
        self._name, self._total, self._done, self._tokens = "", 0, 0, 0
        self._start = self._last = time.monotonic()

    def _print(self, text: str) -> None:
        self._out.write(f"prepare: {text}\n")
        self._out.flush()

    def stage(self, name: str, total: int) -> None:
        self._name, self._total, self._done, self._tokens = name, total, 0, 0
        self._start = self._last = time.monotonic()
        self._print(f"{name} (0/{total})")

    def advance(self, steps: int = 1, tokens: int = 0) -> None:
        self._done += steps
        self._tokens += tokens
        now = time.monotonic()
        if now - self._last >= self._every:
            self._last = now
            rate = self._tokens / max(now - self._start, 1e-9)
            extra = f", {rate:,.0f} tokens/s" if self._tokens else ""
            self._print(f"{self._name} ({self._done}/{self._total}{extra})")


class RichReporter(Reporter):
    def __init__(self, console: Console | None = None) -> None:
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console or Console(stderr=True),
            transient=False,
        )
        self._task: TaskID | None = None
        self._tokens = 0
        self._start = time.monotonic()
        self._progress.start()

    def stage(self, name: str, total: int) -> None:
        if self._task is not None:
            self._progress.update(self._task, completed=self._progress.tasks[-1].total)
        self._task = self._progress.add_task(name, total=total, rate="")
        self._tokens, self._start = 0, time.monotonic()

    def advance(self, steps: int = 1, tokens: int = 0) -> None:
        if self._task is None:
            return
        self._tokens += tokens
        rate = self._tokens / max(time.monotonic() - self._start, 1e-9)
        self._progress.update(
            self._task, advance=steps, rate=f"{rate:,.0f} tokens/s" if self._tokens else ""
        )

    def close(self) -> None:
        self._progress.stop()


def make_reporter(quiet: bool) -> Reporter:
    if quiet:
        return Reporter()
    if sys.stderr.isatty():
        return RichReporter()
    return LineReporter()
