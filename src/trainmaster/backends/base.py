"""The one interface every backend implements (the TorchX Scheduler model).

    backend = api.backend(target, cfg)      # chosen once, in api.py
    dry = backend.plan(cfg)                 # every check, nothing started
    print(dry.render())                     # --dry-run: the commands / every object as YAML
    backend.submit(dry)                     # start it; then status, logs, cancel, list

A backend returns data, never prints: `status` is a JobStatus and `list` a list of them, which
the CLI prints (or dumps as JSON) the same way for every backend, so no command asks which
backend it has.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from trainmaster.compile import lock
from trainmaster.config import JobConfig
from trainmaster.errors import UserError

BACKEND_NAMES = ("local", "kubernetes")


@dataclass(frozen=True)
class Target:
    """Where jobs run and where their files are: the CLI's global options (its ctx.obj)."""

    storage: str | None = None
    backend: str | None = None  # local | kubernetes; None: job.backend, else $TRAINMASTER_BACKEND
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None


class Phase(StrEnum):
    """A job's phase, the same words on every backend (Volcano's phases map onto these)."""

    PENDING = "pending"
    RUNNING = "running"
    FINISHING = "finishing"  # the workers wrote their final summary; the launcher is wrapping up
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED)


@dataclass(frozen=True)
class NodeStatus:
    """One node of a job: a local torchrun agent, or a pod of the Volcano job."""

    index: int
    name: str  # local: "node-0"; kubernetes: the pod's name
    state: str  # local: running | exited; kubernetes: the pod's phase
    host: str | None = None  # kubernetes: the Kubernetes node the pod is bound to
    pid: int | None = None  # local: the agent's pid (its process group)
    exit_code: int | None = None
    restarts: int = 0  # kubernetes: container restarts of the pod
    rank0: bool = False  # the node or pod holding rank 0 (rank0.json; on kubernetes its record)
    log: str = ""  # local: the agent's log file
    reason: str = ""  # why it ended or waits (a container's terminated reason)


@dataclass(frozen=True)
class WorkerStatus:
    rank: int
    node: int
    local_rank: int
    pid: int


@dataclass(frozen=True)
class JobStatus:
    """Where a job stands, as data: `status` renders it, `status --json` prints it.

    Numbers a backend cannot know are None (a Kubernetes job's metrics live on the cluster's
    storage); `notes` are lines for people (progress bar, cost, hangs, summary) that the CLI
    prints under the header and tables."""

    job: str
    backend: str
    handle: str  # local://JOB or kubernetes://NAMESPACE/JOB: what every job command accepts
    phase: Phase
    message: str = ""  # why it ended (the failed node's error line), or what it waits for
    nnodes: int = 0
    nproc_per_node: int = 0
    created: str = ""  # ISO 8601
    nodes: tuple[NodeStatus, ...] = ()
    workers: tuple[WorkerStatus, ...] = ()
    restarts: int = 0  # every restart of the training: torchrun's and the gang's (job_retries)
    preemptions: int = 0  # SIGTERMs honoured with a checkpoint
    rollbacks: int = 0  # divergences rolled back to a checkpoint (run/divergence.py)
    rollback_steps_lost: int = 0  # the steps those rollbacks took back
    job_retries: int = 0  # whole-gang restarts by the launcher (local) or Volcano (kubernetes)
    step: int | None = None
    max_steps: int | None = None
    loss: float | None = None
    seq_per_s: float | None = None
    progress: float | None = None  # step / max_steps
    eta_s: float | None = None
    cost_so_far_usd: float | None = None
    cost_to_finish_usd: float | None = None
    hangs: tuple[str, ...] = ()  # the newest hangs the watchdogs reported, one line each
    goodput: float | None = None  # productive share of the wall time so far
    last_checkpoint: int | None = None  # step of the newest complete checkpoint
    details: dict[str, str] = field(
        default_factory=dict
    )  # backend words: rendezvous, namespace, ...
    metrics: dict[str, Any] = field(default_factory=dict)  # the newest metrics.jsonl row
    summary: dict[str, Any] | None = None  # summary.json once the workers wrote it
    notes: tuple[str, ...] = ()

    @property
    def info(self) -> str:
        """One line of progress for `launch --follow`."""
        parts = [f"{k} {v}" for k, v in self.details.items() if k != "rendezvous"]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4g}")
        return ", ".join([*parts, f"restarts {self.restarts}"])

    def to_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self), default=str))


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
    """What every backend does. Its own options (where its jobs live, and what only it
    understands: a local --resume, a Kubernetes --image) are given to its constructor, so plan()
    takes only what every backend means the same way."""

    name: str

    def handle(self, job: str) -> str:
        """The job's handle: `local://JOB`, `kubernetes://NAMESPACE/JOB`."""
        ...

    def plan(
        self, cfg: JobConfig, *, wait_lock_s: float = 0.0, precompile_steps: int | None = None
    ) -> DryRun:
        """Every check that needs no side effect (UserError naming the field); precompile_steps:
        the job's precompile job (compile/precompile.py) instead of the job."""
        ...

    def submit(
        self,
        dry_run: DryRun,
        *,
        server_dry_run: bool = False,
        on_wait: Waiting | None = None,
        on_start: Callable[[str], None] | None = None,
        on_note: Callable[[str], None] | None = None,
    ) -> Submitted:
        """Start what plan() checked. server_dry_run: have the backend's server check it, start
        nothing. A precompile plan is awaited where the backend can (local), else submitted.
        on_note hears why the submit waits, as it starts waiting (kubernetes: a cancelled job
        of the same name still being deleted)."""
        ...

    def status(self, job: str) -> JobStatus: ...

    def logs(self, job: str, *, rank: int | None, node: int | None, follow: bool) -> LogStream: ...

    def cancel(self, job: str, *, grace_s: float) -> str:
        """Stop the job; returns one line saying what happened."""
        ...

    def list(self) -> list[JobStatus]:
        """The jobs, newest first (status without the per-node details)."""
        ...


@runtime_checkable
class SupportsTop(Protocol):
    """A backend that can sample its workers' CPU, memory and accelerator use (`top`)."""

    def top(
        self, job: str, *, interval_s: float, say: Callable[[str], None]
    ) -> tuple[Callable[[], Any], float]:
        """(a sampler returning a rich table, or None once the job ended; the pause between samples)."""
        ...


@runtime_checkable
class SupportsTensorBoard(Protocol):
    """A backend that can serve its runs' TensorBoard events (`tensorboard`)."""

    def tensorboard(
        self, job: str | None, *, host: str, port: int, announce: Callable[[str], None]
    ) -> None: ...


# --- job handles: BACKEND://[NAMESPACE/]JOB -----------------------------------------------------


@dataclass(frozen=True)
class JobRef:
    """A job as the commands take it: a bare name (the backend from the options), or a handle
    that `launch` printed, which names the backend (and the namespace) itself."""

    job: str
    backend: str | None = None
    namespace: str | None = None


def parse_job(text: str) -> JobRef:
    scheme, sep, rest = text.partition("://")
    if not sep:
        return JobRef(text)
    if scheme not in BACKEND_NAMES:
        raise UserError(
            f"{text!r}: unknown backend {scheme!r} in the handle; use local://JOB or "
            "kubernetes://NAMESPACE/JOB",
            where="JOB",
        )
    parts = rest.split("/")
    if scheme == "local" and len(parts) == 1 and parts[0]:
        return JobRef(parts[0], "local")
    if scheme == "kubernetes" and len(parts) in (1, 2) and all(parts):
        return JobRef(parts[-1], "kubernetes", parts[0] if len(parts) == 2 else None)
    raise UserError(
        f"{text!r} is not a job handle; use local://JOB or kubernetes://NAMESPACE/JOB", where="JOB"
    )
