"""A small GPT-style language model trained with plain DDP: your own script, launched by trainmaster.

    cd /path/to/trainmaster && trainmaster launch examples/custom-gpt/job.toml --follow

Nothing here is trainmaster's trainer: a byte-level causal transformer, AdamW, and a loop. What
trainmaster gives it (launch/entry.py): torchrun on every node with the job's rendezvous
(RANK, WORLD_SIZE, MASTER_ADDR... in the environment), restarts, the run folder
($TRAINMASTER_RUN_DIR with checkpoints/ and tensorboard/), rank logs, status, report, cancel.
What the script does for itself, with trainmaster.worker's helpers: log one metrics row per
step (log_metrics: also progress for the hang watchdog and goodput), save a checkpoint every
--checkpoint-every steps into a folder that becomes step_N only when complete (checkpoint_dir,
checkpoint_saved), resume from the newest (latest_checkpoint) when it starts again (after a
failure torchrun restarts every worker), and on SIGTERM save at one step on every rank and
exit 143 (preempted).

The text is the built-in corpus of `trainmaster data prepare --builtin pydoc` (Python's own
reference docs, shipped with CPython): nothing is downloaded.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 - the usual name
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainmaster.data.corpus import pydoc_documents
from trainmaster.worker import (
    EXIT_PREEMPTED,
    checkpoint_dir,
    checkpoint_saved,
    drop_after,
    latest_checkpoint,
    log_metrics,
    preempted,
)

CHECKPOINT = "gpt.pt"


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a small byte-level GPT with DDP.")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps in all")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per worker and step")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Bytes in, next-byte logits out: a vocabulary of 256 needs no tokenizer."""

    def __init__(self, layers: int, d: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(256, d), nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, 256, bias=False)
        self.head.weight = self.tok.weight  # tied, as in GPT-2
        for emb in (self.tok, self.pos):  # small, as GPT-2's: N(0, 1) would start at a huge loss
            nn.init.normal_(emb.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def corpus() -> torch.Tensor:
    text = "\n\n".join("\n".join(doc) for doc in pydoc_documents())
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()


def batch(
    data: torch.Tensor, step: int, rank: int, args: argparse.Namespace
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows, a pure function of (seed, step, rank): a resumed run sees the batches the
    lost run would have seen, with no data-loader state to save."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 997 + rank)
    starts = torch.randint(0, len(data) - args.seq_len - 1, (args.batch_size,), generator=g)
    windows = torch.stack([data[s : s + args.seq_len + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    done = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * done)))


def save(path: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    """Atomic: a temporary file in the same folder, flushed to disk, then renamed over the old
    checkpoint. A kill at any moment leaves the previous checkpoint or the new one, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as fh:
        torch.save({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main() -> None:
    args = parse()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")  # RANK, WORLD_SIZE, MASTER_*: torchrun's
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if cuda else "cpu")
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = GPT(args.layers, args.d_model, args.heads, args.seq_len).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    found = latest_checkpoint()  # TRAINMASTER_CHECKPOINT_DIR/step_N, complete, or None
    start = 0
    if found is not None:  # a restart (or --resume): every rank loads the same file
        ckpt = found / CHECKPOINT
        state = torch.load(ckpt, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = int(state["step"])
        drop_after(start)  # rank 0: rows logged after the checkpoint are logged again
        if rank == 0:
            print(f"train_gpt: resumed from step {start} ({ckpt})", flush=True)
    ddp = DistributedDataParallel(model)
    data = corpus()
    tb = None
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(
            f"train_gpt: {params} parameters, {world} workers, {len(data)} bytes of text, "
            f"steps {start + 1}..{args.steps}",
            flush=True,
        )
        tb_dir = os.environ.get("TRAINMASTER_TENSORBOARD_DIR")  # `trainmaster tensorboard JOB`
        if tb_dir:
            from torch.utils.tensorboard import SummaryWriter

            tb = SummaryWriter(tb_dir, purge_step=start + 1)

    tic = time.perf_counter()
    for step in range(start + 1, args.steps + 1):
        for group in opt.param_groups:
            group["lr"] = lr_at(step - 1, args)
        x, y = (t.to(device) for t in batch(data, step, rank, args))
        loss = F.cross_entropy(ddp(x).view(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        dist.all_reduce(mean := loss.detach().clone())
        now = time.perf_counter()
        row = {
            "loss": mean.item() / world,
            "lr": opt.param_groups[0]["lr"],
            "max_steps": args.steps,
            "tokens_per_s": round(world * args.batch_size * args.seq_len / (now - tic), 1),
        }
        if step == start + 1 and start:
            row["resumed_from"] = start
        log_metrics(step=step, **row)  # rank 0 writes; the others return at once
        if tb is not None:
            tb.add_scalar("loss", row["loss"], step)
        tic = now
        stop = preempted()  # SIGTERM on any rank: every rank stops at this step
        if step % args.checkpoint_every == 0 or step == args.steps or stop:
            if rank == 0:
                save(checkpoint_dir(step) / CHECKPOINT, step, model, opt)
            dist.barrier()  # nobody runs ahead of a checkpoint that is not on disk yet
            checkpoint_saved(step, keep=2)  # rank 0 renames the folder to step_N
        if stop:
            sys.exit(EXIT_PREEMPTED)
    if tb is not None:
        tb.close()
    if rank == 0:
        print(f"train_gpt: done, {args.steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
