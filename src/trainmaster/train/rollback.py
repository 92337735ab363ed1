"""The trainer's side of divergence (run/divergence.py): a verdict on each window of steps, and
the rollback itself, in the running processes: every rank reloads the same checkpoint's weights,
optimizer, schedule and RNG in place (no restart, no new rendezvous: a second or so), and the
data loader goes on from where it is, so the batches between that checkpoint and the bad step
are skipped rather than seen again.
"""

from __future__ import annotations

import os
import time
from typing import Any

from trainmaster.run import checkpoints, divergence, goodput
from trainmaster.run.divergence import Diverged, Verdict
from trainmaster.train import checkpoint
from trainmaster.train.metrics import log
from trainmaster.train.trainsetup import TrainerSetup


class Guard:
    """train.on_divergence for one trainer process: the detector, and the verdicts so far (rank
    0's reading of rollbacks.jsonl, the same on every rank)."""

    def __init__(self, setup: TrainerSetup) -> None:
        t, rt = setup.plan.cfg.train, setup.rt
        self.action, self.most, self.window = t.on_divergence, t.max_rollbacks, t.rollback_window
        self.detector = divergence.Detector(t.loss_spike)
        mine = divergence.read(setup.plan.run.rollbacks) if rt.rank == 0 else None
        self.past: list[dict[str, Any]] = (
            rt.broadcast_object(mine, tag="rollbacks") if self.action == "rollback" else []
        )

    def verdict(self, rows: list[tuple[int, list[float]]]) -> Verdict | None:
        """The first bad step of a window: rows are (step, [loss, mlm, nsp, grad_norm, votes,
        ranks with a non-finite gradient norm]) as every rank read them."""
        if self.action == "off":
            return None
        for step, (loss, _mlm, _nsp, norm, _votes, bad) in rows:
            found = self.detector.check(step, loss, norm, bad > 0)
            if found is not None:
                return found
        return None


def roll_back(trainer: TrainerSetup, guard: Guard, bad: Verdict) -> int:
    """Every rank: back to the newest checkpoint from before BAD and return its step, or raise
    divergence.Diverged (train.on_divergence = stop, no checkpoint to go back to, or too many rollbacks)."""
    p, t, rt = trainer.plan, trainer.plan.cfg.train, trainer.rt
    t0 = time.time()
    if trainer.writer is not None:
        trainer.writer.wait()  # the write in flight is of a step before BAD: let it complete
    before = [c.step for c in checkpoints.complete(p.run.checkpoints) if c.step < bad.step]
    newest: int | None = rt.broadcast_object(max(before, default=None), tag="rollback-to")
    why = _why_stop(guard, bad, newest)
    if why is not None:
        line = divergence.stop_line(bad, newest, why)
        if rt.rank == 0:
            launch = divergence.launch_of(os.environ)
            divergence.record(
                p.run.rollbacks, bad, action="stop", to=newest, launch=launch, line=line
            )
        raise Diverged(line)
    assert newest is not None
    path = p.run.checkpoints / checkpoints.step_name(newest)
    meta = checkpoints.read_meta(path) or {}
    checkpoint.load_model(path, trainer.model)
    step = checkpoint.load_trainer(path, trainer.optimizer, trainer.scheduler)
    checkpoint.load_rank(path, rt, same_world=meta.get("world_size") == rt.world)
    rt.sync()
    guard.past.append({"step": bad.step, "action": "rollback", "to": step})
    if rt.rank == 0:
        # the data of steps step+1..BAD: from the checkpoint's position to where the loader is
        data = {
            "data_from": (meta.get("positions") or [None])[0],
            "data_at": trainer.loader.position.to_list(),
        }
        divergence.record(p.run.rollbacks, bad, action="rollback", to=step, **data)
        if trainer.metrics is not None:
            trainer.metrics.rollback(step)
        goodput.record(p.run.timeline, "rollback", t=t0, end=time.time(), step=bad.step, to=step)
        done = sum(1 for r in guard.past if r.get("action") == "rollback")
        log(
            f"divergence: {bad.describe()}; rolled back to step {step} in {time.time() - t0:.2f} s, "
            f"skipping the batches of steps {step + 1}-{bad.step} (rollback {done}, at most "
            f"{t.max_rollbacks} in {t.rollback_window} steps)"
        )
    return step


def _why_stop(guard: Guard, bad: Verdict, newest: int | None) -> str | None:
    if guard.action == "stop":
        return "train.on_divergence is stop"
    if newest is None:
        return "no checkpoint from before it to roll back to"
    if not divergence.allowed(guard.past, bad.step, guard.most, guard.window):
        return f"already {guard.most} rollback(s) in the last {guard.window} steps (train.max_rollbacks)"
    return None
