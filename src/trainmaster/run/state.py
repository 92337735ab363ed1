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
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from trainmaster import files
from trainmaster.run.pids import pid_alive as pid_alive  # re-exported: callers use state.pid_alive
from trainmaster.run.pids import start_time as start_time
from trainmaster.storage import RunPaths

Phase = Literal["pending", "running", "succeeded", "failed", "cancelled"]
FINAL: tuple[str, ...] = ("succeeded", "failed", "cancelled")


class NodeState(BaseModel):
    index: int
    pid: int | None = None  # the torchrun agent; its process group id is the same
    start_time: int | None = None  # of pid (pids.start_time): a reused pid is not this agent
    exit_code: int | None = None
    log: str = ""
    # An elastic job's node lost and taken back (backends/local/rejoin.py): how often, and its
    # story for `status` ("lost at step 45 (SIGKILL), back at step 60").
    rejoins: int = 0
    note: str = ""


class RunState(BaseModel):
    job: str
    backend: str = "local"
    phase: Phase = "pending"
    config_hash: str = ""
    nnodes: int = 1
    nproc_per_node: int = 1
    rendezvous: dict[str, str] = Field(default_factory=dict)  # backend, endpoint, run_id
    storage: str = ""  # the storage root the run's workers use (absolute)
    private_etcd: bool = False  # the supervisor starts an etcd of its own for the rendezvous
    workdir: str | None = None  # where the agents run (the launching shell's folder)
    supervisor_pid: int | None = None
    supervisor_start: int | None = None  # pids.start_time of supervisor_pid
    etcd_pid: int | None = None
    etcd_start: int | None = None  # pids.start_time of etcd_pid
    nodes: list[NodeState] = Field(default_factory=list)
    created_at: float = Field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    cancel_requested: bool = False
    job_retries: int = 0  # whole-gang restarts after a lost node (backends/local/supervisor.py)
    message: str = ""

    @model_validator(mode="before")
    @classmethod
    def _older_files(cls, data: Any) -> Any:
        """state.json of older versions kept storage and private_etcd (as "true"/"false")
        inside the rendezvous dict; such a run still loads, status and cancel still work."""
        if not isinstance(data, dict) or not isinstance(data.get("rendezvous"), dict):
            return data
        rdzv = dict(data["rendezvous"])
        old_storage, old_private = rdzv.pop("storage", None), rdzv.pop("private_etcd", None)
        data = {**data, "rendezvous": rdzv}
        if old_storage is not None and "storage" not in data:
            data["storage"] = old_storage
        if old_private is not None and "private_etcd" not in data:
            data["private_etcd"] = str(old_private).lower() == "true"
        return data


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


def read(path: Path) -> RunState:
    return RunState.model_validate_json(path.read_text(encoding="utf-8"))


def write(path: Path, state: RunState) -> None:
    with locked(path):
        files.write_atomic(path, state.model_dump_json(indent=2))


def update(path: Path, **changes: Any) -> RunState:
    """Apply changes under the lock; a final phase is never overwritten by a later writer."""
    with locked(path):
        current = read(path)
        if current.phase in FINAL and "phase" in changes:
            changes.pop("phase")
        data = current.model_dump() | changes
        new = RunState.model_validate(data)
        files.write_atomic(path, new.model_dump_json(indent=2))
        return new


def supervisor_alive(state: RunState) -> bool:
    return pid_alive(state.supervisor_pid, state.supervisor_start)


def live_agents(state: RunState) -> list[int]:
    """The node agents of this run still running (start times checked: not a reused pid)."""
    return [n.pid for n in state.nodes if n.pid and pid_alive(n.pid, n.start_time)]


def live_processes(state: RunState) -> list[int]:
    """Every process of this run still running: supervisor, private etcd, node agents."""
    own = [(state.supervisor_pid, state.supervisor_start), (state.etcd_pid, state.etcd_start)]
    return [p for p, t in own if p and pid_alive(p, t)] + live_agents(state)


def summary_of_attempt(path: Path, state: RunState) -> bool:
    """True when this attempt's workers finished: rank 0 writes summary.json only at a normal
    end ("completed" at max_steps, "stopped" after train.steps_this_run, train/loop.py). One
    left by an earlier launch of the same job (older than this start) does not count."""
    summary = RunPaths(path.parent).summary
    try:
        mtime = summary.stat().st_mtime
        data = json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    started = state.started_at if state.started_at is not None else state.created_at
    return (
        mtime >= started
        and isinstance(data, dict)
        and data.get("status") in ("completed", "stopped")
    )


def stop_etcd(state: RunState) -> None:
    """Stop the run's private etcd, whoever sees the run end (supervisor, status, cancel)."""
    if state.etcd_pid and pid_alive(state.etcd_pid, state.etcd_start):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(state.etcd_pid, signal.SIGTERM)


def observed(path: Path) -> RunState:
    """The state as recorded, corrected for processes that died without updating it.

    A run whose phase says running but whose supervisor is gone (killed, machine rebooted) is
    over once its agents are gone too: nobody is left to finish it. The workers' own record
    decides how it ended (a summary.json of this attempt: succeeded), the
    private etcd it left is stopped, and the correction is written back so every reader agrees.
    """
    state = read(path)
    if (
        state.phase in ("pending", "running")
        and not supervisor_alive(state)
        and not live_agents(state)
    ):
        stop_etcd(state)
        if state.phase == "running" and summary_of_attempt(path, state):
            return update(
                path,
                phase="succeeded",
                finished_at=time.time(),
                message="the supervisor is gone; the workers completed the run",
            )
        msg = "the supervisor and all node agents are gone without recording an end"
        return update(path, phase="failed", finished_at=time.time(), message=msg)
    return state


def dumps(state: RunState) -> dict[str, Any]:
    return json.loads(state.model_dump_json())
