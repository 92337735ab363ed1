"""One optimizer step: what the loop repeats and bench/train_throughput.py measures.

grad_accum micro-batches per rank, each forward + loss under bf16 autocast (cpu/cuda) and
backward of loss / grad_accum. On cpu/cuda DDP reduces gradients once per step: the inner
micro-steps run under no_sync(). On XLA there is no DDP; xm.reduce_gradients does the one
all-reduce after the last micro-step (the AWS tutorial's pattern). Then the gradients are
clipped to norm 1.0, the optimizer and the schedule step, and on XLA the graph is cut.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LRScheduler
from transformers import BertForPreTraining

from trainmaster.train.device import Batch, Runtime
from trainmaster.train.model import Pretraining, compile_layers

MAX_GRAD_NORM = 1.0
# Applied to each micro-batch's loss before backward. Empty in normal runs; the divergence
# tests add one (train/faults.py) that makes one step's loss NaN.
loss_hooks: list[Callable[[torch.Tensor], torch.Tensor]] = []
# An A/B knob while a GPU measures it (bench/gpu.sh): "layers" compiles each encoder layer and
# the head (model.compile_layers) instead of the whole model; unset: the whole model.
COMPILE_SCOPE_ENV = "TRAINMASTER_COMPILE_SCOPE"


@dataclass
class StepResult:
    losses: torch.Tensor  # [loss, mlm_loss, nsp_loss] summed over this rank's micro-batches
    grad_norm: torch.Tensor  # before clipping
    lr: float  # the learning rate this update used


def _ddp(net: nn.Module, rt: Runtime) -> DistributedDataParallel:
    # BERT's buffers (position ids) are constants: no need to sync them at every forward.
    new_api = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    no_buffer_sync: dict[str, Any] = (
        {"forward_sync_buffers": False} if new_api else {"broadcast_buffers": False}
    )
    return DistributedDataParallel(
        net,
        device_ids=[rt.device.index] if rt.device.type != "cpu" else None,
        gradient_as_bucket_view=True,
        **no_buffer_sync,
    )


class Stepper:
    def __init__(
        self,
        model: BertForPreTraining,
        optimizer: torch.optim.Optimizer,
        scheduler: LRScheduler,
        rt: Runtime,
        *,
        compile: bool = False,
    ) -> None:
        self.optimizer, self.scheduler, self.rt = optimizer, scheduler, rt
        net: nn.Module = Pretraining(model)
        backend = rt.options.compile_backend  # None on XLA: it compiles its graphs anyway
        if compile and backend is not None and os.environ.get(COMPILE_SCOPE_ENV) == "layers":
            compile_layers(net, backend)  # type: ignore[arg-type]
        elif compile and backend is not None:
            net = torch.compile(net, backend=backend)  # type: ignore[assignment]
        self.ddp = _ddp(net, rt) if rt.distributed and rt.kind != "xla" else None
        self.net: nn.Module = self.ddp if self.ddp is not None else net
        self.params = list(model.parameters())

    def _contexts(self, accum: int) -> Iterator[contextlib.AbstractContextManager[Any]]:
        for i in range(accum):
            inner = self.ddp is not None and i < accum - 1
            yield self.ddp.no_sync() if inner and self.ddp is not None else contextlib.nullcontext()

    def __call__(
        self,
        batches: Iterator[Batch],
        accum: int,
        consumed: Callable[[], None] | None = None,
        before_update: Callable[[], None] | None = None,
    ) -> StepResult:
        """consumed: after each micro-batch; before_update: before the optimizer changes the
        parameters (a checkpoint's copy of them may still be running: checkpoint/staging.py)."""
        rt = self.rt
        totals = torch.zeros(3, device=rt.device, dtype=torch.float32)
        for ctx in self._contexts(accum):
            batch = next(batches)
            with ctx:
                with rt.autocast():
                    loss, mlm, nsp = self.net(**batch)
                for hook in loss_hooks:
                    loss = hook(loss)
                (loss / accum).backward()
            totals += torch.stack([loss.detach(), mlm, nsp]).float()
            if consumed is not None:
                consumed()
        rt.reduce_gradients(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, MAX_GRAD_NORM)
        lr = float(self.scheduler.get_last_lr()[0])
        if before_update is not None:
            before_update()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        rt.sync()
        return StepResult(totals, grad_norm, lr)
