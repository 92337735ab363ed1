"""Saving and restoring a run: model, optimizer, scheduler, every rank's RNG and data position.

Rank 0 writes the whole checkpoint, after gathering every rank's small private state (RNG
states and data position, a few KB each), so there is one writer and no cross-node folder
races. Layout and atomicity are run/checkpoints.py's. Tensors are moved to the CPU before
saving (on XLA this is the workaround for xm.save hanging when ranks reach it at different
times) and everything loads with weights_only=True.

A save is two halves: stage() (collective, on the training thread: gather the ranks' state) and
write() (rank 0 alone: files, fsync, rename). save() does both in a row; training hands the
staged state to the BackgroundWriter (background), whose process runs write() while training goes on, and writes the
two big files from its shared block past the page cache (odirect): the same zips, but
without the kernel's copy of every byte, which took a core from training.
"""

from __future__ import annotations

import copy
import os
import random
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from trainmaster import files
from trainmaster.errors import UserError
from trainmaster.run import checkpoints, peers
from trainmaster.train.checkpoint import odirect, staging
from trainmaster.train.dataset import Position
from trainmaster.train.device import Runtime
from trainmaster.train.preflight import Plan

MODEL, TRAINER, RANKS = "model.pt", "trainer.pt", "ranks.pt"

# Called on rank 0 half-way through writing a checkpoint (the model file written, the rest not
# yet) with (checkpoints folder, step), in the process that writes it (in training, background's
# writer process, which gets the hooks pickled with each write). Empty in normal runs; the fault
# tests add one (train/faults.py) to kill rank 0 exactly there and prove the previous
# checkpoint survives.
MidSaveHook = Callable[[Path, int], None]
mid_save_hooks: list[MidSaveHook] = []

# Checked on rank 0 just before a checkpoint is published, in the process that writes it (the
# writer process gets them pickled with each write): the run's fence on Kubernetes
# (run/peers.py), so that an attempt given up for lost never publishes over its successor's.
publish_guards: list[peers.Fence] = []

# In a checkpoint writer process, the pid of the trainer it writes for (writerproc sets it): what
# "kill rank 0" means to a fault hook that runs there.
writing_for: int | None = None


def trainer_pid() -> int:
    return writing_for if writing_for is not None else os.getpid()


def to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def rank_state(rt: Runtime, position: Position) -> dict[str, Any]:
    state: Any = np.random.get_state()
    kind, keys, pos, has_gauss, gauss = state
    return {
        "python": random.getstate(),
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)],
        "device": to_cpu(rt.rng_state()),
        "position": position.to_list(),
    }


def restore_rank_state(rt: Runtime, state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    rt.set_rng_state(state["device"])


def detached(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, dict):
        return {k: detached(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(detached(v) for v in obj)
    return obj


@dataclass(frozen=True)
class Staged:
    """Everything one checkpoint holds: for write() (CPU tensors) or background (any device)."""

    step: int
    model: dict[str, Any]
    trainer: dict[str, Any]
    ranks: list[Any]
    meta: dict[str, Any]


def stage(
    *,
    step: int,
    rt: Runtime,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    position: Position,
    meta: dict[str, Any],
    host: bool = True,
) -> Staged | None:
    """Collective: every rank calls it at the same step; rank 0 gets the checkpoint's content,
    the others None. Its tensors are the live ones, on the CPU (host) or where they are (not
    host: background copies them straight into its shared buffer): training must not step
    before they are written or copied."""
    states = rt.all_gather_object(rank_state(rt, position), tag=f"ckpt-{step}")
    if rt.rank != 0:
        return None
    tensors = to_cpu if host else detached
    return Staged(
        step,
        tensors(model.state_dict()),
        {
            "optimizer": tensors(optimizer.state_dict()),
            "scheduler": copy.deepcopy(scheduler.state_dict()),
            "step": step,
        },
        states,
        {
            "format": checkpoints.FORMAT,
            "step": step,
            **meta,
            "world_size": rt.world,
            "positions": [s["position"] for s in states],
        },
    )


# Set once this process found the direct write unusable: torch lacks what it needs (probed
# once), or it failed in a way it did not foresee (not Unsuitable). From then on files are saved
# the plain way, and the reason was said once.
_direct_off: list[str] = []


def _turn_direct_off(path: Path, why: str) -> None:
    _direct_off.append(why)
    print(
        f"checkpoint: direct writes off in this process (torch {torch.__version__}); "
        f"{path.name} and later files written through the page cache: {why}",
        file=sys.stderr,
    )


def _direct(path: Path) -> bool:
    if not _direct_off and (missing := odirect.unavailable()) is not None:
        _turn_direct_off(path, missing)
    return not _direct_off


def _save(obj: Any, path: Path, arena: staging.Arena | None = None) -> int:
    """torch.save's file at `path`, fsynced; the direct write (odirect) when it applies. That
    is an optimisation: whatever goes wrong in it, the checkpoint is saved the plain way."""
    if arena is not None and _direct(path):
        try:
            return odirect.save(obj, path, arena)
        except odirect.Unsuitable as why:
            print(f"checkpoint: {path.name} written through the page cache: {why}", file=sys.stderr)
        except Exception as why:  # e.g. a torch without an API it uses: never fail the save
            _turn_direct_off(path, f"{type(why).__name__}: {why}")
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


def write(
    folder: Path,
    staged: Staged,
    keep: int,
    before_publish: Callable[[], None] | None = None,
    arena: staging.Arena | None = None,
) -> tuple[Path, int]:
    """Write a staged checkpoint (CPU tensors) atomically (checkpoints); returns its folder and its
    bytes. Needs no other rank and no training state: background's process runs it, and checks
    before_publish that its trainer is still alive. Given the staging block that `staged`'s
    tensors view, the two big files bypass the page cache (odirect)."""
    tmp = checkpoints.temp_dir(folder, staged.step)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    size = _save(staged.model, tmp / MODEL, arena)
    for hook in mid_save_hooks:
        hook(folder, staged.step)
    size += _save(staged.trainer, tmp / TRAINER, arena)
    size += _save(staged.ranks, tmp / RANKS)
    files.write_json(tmp / checkpoints.META, {**staged.meta, "written_at": time.time()}, indent=1)
    if before_publish is not None:
        before_publish()
    for guard in publish_guards:
        guard.check()  # raises: the temporary folder stays unpublished, as after a kill
    final = checkpoints.publish(tmp, folder, staged.step)
    checkpoints.prune(folder, keep)
    return final, size


def save(
    folder: Path,
    *,
    step: int,
    rt: Runtime,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    position: Position,
    meta: dict[str, Any],
    keep: int,
) -> Path | None:
    """Collective and synchronous (stage, then write): rank 0 returns the folder."""
    staged = stage(
        step=step,
        rt=rt,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        position=position,
        meta=meta,
    )
    return None if staged is None else write(folder, staged, keep)[0]


def load_model(path: Path, model: nn.Module) -> None:
    """Into the model where it was built (on the host, or its CUDA device: one copy of each
    tensor either way), before it moves to its device; tied weights are loaded once each."""
    state = torch.load(path / MODEL, map_location="cpu", weights_only=True)
    model.load_state_dict(state)


def load_trainer(path: Path, optimizer: torch.optim.Optimizer, scheduler: LRScheduler) -> int:
    state = torch.load(path / TRAINER, map_location="cpu", weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    ours = _schedules(scheduler)
    scheduler.load_state_dict(state["scheduler"])
    _keep_schedule(scheduler, ours, int(state["step"]))
    return int(state["step"])


def _schedules(scheduler: LRScheduler) -> list[dict[str, Any]]:
    """The settings of the scheduler's schedule objects (optim.Schedule), which LambdaLR saves."""
    return [
        dict(vars(fn)) for fn in getattr(scheduler, "lr_lambdas", []) if hasattr(fn, "__dict__")
    ]


def _keep_schedule(scheduler: LRScheduler, ours: list[dict[str, Any]], step: int) -> None:
    """The schedule is the job file's, not the checkpoint's. They differ only in
    train.max_steps (the one schedule setting outside the config hash): a finished run resumed
    with more steps decays to its new end from where it stopped, instead of training on at the
    old end's rate of 0. The next update's rate is set from it too (step() of the restored epoch
    minus one: LambdaLR's own computation). Same schedule: nothing is touched (exact resume)."""
    saved = _schedules(scheduler)
    if saved == ours:
        return
    for fn, mine in zip(getattr(scheduler, "lr_lambdas", []), ours, strict=True):
        vars(fn).update(mine)
    scheduler.last_epoch -= 1
    scheduler.step()
    old, new = (saved or [{}])[0], (ours or [{}])[0]
    changed = ", ".join(f"{k} {old.get(k)} -> {v}" for k, v in new.items() if old.get(k) != v)
    print(
        f"schedule: {changed} (the job file's) from step {step} on; next learning rate "
        f"{scheduler.get_last_lr()[0]:.3g}",
        file=sys.stderr,
    )


def load_rank(path: Path, rt: Runtime, same_world: bool) -> bool:
    """This rank's RNG state, when the checkpoint was written by as many ranks; else False."""
    if not same_world:
        return False
    states = torch.load(path / RANKS, map_location="cpu", weights_only=True)
    restore_rank_state(rt, states[rt.rank])
    return True


def agree_on_resume(plan: Plan, rt: Runtime) -> Plan:
    """Rank 0 decides where to resume; a rank that saw another checkpoint follows it."""
    mine = plan.resume.step if plan.resume else None
    chosen = rt.broadcast_object(mine, tag="resume")
    if chosen == mine:
        return plan
    if chosen is None:
        return plan.resuming_from(None)
    path = plan.run.checkpoints / checkpoints.step_name(chosen)
    meta = checkpoints.read_meta(path)
    if meta is None:
        raise UserError(
            f"rank 0 resumes from {path.name}, which rank {rt.rank} cannot read: "
            "the run folder must be shared storage seen by every node",
            where=str(path),
        )
    return plan.resuming_from(checkpoints.Checkpoint(path, chosen, meta))
