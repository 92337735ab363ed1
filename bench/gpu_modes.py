"""bench/gpu_bench.py's modes beyond the trainer's own step: a hand-written loop beside it, and
checkpoints taken while it trains. Each runs in a fresh child process, as the other modes do.

  handwritten  what a user writes by hand: Hugging Face's BertForPreTraining with its full MLM
               head (labels over every position), torch.optim.AdamW(fused=True), clipping to
               1.0, bf16 autocast; the same batches and micro-batch
  checkpoint   the trainer's step (eager), the same steps twice: without saves, then with a save
               every --ckpt-every steps through the trainer's writer (stage, submit, the copy
               beside the next step, before_update). The extra seconds per save is the
               stand-still that the GPU sees; the host's own wait is reported beside it
  launch       the job as a user runs it: `trainmaster launch JOB --follow` (local backend, one
               node, one worker, the trainer's own loop, compiled, a checkpoint every
               --ckpt-every of --ckpt-steps + --ckpt-every steps, preflight on), then
               `status JOB --json`: the run's own figures (summary.json: average seq/s and MFU,
               first step, compile cache and counters, stand-still per save and at the end)
               and its cost line. Its storage's cacheset is the one compile and compile_warm
               filled; its compile_counters say how many graphs it found there (the trainer's
               graphs may differ from the bench's Stepper's; compile_cache says "cold" as no
               precompile wrote the cacheset's fingerprint). Its stand-still is the waits the
               trainer recorded (timeline.jsonl), not the checkpoint mode's extra time
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
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
        writer.gpu_stalls()  # the warm-up's
        plain = run(a.ckpt_steps, None)
        saved = run(a.ckpt_steps, a.ckpt_every)
        gpu_waits = [seconds for _, seconds in writer.gpu_stalls()]  # run() ended on a sync
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
        # the training stream's own wait for the copy, timed on the GPU (what the trainer's
        # report counts with the host's); None on a CPU
        "gpu_wait_per_save_s": round(statistics.median(gpu_waits), 4) if gpu_waits else None,
        "checkpoint_gb": round(written[-1].bytes / 1e9, 3) if written else None,
        "write_mb_per_s": round(written[-1].mb_per_s, 1) if written else None,
    }


STORAGE_ENV = "TRAINMASTER_STORAGE"  # the launch mode's storage root (the CLI reads it too)
JOB = "gpu-bench"


def _job_file(a: argparse.Namespace, batch: int, root: Path, vocab: int) -> Path:
    from trainmaster.config import jobfile

    sets = [
        f'job.name="{JOB}"',
        "job.nnodes=1",
        "job.nproc_per_node=1",
        "job.max_restarts=0",
        f'model.preset="{"bert-tiny" if a.dry else "bert-large"}"',
        f"model.vocab_size={vocab}",  # the other modes' model: the corpus's vocab is smaller
        f'data.dataset="{Path(a.data).resolve()}"',
        'train.device="cpu"' if a.dry else 'train.device="cuda"',
        'train.precision="fp32"' if a.dry else 'train.precision="bf16"',
        f"train.batch_size={batch}",
        f"train.global_batch_size={batch}",
        "train.lr=1e-4",
        "train.warmup_steps=1",
        # one save more than the checkpoint mode's: the median is of the later saves, not
        # of the first, which also maps the writer's block (and page-locks it on a GPU)
        f"train.max_steps={a.ckpt_steps + a.ckpt_every}",
        f"train.checkpoint_every={a.ckpt_every}",
        f"train.compile={'false' if a.dry else 'true'}",  # a CPU compiles for minutes
    ]
    path = root / "gpu-bench.toml"
    path.write_text(jobfile.render(jobfile.preset("local-cpu", sets), "bench/gpu.sh launch"))
    return path


# The launch mode's limit: past it the job is cancelled (its supervisor would train on). A lent
# GPU machine runs one command for at most 600 s: set the variable under what is left of that.
LAUNCH_TIMEOUT_ENV = "TRAINMASTER_BENCH_LAUNCH_TIMEOUT_S"
LAUNCH_TIMEOUT_S = 3600.0


def _cli(root: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "trainmaster", "--storage", str(root), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _cancel(root: Path) -> str:
    try:
        done = _cli(root, "cancel", JOB)
    except subprocess.TimeoutExpired:
        return f"`trainmaster cancel {JOB}` did not answer: the job may still be training"
    if done.returncode != 0:
        return f"cancel failed: {(done.stderr.strip() or 'no output').splitlines()[-1]}"
    return "the job is cancelled"


# The trainer's own fallback lines, Python's warnings (torch says there why SDPA passed over a
# kernel) and torch's logged warnings and errors (W1205 12:00:00.1 ...: a graph break, a
# recompile limit): a mode's figures were measured with them, so they go with its result.
NOTE = re.compile(r"^(checkpoint|warning): |\w+Warning: |^[WE]\d{4} ")


def notes_in(lines: list[str]) -> list[str]:
    """The first five distinct NOTE lines."""
    return [x for x in dict.fromkeys(lines) if NOTE.search(x)][:5]


def launch(a: argparse.Namespace, batch: int, vocab: int) -> dict[str, Any]:
    root = Path(os.environ[STORAGE_ENV])
    job = _job_file(a, batch, root, vocab)
    t0 = time.perf_counter()
    limit = float(os.environ.get(LAUNCH_TIMEOUT_ENV) or LAUNCH_TIMEOUT_S)
    try:
        run = _cli(root, "launch", str(job), "--follow", timeout=limit)
    except subprocess.TimeoutExpired:
        # Killing the CLI that followed the job leaves its supervisor training: cancel it.
        raise SystemExit(f"trainmaster launch ran past {limit:.0f} s; {_cancel(root)}") from None
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        last = (run.stderr.strip() or run.stdout.strip() or "no output").splitlines()[-1]
        raise SystemExit(f"trainmaster launch failed ({run.returncode}): {last}")
    status = _cli(root, "status", JOB, "--json")
    if status.returncode != 0:
        raise SystemExit(f"trainmaster status failed: {status.stderr.strip()}")
    view = json.loads(status.stdout)
    s, saves = view["summary"], view["summary"]["checkpoint_saves"]
    return {
        "mode": "launch",
        "phase": view["phase"],
        "steps": s["steps"],
        "seq_per_s": s["avg_seq_per_s"],
        "mfu": s["avg_mfu"],
        "time_to_first_step_s": round(s["time_to_first_step_s"], 2),
        "wall_s": round(wall, 2),
        "compile_cache": s["compile_cache"],
        "compile_counters": s.get("compile_counters") or {},
        "saves": saves["count"],
        "standstill_per_save_s": saves.get("per_save_blocked_s"),
        "max_standstill_per_save_s": saves.get("max_per_save_blocked_s"),
        "final_wait_s": saves.get("final_wait_s"),
        "write_mb_per_s": saves["mb_per_s"],
        "goodput": s["goodput"]["ratio"],
        "final_loss": round(s["final_loss"], 4),
        "cost_line": next(
            (x.strip() for n in view["notes"] for x in n.splitlines() if "cost so far" in x), None
        ),
        # the job's fallback and warning lines, as the other modes' (NOTE)
        "notes": notes_in([*run.stdout.splitlines(), *run.stderr.splitlines()]),
    }
