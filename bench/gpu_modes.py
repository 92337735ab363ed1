"""bench/gpu_bench.py's modes beyond the trainer's own step: a hand-written loop beside it, and
checkpoints taken while it trains. Each runs in a fresh child process, as the other modes do.

  handwritten  what a user writes by hand: Hugging Face's BertForPreTraining with its full MLM
               head (labels over every position), torch.optim.AdamW(fused=True), clipping to
               1.0, bf16 autocast; the same batches and micro-batch
  checkpoint   the trainer's step (eager), the same steps twice: without saves, then with a save
               every --ckpt-every steps through the trainer's writer (stage, submit, the copy
               beside the next step, before_update). The extra seconds per save is the
               stand-still that the GPU sees; the host's own wait is reported beside it
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def handwritten(a: argparse.Namespace, batch: int, setup: Any) -> dict[str, Any]:
    import torch
    from transformers import BertForPreTraining

    from trainmaster.train.dataset import IGNORE

    rt, stepper, batches, _ = setup(a, "eager", batch)
    net = BertForPreTraining(stepper.net.model.config).to(rt.device)  # same size, own weights
    del stepper
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=rt.device.type == "cuda")

    def step() -> torch.Tensor:
        b = next(batches)
        # labels over every position, built on the device (no host read)
        slots = torch.where(b["mlm_labels"] == IGNORE, 0, b["mlm_positions"])
        labels = torch.full_like(b["input_ids"], IGNORE).scatter_(1, slots, b["mlm_labels"])
        with rt.autocast():
            out = net(
                input_ids=b["input_ids"],
                token_type_ids=b["token_type_ids"],
                attention_mask=b["attention_mask"],
                labels=labels,
                next_sentence_label=b["nsp_labels"],
            )
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss.detach()

    float(step())
    for _ in range(max(0, a.warmup - 1)):
        step()
    if rt.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    final = float(loss)  # the one host read of the timed steps
    seconds = time.perf_counter() - t0
    return {
        "mode": "handwritten",
        "seq_per_s": round(a.steps * batch / seconds, 2),
        "step_s": round(seconds / a.steps, 4),
        "final_loss": round(final, 4),
    }


def checkpoint(a: argparse.Namespace, batch: int, setup: Any) -> dict[str, Any]:
    import torch

    from trainmaster.train.checkpoint import BackgroundWriter, stage
    from trainmaster.train.dataset import Position

    rt, stepper, batches, _ = setup(a, "eager", batch)
    bert, scheduler = stepper.net.model, stepper.scheduler  # one process: no DDP wrapper
    written: list[Any] = []
    host_waits: list[float] = []
    with tempfile.TemporaryDirectory(prefix="gpu-bench-ckpt-") as d:
        writer = BackgroundWriter(Path(d), keep=1, on_written=written.append)
        writer.start()

        def update_wait() -> None:
            waited = writer.before_update()
            if waited is not None:
                host_waits[-1] += waited

        def run(steps: int, every: int | None) -> float:
            if rt.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for n in range(1, steps + 1):
                result = stepper(batches, 1, None, update_wait)
                if every and n % every == 0 and n < steps:
                    t = time.perf_counter()
                    writer.wait()
                    staged = stage(
                        step=n,
                        rt=rt,
                        model=bert,
                        optimizer=stepper.optimizer,
                        scheduler=scheduler,
                        position=Position(),
                        meta={"job": "gpu-bench"},
                        host=False,
                    )
                    assert staged is not None
                    writer.submit(staged)
                    host_waits.append(time.perf_counter() - t)
            float(result.losses[0])
            return time.perf_counter() - t0

        run(max(2, a.warmup), 1)  # warm: the writer process up, its block sized (and pinned)
        writer.wait()
        host_waits.clear()
        plain = run(a.ckpt_steps, None)
        saved = run(a.ckpt_steps, a.ckpt_every)
        writer.wait()
        writer.close()
    saves = len(host_waits)
    return {
        "mode": "checkpoint",
        "steps_each": a.ckpt_steps,
        "save_every": a.ckpt_every,
        "saves": saves,
        "seq_per_s_without_saves": round(a.ckpt_steps * batch / plain, 2),
        "seq_per_s_with_saves": round(a.ckpt_steps * batch / saved, 2),
        "standstill_per_save_s": round((saved - plain) / saves, 3) if saves else None,
        "host_wait_per_save_s": round(statistics.median(host_waits), 4) if saves else None,
        "checkpoint_gb": round(written[-1].bytes / 1e9, 3) if written else None,
        "write_mb_per_s": round(written[-1].mb_per_s, 1) if written else None,
    }
