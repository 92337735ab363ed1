"""state.json of a run: what was started, where, and how it ended.

Written by `launch` and by the run's supervisor, read and updated by `status` and `cancel`
from any shell. Every update is a read-modify-write under an flock on state.json.lock and an
atomic replace, so concurrent writers never lose an update and a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from trainmaster.pids import pid_alive as pid_alive  # re-exported: callers use state.pid_alive

Phase = Literal["pending", "running", "succeeded", "failed", "cancelled"]
FINAL: tuple[str, ...] = ("succeeded", "failed", "cancelled")


class NodeState(BaseModel):
    index: int
    pid: int | None = None  # the torchrun agent; its process group id is the same
    exit_code: int | None = None
    log: str = ""


class RunState(BaseModel):
    job: str
    backend: str = "local"
    phase: Phase = "pending"
    config_hash: str = ""
    nnodes: int = 1
    nproc_per_node: int = 1
    rendezvous: dict[str, str] = Field(default_factory=dict)
    supervisor_pid: int | None = None
    etcd_pid: int | None = None
    nodes: list[NodeState] = Field(default_factory=list)
    created_at: float = Field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    cancel_requested: bool = False
    message: str = ""


def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    with _lock_path(path).open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read(path: Path) -> RunState:
    return RunState.model_validate_json(path.read_text(encoding="utf-8"))


def write(path: Path, state: RunState) -> None:
    with locked(path):
        write_atomic(path, state.model_dump_json(indent=2))


def update(path: Path, **changes: Any) -> RunState:
    """Apply changes under the lock; a final phase is never overwritten by a later writer."""
    with locked(path):
        current = read(path)
        if current.phase in FINAL and "phase" in changes:
            changes.pop("phase")
        data = current.model_dump() | changes
        new = RunState.model_validate(data)
        write_atomic(path, new.model_dump_json(indent=2))
        return new


def observed(path: Path) -> RunState:
    """The state as recorded, corrected for processes that died without updating it.

    A run whose phase says running but whose supervisor is gone (killed, machine rebooted) is
    failed: nobody is left to finish it. The correction is written back so every reader agrees.
    """
    state = read(path)
    if state.phase in ("pending", "running") and not pid_alive(state.supervisor_pid):
        alive = [n.index for n in state.nodes if pid_alive(n.pid)]
        if not alive:
            msg = "the supervisor and all node agents are gone without recording an end"
            return update(path, phase="failed", finished_at=time.time(), message=msg)
    return state


def dumps(state: RunState) -> dict[str, Any]:
    return json.loads(state.model_dump_json())
