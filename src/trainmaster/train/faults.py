"""Fault injection for the end-to-end tests, kept out of the code paths it breaks.

`python -m trainmaster.train` calls install() before training; it does nothing unless a test
sets one of:

- TRAINMASTER_FAULT_KILL_IN_CHECKPOINT=N: SIGKILL rank 0 half-way through writing checkpoint N
  (saving.mid_save_hooks, in the writer process: the trainer, then the writer), to prove
  the previous one survives;
- TRAINMASTER_FAULT_KILL_AT_STEP=R:N: SIGKILL rank R right after its step N
  (loop.after_step_hooks), a worker lost between checkpoints (the goodput test);
- TRAINMASTER_FAULT_HANG_AT_STEP=R:N: rank R stops right after its step N and never goes on
  (a sleep), as a worker stuck in a driver or a collective would (the watchdog test);
- TRAINMASTER_FAULT_BAD_MATMUL_RANK=R: rank R's device computes its preflight matmul 1% off,
  as a faulty accelerator would (the node preflight test);
- TRAINMASTER_FAULT_NAN_AT_STEP=R:N: rank R's loss is NaN in step N (step.loss_hooks), so
  its gradients and, through DDP's all-reduce, every rank's weights are too (the divergence
  tests).

Each fires once per job.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainmaster.train import checkpoint, health, loop, step
from trainmaster.train.checkpoint import saving

KILL_IN_CHECKPOINT_ENV = "TRAINMASTER_FAULT_KILL_IN_CHECKPOINT"
KILL_AT_STEP_ENV = "TRAINMASTER_FAULT_KILL_AT_STEP"
HANG_AT_STEP_ENV = "TRAINMASTER_FAULT_HANG_AT_STEP"
BAD_MATMUL_ENV = "TRAINMASTER_FAULT_BAD_MATMUL_RANK"
NAN_AT_STEP_ENV = "TRAINMASTER_FAULT_NAN_AT_STEP"


def _once(marker: Path) -> bool:
    """Once is kept by a marker file, not by TORCHELASTIC_RESTART_COUNT: an agent that restarts
    its workers for a membership change does not count a restart, so that count can be 0 again
    after a kill."""
    if marker.exists():
        return False
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return True


def kill_in_checkpoint(target: int, folder: Path, step: int) -> None:
    if step == target and _once(folder / f".fault-injected-{step}"):
        os.kill(checkpoint.trainer_pid(), signal.SIGKILL)  # rank 0, as a lost node would
        os.kill(os.getpid(), signal.SIGKILL)  # and the writer, before it writes on


def kill_at_step(rank: int, target: int, run_dir: Path, my_rank: int, step: int) -> None:
    if (my_rank, step) == (rank, target) and _once(run_dir / f".fault-killed-{rank}-{step}"):
        os.kill(os.getpid(), signal.SIGKILL)


def hang_at_step(rank: int, target: int, run_dir: Path, my_rank: int, step: int) -> None:
    if (my_rank, step) == (rank, target) and _once(run_dir / f".fault-hung-{rank}-{step}"):
        while True:  # only the watchdog (or a kill) ends this process now
            time.sleep(3600)


class _Poison:
    armed = False  # set before the step, spent by the first loss of it


def nan_at_step(rank: int, target: int, run_dir: Path, my_rank: int, at: int) -> None:
    if (my_rank, at) == (rank, target) and _once(run_dir / f".fault-nan-{rank}-{at}"):
        _Poison.armed = True


def poison(loss: Any) -> Any:
    if _Poison.armed:
        _Poison.armed = False
        return loss * float("nan")
    return loss


def bad_matmul(rank: int, my_rank: int, product: Any) -> Any:
    return product * 1.01 if my_rank == rank else product


def _rank_step(raw: str) -> tuple[int, int]:
    rank, _, step = raw.partition(":")
    return int(rank), int(step)


def install(environ: Mapping[str, str] = os.environ) -> None:
    target = environ.get(KILL_IN_CHECKPOINT_ENV)
    if target:
        saving.mid_save_hooks.append(functools.partial(kill_in_checkpoint, int(target)))
    if environ.get(BAD_MATMUL_ENV):
        health.matmul_hooks.append(functools.partial(bad_matmul, int(environ[BAD_MATMUL_ENV])))
    for env, hook in ((KILL_AT_STEP_ENV, kill_at_step), (HANG_AT_STEP_ENV, hang_at_step)):
        if environ.get(env):
            loop.after_step_hooks.append(functools.partial(hook, *_rank_step(environ[env])))
    if environ.get(NAN_AT_STEP_ENV):
        at = _rank_step(environ[NAN_AT_STEP_ENV])
        loop.before_step_hooks.append(functools.partial(nan_at_step, *at))
        step.loss_hooks.append(poison)
