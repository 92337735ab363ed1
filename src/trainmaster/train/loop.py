"""The training loop: step, log, checkpoint, stop when preempted, summarise.

The Trainer runs on a setup that trainsetup.py built (model, optimizer, data, resumed exactly)
and started (writer, SIGTERM handler, watchdog), and ends with the setup's close(). The logged
loss is the mean over the step's micro-batches and all ranks (one small all-reduce per step).
At the end the ranks compare parameter checksums (summary.json's ranks_agree).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainmaster.compile import counters as compile_counters
from trainmaster.compile import fingerprint
from trainmaster.run import counters, goodput
from trainmaster.train import checkpoint, metrics, netplugin, preempt, rollback, trainsetup
from trainmaster.train.metrics import log
from trainmaster.train.preflight import Plan

# Called on every rank after each step with (run folder, rank, step). Empty in normal runs; the
# fault tests add one (train/faults.py) to kill a worker at a chosen step.
StepHook = Callable[[Path, int, int], None]
after_step_hooks: list[StepHook] = []
before_step_hooks: list[StepHook] = []  # (run folder, rank, the step about to run)


def param_checksum(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(value.detach().cpu().float().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class Trainer:
    """The steps, checkpoints and end of a run, on a started setup (trainsetup.py)."""

    def __init__(self, setup: trainsetup.TrainerSetup) -> None:
        self.setup = setup
        self.saved = 0  # the step of the last checkpoint submitted to the writer
        self.net_plugin: str | None = None

    def _save(self, step: int) -> None:
        """Stage on the training thread, write in the writer process (background); the
        stand-still (waiting for the previous write, gathering, copying) is goodput's
        checkpoint time."""
        su = self.setup
        p, cfg, writer = su.plan, su.plan.cfg, su.writer
        t0 = time.time()
        su.watchdog.where = f"checkpoint of step {step}"
        if writer is not None:
            writer.wait()  # before staging: at most one staged copy in memory
        meta = {
            "job": cfg.job.name,
            "config_hash": cfg.derived.config_hash,
            "vocab_size": p.vocab_size,
            "files": [s.path.name for s in p.shards],
        }
        staged = checkpoint.stage(
            step=step,
            rt=su.rt,
            model=su.model,
            optimizer=su.optimizer,
            scheduler=su.scheduler,
            position=su.loader.position,
            meta=meta,
            host=False,  # the writer copies the tensors straight into its shared buffer
        )
        if staged is not None and writer is not None:
            writer.submit(staged)
            self.saved = step
            if os.environ.get(checkpoint.SYNC_ENV):
                writer.wait()
            goodput.record(p.run.timeline, "checkpoint", t=t0, end=time.time(), step=step)

    def train(self) -> dict[str, Any] | None:
        su = self.setup
        cfg, rt, accum = su.plan.cfg, su.rt, su.plan.grad_accum
        t = cfg.train
        end = min(t.max_steps, su.start_step + (t.steps_this_run or t.max_steps))
        batches = rt.batches(su.loader)
        step, first_step_s = su.start_step, None
        pending: list[tuple[int, torch.Tensor, float]] = []  # steps not yet read on the host
        window_t0, window_wall = 0.0, 0.0
        wd = su.watchdog  # started with the setup; the first beat arms it
        guard = rollback.Guard(su)
        while step < end:
            t0 = time.perf_counter()
            if not pending:
                window_t0, window_wall = t0, time.time()
            for hook in before_step_hooks:
                hook(su.plan.run.dir, rt.rank, step + 1)
            wd.where = f"step {step + 1}: data, forward, backward (gradient all_reduce), optimizer"
            result = su.stepper(batches, accum, su.loader.consumed, self._before_update)
            wd.where = f"step {step + 1}: loss all_reduce"
            # Two more floats in the all-reduce: the ranks' SIGTERM votes (preempt.py) and the
            # ranks whose gradient norm is not finite (divergence: every rank learns of it).
            dtype, device = result.losses.dtype, result.losses.device
            flags = torch.cat([torch.full((1,), su.preempt.flag, dtype=dtype, device=device),
                               (~torch.isfinite(result.grad_norm.detach())).reshape(1).to(dtype)])  # fmt: skip
            reduced = rt.all_reduce_sum(torch.cat([result.losses, flags]))
            losses = reduced[:-2] / (accum * rt.world)
            step += 1
            pending.append(
                (
                    step,
                    torch.cat([losses, result.grad_norm.reshape(1).float(), reduced[-2:].float()]),
                    result.lr,
                )
            )
            stop, bad = False, None
            if (
                first_step_s is None
                or step % rt.options.sync_every == 0
                or step == end
                or step % t.checkpoint_every == 0
            ):  # the same steps on every rank
                wd.where = f"step {step}: reading losses on the host"
                stop, bad = self._log(pending, window_t0, window_wall, guard)  # the one host sync
                self._gpu_stalls()
            warm = first_step_s is not None
            if first_step_s is None:
                first_step_s = time.time() - su.started
                self._compiled()
                if (
                    rt.rank == 0 and rt.kind == "cuda"
                ):  # NCCL opens its plugin at the first collective
                    self.net_plugin = netplugin.describe(rt.kind)
                    log(f"nccl net plugin: {self.net_plugin}")
            if bad is not None:  # before this step's checkpoint: it is never written
                step = rollback.roll_back(su, guard, bad)
                wd.beat(step, None)
                continue  # a SIGTERM meanwhile is still voted at the next step
            if stop and step < end:  # preempted: every rank saw the vote at this same step
                self._stop_preempted(step)
            if step % t.checkpoint_every == 0 or step == end:  # and always at the end
                self._save(step)
            wd.beat(step, time.perf_counter() - t0 if warm else None)
            wd.where = f"after step {step}"
            for hook in after_step_hooks:
                hook(su.plan.run.dir, rt.rank, step)
        wd.stop()
        return self._finish(step, first_step_s)

    def _before_update(self) -> None:
        """The last checkpoint's copy into the writer's block ran beside this step's forward
        and backward; what is left of it before the update is checkpoint time (goodput)."""
        writer = self.setup.writer
        if writer is not None:
            t1 = time.time()
            waited = writer.before_update()
            if waited is not None:
                timeline = self.setup.plan.run.timeline
                goodput.record(timeline, "checkpoint", t=t1, end=t1 + waited, step=self.saved)

    def _gpu_stalls(self) -> None:
        """On a GPU, before_update only queues the stream's wait for the copy: how long the GPU
        stood is read after a host sync, and is checkpoint time of its save as the host's is."""
        writer, timeline = self.setup.writer, self.setup.plan.run.timeline
        if writer is not None:
            now = time.time()
            for saved, seconds in writer.gpu_stalls():
                goodput.record(timeline, "checkpoint", t=now - seconds, end=now, step=saved)

    def _drain(self, step: int) -> None:
        """Rank 0: wait until the checkpoint write in flight is complete (goodput: a stand-still)."""
        writer, timeline = self.setup.writer, self.setup.plan.run.timeline
        if writer is not None:
            t0 = time.time()
            writer.wait()
            goodput.record(timeline, "checkpoint", t=t0, end=time.time(), step=step, final=True)

    def _stop_preempted(self, step: int) -> None:
        """Checkpoint this step, wait for its write, record the preemption, stop (Preempted)."""
        su, t0 = self.setup, time.time()
        self._save(step)
        self._drain(step)
        if su.writer is not None:
            preempt.record(
                su.plan.run.preemptions,
                step=step,
                requested_at=su.preempt.requested_at,
                saved_s=time.time() - t0,
            )
            log(
                f"preempted (SIGTERM): checkpoint of step {step} written in {time.time() - t0:.2f} s"
            )
        if su.metrics is not None:
            su.metrics.close()
        su.watchdog.stop()
        raise preempt.Preempted(step)

    def _log(
        self,
        pending: list[tuple[int, torch.Tensor, float]],
        since: float,
        since_wall: float,
        guard: rollback.Guard,
    ) -> tuple[bool, rollback.Verdict | None]:
        """Read the window's losses and gradient norms in one host sync (every step on CPU,
        every options.sync_every on CUDA) and write their metrics rows; step_s is the window's
        mean (the host runs ahead of the GPU, so one step's own time is not known). Returns
        whether any rank voted to stop (SIGTERM) in the window, and the window's first diverged
        step (rollback.py): the same answers on every rank."""
        values = torch.stack([v for _, v, _ in pending]).tolist()
        step_s = (time.perf_counter() - since) / len(pending)
        log_ = self.setup.metrics
        if log_ is not None:
            for (step, _, lr), (loss, mlm, nsp, norm, *_) in zip(pending, values, strict=True):
                log_.step(
                    step=step,
                    loss=loss,
                    mlm_loss=mlm,
                    nsp_loss=nsp,
                    lr=lr,
                    grad_norm=norm,
                    step_s=step_s,
                )
            goodput.record(
                self.setup.plan.run.timeline,
                "steps",
                t=since_wall,
                end=time.time(),
                first=pending[0][0],
                last=pending[-1][0],
            )
        bad = guard.verdict([(s, row) for (s, _, _), row in zip(pending, values, strict=True)])
        pending.clear()
        return any(row[-2] > 0 for row in values), bad

    def _compiled(self) -> None:
        """After the first step the graphs are in the cache: record whose they are (rank 0)."""
        p, rt = self.setup.plan, self.setup.rt
        if p.compile_cache is None or rt.rank != 0:
            return
        fingerprint.write(p.compile_cache, fingerprint.compute(p.cfg, p.vocab_size), p.cfg.job.name)
        if rt.kind != "xla":
            log(
                f"compile cache {p.cache_state} ({p.compile_cache}): "
                f"{compile_counters.describe(compile_counters.snapshot())}"
            )

    def _finish(self, step: int, first_step_s: float | None) -> dict[str, Any] | None:
        su = self.setup
        p, cfg, rt, log_ = su.plan, su.plan.cfg, su.rt, su.metrics
        self._drain(step)  # the last checkpoint is complete before the process ends
        sums = rt.all_gather_object(param_checksum(su.model), tag="checksum")
        # torchrun counts restarts per node agent (run/counters.py agents: the largest)
        restarts = counters.agents(rt.all_gather_object(p.env.restarts, tag="restarts"))
        su.loader.close()
        rt.finish()
        if log_ is None:
            return None
        last = log_.rows[-1]["loss"] if log_.rows else metrics.last_logged_loss(p.run.metrics)
        summary = log_.summary(
            status="completed" if step >= cfg.train.max_steps else "stopped",
            steps=step,
            final_loss=last,
            time_to_first_step_s=first_step_s,
            compile_cache=p.cache_state,
            restarts=restarts,
            job_retries=goodput.job_retries(),
            world_size=rt.world,
            global_batch_size=cfg.train.global_batch_size,
            config_hash=cfg.derived.config_hash,
            ranks_agree=len(set(sums)) == 1,
            resumed_from=p.resume.step if p.resume else None,
            steps_this_run=step - su.start_step,
            grad_accum=p.grad_accum,
            device=rt.kind,
            precision=cfg.train.precision,
            param_checksum=sums[0],
            cacheset=cfg.train.cacheset if p.compile else None,
            compile_counters=compile_counters.snapshot() if p.compile else {},
            nccl_net_plugin=self.net_plugin or netplugin.describe(rt.kind),
            preflight=su.preflight,
            preemptions=len(preempt.read(p.run.preemptions)),
            **goodput.summary_fields(p.run.timeline, step),
        )
        log_.close()
        log(
            f"done: step {step}, loss {last}, {summary['avg_seq_per_s']} seq/s average, "
            f"ranks agree: {summary['ranks_agree']}"
        )
        return summary


def train(plan: Plan, started: float) -> dict[str, Any] | None:
    """Train; the caller ends the process (see __main__: a gloo group is never torn down)."""
    with trainsetup.build(plan, started) as setup:  # its end: writer, handler, watchdog gone
        return Trainer(setup).train()
