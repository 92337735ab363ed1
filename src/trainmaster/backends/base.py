"""The one interface every backend implements (the TorchX Scheduler model).

    backend = api.backend(target, cfg)      # chosen once, in api.py
    dry = backend.plan(cfg)                 # every check, nothing started
    print(dry.render())                     # --dry-run: the commands / every object as YAML
    backend.submit(dry)                     # start it; then status, logs, cancel, list

A backend returns data, never prints: `status` is a View (lines and tables) and `list` a Grid,
which the CLI prints the same way for every backend, so no command asks which backend it has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from trainmaster.compile import lock
from trainmaster.config import JobConfig

BACKEND_NAMES = ("local", "kubernetes")


@dataclass(frozen=True)
class Target:
    """Where jobs run and where their files are: the CLI's global options (its ctx.obj)."""

    storage: str | None = None
    backend: str | None = None  # local | kubernetes; None: job.backend, else $TRAINMASTER_BACKEND
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None


@dataclass(frozen=True)
class Line:
    text: str
    markup: bool = False  # the text holds rich markup ([bold]); else it is printed verbatim


@dataclass(frozen=True)
class Grid:
    """A table: column titles and rows of cells, all text."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class View:
    """A job's status: the blocks `status` prints in order, and what `--follow` needs."""

    job: str
    phase: str
    blocks: tuple[Line | Grid, ...]
    message: str = ""
    step: int | None = None  # the newest metrics row's step, when there is one
    max_steps: int | None = None
    info: str = ""  # one line of progress (loss, seq/s, restarts)


@dataclass(frozen=True)
class DryRun:
    """What submit() will start, fully checked; render() is what `--dry-run` prints."""

    job: str
    backend: str
    purpose: str  # train | precompile
    notes: tuple[str, ...]  # said on stderr before it runs (e.g. what a precompile will do)

    def render(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Submitted:
    job: str
    lines: tuple[str, ...]  # for stdout: what started, and how to follow it
    notes: tuple[str, ...] = ()  # for stderr (e.g. whether the compile cache is warm)
    result: dict[str, Any] | None = None  # a precompile the backend awaited: its outcome


@dataclass(frozen=True)
class LogStream:
    source: str | None  # what the text comes from, when it is worth saying (a pod)
    chunks: Iterator[str]  # text with its newlines, as it arrives


Waiting = Callable[[lock.Holder], None]


class Backend(Protocol):
    name: str

    def plan(self, cfg: JobConfig, *, resume: bool = False, image: str | None = None,
             wait_lock_s: float = 0.0, precompile_steps: int | None = None) -> DryRun:
        """Every check that needs no side effect (UserError naming the field); precompile_steps:
        the job's precompile job (compile/precompile.py) instead of the job."""
        ...

    def submit(self, dry_run: DryRun, *, server_dry_run: bool = False, on_wait: Waiting | None = None,
               on_start: Callable[[str], None] | None = None) -> Submitted:
        """Start what plan() checked. server_dry_run: have the backend's server check it, start
        nothing. A precompile plan is awaited where the backend can (local), else submitted."""
        ...

    def status(self, job: str) -> View: ...

    def logs(self, job: str, *, rank: int | None, node: int | None, follow: bool) -> LogStream: ...

    def cancel(self, job: str, *, grace_s: float) -> str:
        """Stop the job; returns one line saying what happened."""
        ...

    def list(self) -> Grid: ...

    def top(self, job: str, *, interval_s: float, say: Callable[[str], None]
            ) -> tuple[Callable[[], Any], float]:
        """(a sampler returning a rich table, or None once the job ended; the pause between samples)."""
        ...

    def tensorboard(self, job: str | None, *, host: str, port: int, announce: Callable[[str], None]) -> None: ...
