"""Saving and restoring a run: model, optimizer, scheduler, every rank's RNG and data position.

Rank 0 writes the whole checkpoint, after gathering every rank's small private state (RNG
states and data position, a few KB each), so there is one writer and no cross-node folder
races. Layout and atomicity are ckptdir's. Tensors are moved to the CPU before saving (on XLA
this is the workaround for xm.save hanging when ranks reach it at different times) and
everything loads with weights_only=True.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from trainmaster.train import ckptdir
from trainmaster.train.dataset import Position
from trainmaster.train.device import Runtime

MODEL, TRAINER, RANKS = "model.pt", "trainer.pt", "ranks.pt"

# Called on rank 0 half-way through writing a checkpoint (the model file written, the rest not
# yet) with (checkpoints folder, step). Empty in normal runs; the fault tests add one
# (train/faults.py) to kill rank 0 exactly there and prove the previous checkpoint survives.
MidSaveHook = Callable[[Path, int], None]
mid_save_hooks: list[MidSaveHook] = []


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


def _save(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def save(folder: Path, *, step: int, rt: Runtime, model: nn.Module,
         optimizer: torch.optim.Optimizer, scheduler: LRScheduler, position: Position,
         meta: dict[str, Any], keep: int) -> Path | None:
    """Collective: every rank calls it at the same step; rank 0 writes, returns the folder."""
    states = rt.all_gather_object(rank_state(rt, position), tag=f"ckpt-{step}")
    if rt.rank != 0:
        return None
    tmp = ckptdir.temp_dir(folder, step)
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    _save(to_cpu(model.state_dict()), tmp / MODEL)
    for hook in mid_save_hooks:
        hook(folder, step)
    _save({"optimizer": to_cpu(optimizer.state_dict()), "scheduler": scheduler.state_dict(),
           "step": step}, tmp / TRAINER)
    _save(states, tmp / RANKS)
    ckptdir.write_json(tmp / ckptdir.META, {
        "format": ckptdir.FORMAT, "step": step, **meta, "world_size": rt.world,
        "positions": [s["position"] for s in states], "written_at": time.time()})
    final = ckptdir.publish(tmp, folder, step)
    ckptdir.prune(folder, keep)
    return final


def load_model(path: Path, model: nn.Module) -> None:
    """Into the CPU model, before it moves to its device (tied weights are loaded once each)."""
    state = torch.load(path / MODEL, map_location="cpu", weights_only=True)
    model.load_state_dict(state)


def load_trainer(path: Path, optimizer: torch.optim.Optimizer, scheduler: LRScheduler) -> int:
    state = torch.load(path / TRAINER, map_location="cpu", weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return int(state["step"])


def load_rank(path: Path, rt: Runtime, same_world: bool) -> bool:
    """This rank's RNG state, when the checkpoint was written by as many ranks; else False."""
    if not same_world:
        return False
    states = torch.load(path / RANKS, map_location="cpu", weights_only=True)
    restore_rank_state(rt, states[rt.rank])
    return True
