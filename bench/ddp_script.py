"""The custom script of bench/launch_overhead.py: a small DDP job any launcher can start.

    torchrun --nnodes 2 --nproc-per-node 1 ... bench/ddp_script.py [--steps 2]

Plain torch and one trainmaster helper: log_metrics writes rank 0's step rows to
$TRAINMASTER_RUN_DIR/metrics.jsonl (the run folder under `trainmaster launch`; the bench sets
it for torchrun and TorchX), whose first row is the moment the bench times, with rank 0's CPU
seconds until then. The model is tiny on purpose: what is measured is the launcher, not the step.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainmaster.worker import log_metrics


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, args.steps + 1):
        loss = model(torch.randn(16, 64)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        # cpu_s: this process's CPU seconds so far (the bench compares launchers by it too)
        log_metrics(step=step, loss=loss.item(), cpu_s=round(time.process_time(), 3))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
