"""Our checkpoint writer against torch.distributed.checkpoint.async_save, on one training loop.

    python bench/checkpoint_vs_dcp.py [--model bert-base] [--steps 24] [--every 4] [--rounds 2]
                                      [--out FILE]

Run it with each stack's Python (`.venv/bin/python`, `.venv-trn1/bin/python`): it measures the
torch it runs on. One process, a world-1 gloo process group, BERT (fp32, micro-batch 2, seq 128,
20 masked positions) and AdamW on the CPU, the same random batch every step, loops that differ
only in how a checkpoint of model + optimizer is taken every --every steps:

  none  no checkpoint
  ours  train/checkpoint: the live tensors copied into the shared block beside the next forward
        and backward, awaited before the next optimizer step (the trainer's `stage`, `submit`,
        `before_update`), and written by the long-lived writer process, O_DIRECT, into a
        temporary folder renamed when complete
  ours_copy_waited  the same, but the save call itself waits for the copy (as before the copy
        ran beside the next step): what the overlap saves, side by side
  dcp   torch.distributed.checkpoint.async_save(async_checkpointer_type=PROCESS) with a
        DefaultStager (shared memory, async staging; pinned memory and non-blocking copies only
        where CUDA is), the state dicts from get_state_dict(); staging overlaps the next
        forward and backward and is awaited before the next optimizer step

Both keep at most one write in flight (the next save first waits for the previous one) and both
writers are started, and warmed with one save, before the timed steps. For each: the effective
seconds per step (the loop's wall time / steps) against `none` of the same round, the median
stand-still per save (the training thread's time in the save, and in DCP's wait for staging),
the median write time (save call to file on disk) and the bytes on disk. The rounds alternate
the order. Prints one JSON object; no assertions (docs/architecture.md 4).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchlib import emit, load, machine
from trainmaster.config import jobfile
from trainmaster.train.checkpoint import BackgroundWriter, Staged, detached
from trainmaster.train.model import Pretraining, build

VARIANTS = ("none", "ours", "ours_copy_waited", "dcp")
SEQ, PRED, BATCH = 128, 20, 2


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def setup(model_name: str) -> tuple[Pretraining, torch.optim.Optimizer, dict[str, torch.Tensor]]:
    cfg = jobfile.preset("local-cpu", [f'model.preset="{model_name}"'])
    net = Pretraining(build(cfg, 30522))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(0, 30522, (BATCH, SEQ), generator=g),
        "token_type_ids": torch.zeros(BATCH, SEQ, dtype=torch.long),
        "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long),
        "mlm_positions": torch.randint(1, SEQ, (BATCH, PRED), generator=g),
        "mlm_labels": torch.randint(0, 30522, (BATCH, PRED), generator=g),
        "nsp_labels": torch.zeros(BATCH, dtype=torch.long),
    }
    return net, opt, batch


class Ours:
    """The trainer's way (train/loop.py `_save`): wait, stage the live tensors, submit."""

    def __init__(self, folder: Path, copy_waited: bool = False) -> None:
        self.copy_waited = copy_waited
        self.writer = BackgroundWriter(folder, keep=2, on_written=self._written)
        self.writer.start()
        self.written: list[float] = []
        self.submitted = 0.0

    def _written(self, w: Any) -> None:  # from the save call on, as for DCP
        self.written.append(w.started + w.seconds - self.submitted)

    def save(self, step: int, net: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        self.writer.wait()
        self.writer.gpu_stalls()  # read, so that a GPU run holds no timing events (unused here)
        self.submitted = time.time()
        trainer = {"optimizer": detached(opt.state_dict()), "step": step}
        meta = {"format": 1, "step": step}
        self.writer.submit(Staged(step, detached(net.state_dict()), trainer, [], meta))
        if self.copy_waited:
            self.writer.before_update()

    def before_step(self) -> None:
        self.writer.before_update()  # the copy into the block ran beside forward and backward

    def drain(self) -> None:
        self.writer.wait()

    def close(self) -> None:
        self.writer.wait()
        self.writer.close()


class Dcp:
    """torch's asynchronous checkpoint in process mode, as torchtitan uses it."""

    def __init__(self, folder: Path) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        cuda = torch.cuda.is_available()
        self.stager = DefaultStager(StagingOptions(cuda, True, True, cuda))
        self.folder, self.written = folder, []  # type: ignore[var-annotated]
        self.response: Any = None  # torch's AsyncSaveResponse of the write in flight
        self.kept: list[Path] = []

    def save(self, step: int, net: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        self.drain()
        model_sd, optim_sd = get_state_dict(net, opt)
        path = self.folder / f"step_{step}"
        t0 = time.perf_counter()
        self.response = dcp.async_save(
            {"model": model_sd, "optim": optim_sd, "step": step},
            checkpoint_id=str(path),
            async_checkpointer_type=AsyncCheckpointerType.PROCESS,
            async_stager=self.stager,
        )
        self.response.upload_completion.add_done_callback(
            lambda _: self.written.append(time.perf_counter() - t0)
        )
        self.kept.append(path)

    def before_step(self) -> None:
        if self.response is not None:
            self.response.staging_completion.result()

    def drain(self) -> None:
        if self.response is not None:
            self.response.upload_completion.result()
            self.response = None
        for old in self.kept[:-2]:
            shutil.rmtree(old, ignore_errors=True)
        self.kept = self.kept[-2:]

    def close(self) -> None:
        self.drain()
        self.stager.close()


def loop(variant: str, model_name: str, steps: int, every: int, folder: Path) -> dict[str, Any]:
    net, opt, batch = setup(model_name)
    savers: dict[str, Callable[[Path], Ours | Dcp]] = {
        "ours": Ours,
        "ours_copy_waited": lambda f: Ours(f, copy_waited=True),
        "dcp": Dcp,
    }
    saver = savers[variant](folder) if variant in savers else None
    stalls: list[float] = []  # per save: the save call, then the wait before the next update

    def step() -> None:
        net(**batch)[0].backward()
        if saver is not None:
            t = time.perf_counter()
            saver.before_step()
            if stalls:
                stalls[-1] += time.perf_counter() - t
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    if saver is not None:  # the writer's start-up and first save are not what we time
        saver.save(0, net, opt)
        step()
        saver.drain()
        saver.written.clear()
    t0 = time.perf_counter()
    for n in range(1, steps + 1):
        step()
        if saver is not None and n % every == 0 and n < steps:
            t = time.perf_counter()
            saver.save(n, net, opt)
            stalls.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    if saver is not None:
        saver.drain()
    kept = [p for p in folder.iterdir() if p.name.startswith("step_")]
    size = sum(f.stat().st_size for p in kept for f in p.rglob("*") if f.is_file())
    result = {
        "effective_s_per_step": round(wall / steps, 4),
        "saves": len(stalls),
        "median_standstill_s": round(statistics.median(stalls), 4) if stalls else 0.0,
        "median_write_s": round(statistics.median(saver.written), 3) if saver else 0.0,
        "bytes_per_checkpoint": size // len(kept) if kept else 0,
    }
    if saver is not None:
        saver.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bert-base", help="bert-tiny | bert-base | bert-large")
    ap.add_argument("--steps", type=int, default=24, help="timed steps per loop")
    ap.add_argument("--every", type=int, default=4, help="a checkpoint every N steps")
    ap.add_argument("--rounds", type=int, default=2, help="run the variants this many times")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29731")
    dist.init_process_group("gloo", rank=0, world_size=1)
    started, load_before, rounds = time.time(), load(), []
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-dcp-") as d:
        for r in range(args.rounds):
            results = {}
            for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                folder = Path(d) / f"{variant}-{r}"
                folder.mkdir()
                say(f"round {r + 1}/{args.rounds}: {variant} ...")
                results[variant] = loop(variant, args.model, args.steps, args.every, folder)
                say(f"  {results[variant]}")
                shutil.rmtree(folder)
            rounds.append({v: results[v] for v in VARIANTS})
    ratios = {
        v: [
            round(x[v]["effective_s_per_step"] / x["none"]["effective_s_per_step"], 3)
            for x in rounds
        ]
        for v in VARIANTS
    }
    dist.destroy_process_group()
    emit(
        {
            "bench": "checkpoint_vs_dcp",
            "what": f"{args.model} + AdamW, fp32, micro-batch {BATCH}, {args.steps} steps, a "
            f"checkpoint every {args.every}, {args.rounds} round(s), torch {torch.__version__}",
            "command": "python bench/checkpoint_vs_dcp.py " + " ".join(sys.argv[1:]),
            "machine": machine(),
            "load_before": load_before,
            "load_after": load(),
            "seconds": round(time.time() - started, 1),
            "rounds": rounds,
            "effective_step_vs_none": {v: statistics.median(x) for v, x in ratios.items()},
            "effective_step_vs_none_per_round": ratios,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
