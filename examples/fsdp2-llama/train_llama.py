"""A small Llama-style decoder trained with FSDP2 and torch.distributed.checkpoint: your own script.

    cd /path/to/trainmaster && trainmaster launch examples/fsdp2-llama/job.toml --follow

The model is Llama's shape at toy size: RMSNorm before each sublayer, rotary position
embeddings, causal attention (SDPA), a SwiGLU MLP, no biases, untied output head, no dropout.
Every block and then the whole model is sharded with FSDP2 (`fully_shard`): each rank holds a
slice of every parameter and of the AdamW state. Checkpoints are torch.distributed.checkpoint
(DCP) saves: every rank writes its own shards into one folder, in parallel, and a resume on any
number of ranks reads them back resharded.

The same file runs on CPU (gloo, fp32) and, unchanged, on CUDA (nccl, bf16 parameters with
fp32 gradient reduction). Batches are a pure function of (seed, step, rank) and the learning
rate of the step, so a resumed run redoes exactly the steps the lost one would have done.
What trainmaster adds (trainmaster.worker, a few lines below): progress for the hang watchdog
and goodput (log_metrics), atomic checkpoint folders (checkpoint_dir, checkpoint_saved),
the resume point (latest_checkpoint) and a same-step stop on SIGTERM (preempted).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F  # noqa: N812 - the usual name
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

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


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a small Llama-style decoder with FSDP2.")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


def rotary(seq_len: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(seq_len).float(), inv)
    return angles.cos(), angles.sin()


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x[..., ::2], x[..., 1::2]
    # type_as: under bf16 parameters (CUDA) q and k stay bf16, as v is, for SDPA
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).type_as(x)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, hidden = heads, 4 * dim * 2 // 3  # SwiGLU keeps the MLP's parameter count
        self.attn_norm, self.mlp_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            self.qkv(self.attn_norm(x)).view(b, t, 3, self.heads, -1).transpose(1, 3).unbind(2)
        )
        att = F.scaled_dot_product_attention(
            rope(q, cos, sin), rope(k, cos, sin), v, is_causal=True
        )
        x = x + self.out(att.transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, layers: int, dim: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, dim)  # bytes: no tokenizer
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm, self.head = nn.RMSNorm(dim), nn.Linear(dim, 256, bias=False)
        cos, sin = rotary(seq_len, dim // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        t = idx.shape[1]
        for block in self.blocks:
            x = block(x, self.cos[:t], self.sin[:t])
        return self.head(self.norm(x))


def batch(data: torch.Tensor, step: int, rank: int, a: argparse.Namespace) -> torch.Tensor:
    g = torch.Generator().manual_seed(a.seed * 1_000_003 + step * 997 + rank)
    starts = torch.randint(0, len(data) - a.seq_len - 1, (a.batch_size,), generator=g).tolist()
    return torch.stack([data[s : s + a.seq_len + 1] for s in starts])


def lr_at(step: int, a: argparse.Namespace) -> float:
    if step <= a.warmup:
        return a.lr * step / a.warmup
    return a.lr * (
        0.1 + 0.45 * (1 + math.cos(math.pi * (step - a.warmup) / max(1, a.steps - a.warmup)))
    )


def main() -> None:
    a = parse()
    cuda = torch.cuda.is_available()
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        if cuda
        else torch.device("cpu")
    )
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(a.seed)  # the same initial weights on every rank, then sharded
    model = Llama(a.layers, a.dim, a.heads, a.seq_len).to(device)
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if cuda
        else MixedPrecisionPolicy()
    )
    for block in model.blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1)

    start, ckpt = 0, latest_checkpoint()  # TRAINMASTER_CHECKPOINT_DIR/step_N, or None
    if ckpt is not None:  # every rank reads its own shards back
        model_sd, optim_sd = get_state_dict(model, opt)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(ckpt))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = int(ckpt.name.removeprefix("step_"))
        drop_after(start)  # rows of the redone steps go (rank 0)
        if rank == 0:
            print(f"train_llama: resumed from step {start} ({ckpt})", flush=True)
    text = "\n\n".join("\n".join(doc) for doc in pydoc_documents()).encode("utf-8")
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()

    for step in range(start + 1, a.steps + 1):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, a)
        seq = batch(data, step, rank, a).to(device)
        loss = F.cross_entropy(model(seq[:, :-1]).flatten(0, 1).float(), seq[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        dist.all_reduce(mean := loss.detach().clone())
        log_metrics(step=step, loss=mean.item() / world, lr=lr_at(step, a), max_steps=a.steps)
        stop = preempted()  # SIGTERM on any rank: every rank stops here, at this step
        if stop or step % a.checkpoint_every == 0 or step == a.steps:
            model_sd, optim_sd = get_state_dict(model, opt)
            dcp.save(
                {"model": model_sd, "optim": optim_sd}, checkpoint_id=str(checkpoint_dir(step))
            )
            checkpoint_saved(step, keep=2)  # rank 0 renames the folder to step_N: complete
        if stop:
            sys.exit(EXIT_PREEMPTED)

    full = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if rank == 0:
        h = hashlib.sha256()
        for name, value in sorted(full.items()):
            h.update(name.encode() + value.float().numpy().tobytes())
        print(
            f"train_llama: done at step {a.steps}, parameters sha256 {h.hexdigest()[:16]}",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
