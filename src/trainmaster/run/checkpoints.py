"""The checkpoints folder (docs/architecture.md 3.6), without torch: which checkpoints
are complete, whose.

    runs/JOB/checkpoints/step_N/   model.pt, trainer.pt, ranks.pt, meta.json
    runs/JOB/checkpoints/.tmp-step_N-PID/   a checkpoint being written (ignored when found)

A checkpoint is written under a temporary name, every file fsync'ed, then the folder renamed to
step_N and the parent fsync'ed: a crash at any moment leaves either the complete step_N or a
.tmp-* folder, which readers ignore and the next save deletes. meta.json (JSON, written last)
says which job made it (config hash) and where every rank's data stood, so that every rank can
plan its resume before it imports torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmaster.errors import UserError

META = "meta.json"
FORMAT = 1
TMP_PREFIX = ".tmp-"
_STEP = re.compile(r"^step_(\d+)$")


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int
    meta: dict[str, Any]


def step_name(step: int) -> str:
    return f"step_{step}"


def temp_dir(folder: Path, step: int) -> Path:
    return folder / f"{TMP_PREFIX}{step_name(step)}-{os.getpid()}"


def read_meta(path: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((path / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def complete(folder: Path) -> list[Checkpoint]:
    """Complete checkpoints, oldest first; temporary and unreadable folders are skipped."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        m = _STEP.match(path.name)
        if not m or not path.is_dir():
            continue
        meta = read_meta(path)
        if meta is None or meta.get("step") != int(m[1]):
            continue
        found.append(Checkpoint(path, int(m[1]), meta))
    return sorted(found, key=lambda c: c.step)


def newest_named(folder: Path) -> int | None:
    """The largest N of the step_N entries (a custom script's: complete by their name; a
    folder or a file, as worker.latest_checkpoint takes either)."""
    steps = []
    with contextlib.suppress(OSError):
        steps = [int(m[1]) for p in folder.iterdir() if (m := _STEP.match(p.name))]
    return max(steps, default=None)


def latest(folder: Path) -> Checkpoint | None:
    found = complete(folder)
    return found[-1] if found else None


def check_owner(
    ckpt: Checkpoint, *, config_hash: str, job: str, folder: Path, legacy: str | None = None
) -> None:
    """Refuse a checkpoint that another configuration wrote: resuming would mix two jobs.
    legacy: the job's hash as computed before max_steps left it (config.Derived)."""
    theirs = ckpt.meta.get("config_hash")
    if theirs in (config_hash, legacy):
        return
    who = ckpt.meta.get("job", "?")
    raise UserError(
        f"{ckpt.path.name} was written by job {who!r} with config hash {theirs}, but this job's "
        f"hash is {config_hash}: the model, data or schedule (model.*, data.*, train.lr, "
        f"optimizer, global_batch_size, warmup_steps, seed, precision) changed since. Run it with "
        f"the settings it was started with, give this configuration a new job.name, or delete "
        f"{folder} to start this job from step 0",
        where=str(ckpt.path),
    )


def fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def publish(tmp: Path, folder: Path, step: int) -> Path:
    """Rename a fully written temporary folder to step_N (replacing an older step_N)."""
    fsync_dir(tmp)
    final = folder / step_name(step)
    if final.exists():  # the same step written again (a rerun): move the old one aside first
        old = folder / f"{TMP_PREFIX}old-{step_name(step)}-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    fsync_dir(folder)
    return final


def prune(folder: Path, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints; delete older ones and stray temporaries."""
    for ckpt in complete(folder)[:-keep]:
        shutil.rmtree(ckpt.path, ignore_errors=True)
    for path in folder.glob(f"{TMP_PREFIX}*"):  # only rank 0 writes, and it has published
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
