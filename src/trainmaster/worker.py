"""What a training script imports from trainmaster: cheap helpers, no torch, no pydantic.

    from trainmaster.worker import checkpoint_dir, checkpoint_saved, latest_checkpoint
    from trainmaster.worker import log_metrics, preempted

    ckpt = latest_checkpoint()                       # CHECKPOINT_DIR/step_N, or None
    start = int(ckpt.name.removeprefix("step_")) if ckpt else 0
    for step in range(start + 1, steps + 1):
        ...
        log_metrics(step=step, loss=loss.item())     # progress: watchdog, goodput; rank 0 writes
        if step % every == 0 or (stop := preempted()):
            save(checkpoint_dir(step)); checkpoint_saved(step)
            if stop: sys.exit(EXIT_PREEMPTED)

Under `trainmaster launch` the entry shim (launch/entry.py, train/scriptnet.py) runs in the
script's own process and sets `net`: the helpers then also feed its hang watchdog, its goodput
timeline and its preemption record. Started by hand (no shim) they do only their own part:
log_metrics writes ./metrics.jsonl, preempted() says False, no watchdog. Importing this module
costs milliseconds: the standard library and run/metrics.py; preempted() imports torch when
called (a collective needs it, and the script has imported torch by then anyway).

Checkpoint convention (what latest_checkpoint() trusts): a checkpoint is written into a folder
with a temporary name (checkpoint_dir(step): CHECKPOINT_DIR/.tmp-step_N, the same path on every
rank) and renamed to step_N once complete (checkpoint_saved, rank 0). A rename is atomic, so a
kill at any moment leaves the old step_N set or the new one, never a half-written step_N.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from trainmaster.run.metrics import drop_after as _drop_after
from trainmaster.run.metrics import log_metrics as _log_metrics
from trainmaster.storage import RunPaths

__all__ = [
    "EXIT_PREEMPTED",
    "checkpoint_dir",
    "checkpoint_saved",
    "drop_after",
    "heartbeat",
    "latest_checkpoint",
    "log_metrics",
    "preempted",
]

EXIT_PREEMPTED = 143  # 128 + SIGTERM: what `status` counts as a preemption, not a failure
CHECKPOINT_DIR_ENV = "TRAINMASTER_CHECKPOINT_DIR"
_STEP = re.compile(r"^step_(\d+)$")


class Net(Protocol):
    """The shim's side (train/scriptnet.py), as the helpers see it."""

    def progress(self, step: int | None) -> None: ...
    def loss(self, step: int, value: Any) -> None: ...
    def checkpoint_saved(self, step: int) -> None: ...
    def resumed(self, step: int) -> None: ...
    def sigterm(self) -> bool: ...
    def preempting(self) -> None: ...


net: Net | None = None  # set by the entry shim before the script starts; None by hand


def _int(step: Any) -> int:
    return int(step.item() if hasattr(step, "item") else step)


def log_metrics(
    step: int, *, environ: Mapping[str, str] = os.environ, **values: Any
) -> dict[str, Any] | None:
    """One metrics.jsonl row (rank 0 writes, run/metrics.py); on every rank, progress for the
    watchdog and goodput, so call it on every rank."""
    if net is not None:
        net.progress(_int(step))
    row = _log_metrics(step, environ=environ, **values)
    if net is not None and "loss" in values:  # a non-finite loss stops the job (divergence)
        net.loss(_int(step), values["loss"])
    return row


def heartbeat(step: int | None = None) -> None:
    """Progress for a script that logs no metrics (step: the step just finished)."""
    if net is not None:
        net.progress(None if step is None else _int(step))


def drop_after(step: int, *, environ: Mapping[str, str] = os.environ) -> int:
    """A resumed script drops the rows logged after its checkpoint (run/metrics.py); goodput
    learns that the steps after it are redone."""
    if net is not None:
        net.resumed(_int(step))
    return _drop_after(step, environ=environ)


def _folder(environ: Mapping[str, str] = os.environ) -> Path:
    return Path(environ.get(CHECKPOINT_DIR_ENV) or RunPaths(Path()).checkpoints)


def latest_checkpoint(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The newest complete checkpoint, CHECKPOINT_DIR/step_N (largest N), or None."""
    found = []
    with contextlib.suppress(OSError):
        for path in _folder(environ).iterdir():
            m = _STEP.match(path.name)
            if m:
                found.append((int(m[1]), path))
    if not found:
        return None
    step, path = max(found)
    if net is not None:
        net.resumed(step)
    return path


def checkpoint_dir(step: int, environ: Mapping[str, str] = os.environ) -> Path:
    """The folder to write step N's checkpoint into (created; a temporary name, the same on
    every rank, so a sharded save such as torch.distributed.checkpoint can share it)."""
    path = _folder(environ) / f".tmp-step_{_int(step)}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def checkpoint_saved(
    step: int, *, keep: int | None = None, environ: Mapping[str, str] = os.environ
) -> Path:
    """Step N's checkpoint is complete on this rank. Rank 0 renames checkpoint_dir(step) to
    step_N and keeps the newest `keep` (None: all); every rank tells goodput how long training
    stood still for it (since the last log_metrics/heartbeat). Call it after a collective save
    returned (DCP's does), or after rank 0's own save, before any rank goes on."""
    step = _int(step)
    folder = _folder(environ)
    final = folder / f"step_{step}"
    if int(environ.get("RANK", "0") or 0) == 0:
        tmp = folder / f".tmp-step_{step}"
        if tmp.is_dir():
            from trainmaster.run import checkpoints  # stdlib only: fsync'ed atomic rename

            checkpoints.publish(tmp, folder, step)
        for stale in folder.glob(".tmp-step_*"):  # a killed attempt's unfinished saves
            if stale.name != tmp.name and stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        if keep:
            done = sorted((int(m[1]), p) for p in folder.iterdir() if (m := _STEP.match(p.name)))
            for _, old in done[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    if net is not None:
        net.checkpoint_saved(step)
    return final


def preempted() -> bool:
    """Collective: True on every rank when any rank has received SIGTERM (a spot interruption,
    an eviction, `trainmaster cancel`). Call it on every rank at the same step; the first call
    turns SIGTERM from "die now" into a note (before it, and without the shim, SIGTERM ends the
    process as usual). Then save, checkpoint_saved(step) and exit EXIT_PREEMPTED (143)."""
    mine = net.sigterm() if net is not None else False
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        cuda = dist.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else None
        flag = torch.tensor([1.0 if mine else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        mine = bool(flag.item() > 0)
    if mine and net is not None:
        net.preempting()
    return mine
