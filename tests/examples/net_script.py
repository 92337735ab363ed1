"""A user's script for the safety-net tests (test_script_net.py): tiny DDP regression on gloo.

It uses every helper of trainmaster.worker the way README's "Your own training script" says:
latest_checkpoint() to resume, log_metrics() every step, preempted() every step,
checkpoint_dir()/checkpoint_saved() for atomic checkpoints, exit 143 after a preemption. The
batches are a pure function of (step, rank), so a resumed run redoes exactly the lost steps.
--hang-at R:N makes rank R stop after step N, once per job (a marker file), as a worker stuck
in a driver would: only the watchdog ends it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainmaster.worker import (
    EXIT_PREEMPTED,
    checkpoint_dir,
    checkpoint_saved,
    drop_after,
    latest_checkpoint,
    log_metrics,
    preempted,
)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--hang-at", default="")
    args = p.parse_args()
    run_dir = Path(os.environ["TRAINMASTER_RUN_DIR"])
    (run_dir / f".script-started-{os.environ['RANK']}").touch()  # the preflight test: never
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    ckpt = latest_checkpoint()
    if ckpt is not None:
        state = torch.load(ckpt / "state.pt", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(ckpt.name.removeprefix("step_"))
        drop_after(start)
        print(f"net_script: resumed from step {start}", flush=True)
    ddp = DistributedDataParallel(model)
    hang_rank, _, hang_step = args.hang_at.partition(":")
    for step in range(start + 1, args.steps + 1):
        g = torch.Generator().manual_seed(step * 100 + rank)
        x = torch.randn(16, 8, generator=g)
        loss = (ddp(x).squeeze(1) - x.sum(1)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_sleep)
        row = {"resumed_from": start} if step == start + 1 and start else {}
        log_metrics(step=step, loss=loss.item(), max_steps=args.steps, **row)
        if args.hang_at and (rank, step) == (int(hang_rank), int(hang_step)):
            marker = run_dir / ".hung-once"
            if not marker.exists():
                marker.touch()
                while True:  # stuck: only the watchdog (or a kill) ends this process
                    time.sleep(3600)
        stop = preempted()
        if step % args.checkpoint_every == 0 or step == args.steps or stop:
            folder = checkpoint_dir(step)
            if rank == 0:
                torch.save(
                    {"model": model.state_dict(), "opt": opt.state_dict()}, folder / "state.pt"
                )
            dist.barrier()  # rank 0's file is complete before it is published
            checkpoint_saved(step, keep=2)
        if stop:
            sys.exit(EXIT_PREEMPTED)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
