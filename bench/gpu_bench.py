"""BERT-large phase 1 on one GPU, eager and torch.compile: what bench/gpu.sh runs.

    python bench/gpu_bench.py [--steps 50] [--batch 0] [--peak-tflops T] [--dry]
        [--modes eager,compile,compile_warm,profile,compile_layers,handwritten,checkpoint,launch]
        [--ckpt-steps 250] [--ckpt-every 100]

The modes, each in a fresh process, in this order: eager; compile with an empty compile cache
(cold) and compile_warm with the cache compile left (the trainer's cache settings,
compile/cache.py), which is what a restarted or precompiled job meets; profile, a few compiled
steps in that cache under torch.profiler: GPU busy share, device time by kind of kernel, the
attention kernel, syncs per step (gpu_profile.py); compile_layers, cold in
a cache of its own, each encoder layer and the head compiled alone (TRAINMASTER_COMPILE_SCOPE=
layers: one layer traced instead of 24); handwritten, a loop as a
user writes it (gpu_modes.py); checkpoint, the trainer's eager step without saves and then with
a bert-large + Adam checkpoint every --ckpt-every steps (the stand-still per save); launch, the
whole job through `trainmaster launch` and `status --json` (--ckpt-steps + --ckpt-every steps,
compiled, in compile's cacheset: its compile_counters say how much it found there;
gpu_modes.py). "summary" gathers the headline figures.

Seq 128, max_pred 20, vocab 30,522, bf16 autocast, one GPU, the trainer's own parts: model
(masked-positions-only MLM head, SDPA attention), fused AdamW, Stepper, ShardLoader and the
runtime's pinned non-blocking copies (trainmaster.train.device.options_for("cuda")). Sequences
are the built-in corpus prepared in a temp folder. --batch 0 fits the micro-batch: the largest
of 512, 256, ... whose two eager steps, in a process of their own, reserve at most 85% of the
GPU's memory (NVIDIA used 256 on an A100-80GB). Each mode runs in a fresh process, so
time_to_first_step_s counts the imports, CUDA start-up, model build and (compile) compilation,
as a job's first step does. The timed
steps are --steps after --warmup, the host reading the loss only at the end (as the trainer's
CUDA path reads it every options.sync_every steps).

MFU = seq/s x FLOPs per sequence (model.flops_per_seq, masked head) / the GPU's dense bf16 peak
from the catalog (A100 from p4d.24xlarge, H100 from p5.48xlarge, H200 from p5e.48xlarge), or
--peak-tflops. --dry runs on the CPU (bert-tiny, fp32, 2 steps, batch 4): arguments and JSON
shape.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STARTED = time.time()
SEQ, PRED, VOCAB = 128, 20, 30522
CANDIDATES = (512, 256, 128, 64, 32, 16, 8)
MODES = (
    "eager",
    "compile",
    "compile_warm",
    "profile",
    "compile_layers",
    "handwritten",
    "checkpoint",
    "launch",
)
# NVIDIA's own figure for this workload on one GPU (phase 1, seq 128): AMP fp16, micro-batch
# 256 accumulated to 8,192 sequences per GPU, NGC 21.11; NVIDIA/DeepLearningExamples
# PyTorch/LanguageModeling/BERT/README.md (commit 729963d), table "Pre-training NVIDIA DGX A100
# (8x A100 80GB)", 1 GPU row. Printed beside ours; not measured here.
PUBLISHED = {
    "gpu": "A100-80GB",
    "seq_per_s": 580,
    "precision": "AMP fp16, micro-batch 256",
    "source": "NVIDIA/DeepLearningExamples PyTorch/LanguageModeling/BERT/README.md "
    "(729963d), Pre-training NVIDIA DGX A100 (8x A100 80GB), 1 GPU",
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="bench/gpu.sh",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--dry", action="store_true", help="CPU, bert-tiny, 2 steps: shape only")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per mode (50; dry 2)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (5; dry 1)")
    ap.add_argument("--batch", type=int, default=None, help="micro-batch; 0 = fit (dry 4)")
    ap.add_argument(
        "--modes",
        default=",".join(MODES),
        help="comma-separated, of: " + ", ".join(MODES) + " (compile_warm reuses compile's cache)",
    )
    ap.add_argument("--ckpt-steps", type=int, default=None, help="checkpoint mode: steps (250)")
    ap.add_argument(
        "--ckpt-every", type=int, default=None, help="checkpoint mode: save every (100)"
    )
    ap.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the GPU's dense bf16 peak, when the catalog does not know it",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: one mode
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--check-args", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        ap.error(
            f"--modes: unknown {', '.join(bad) or 'empty list'}; choose from {', '.join(MODES)}"
        )
    a.modes = modes
    a.steps = a.steps if a.steps is not None else (2 if a.dry else 50)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.dry else 5)
    a.batch = a.batch if a.batch is not None else (4 if a.dry else 0)
    a.ckpt_steps = a.ckpt_steps if a.ckpt_steps is not None else (4 if a.dry else 250)
    a.ckpt_every = a.ckpt_every if a.ckpt_every is not None else (2 if a.dry else 100)
    if a.ckpt_every < 1 or a.ckpt_steps <= a.ckpt_every:
        ap.error("--ckpt-every must be at least 1 and below --ckpt-steps")
    for name in ("steps", "warmup", "batch"):
        if getattr(a, name) < (1 if name == "steps" else 0):
            ap.error(f"--{name} must be {'at least 1' if name == 'steps' else 'non-negative'}")
    return a


def _setup(a: argparse.Namespace, mode: str, batch: int) -> tuple[Any, Any, Any, Any]:
    """(runtime, stepper, batch iterator, flops per sequence) with the trainer's own parts."""
    import torch  # noqa: F401 - after the argument checks (a typo costs no torch import)

    from trainmaster.config import jobfile
    from trainmaster.data import shards as fmt
    from trainmaster.train import model, optim
    from trainmaster.train.data import ShardLoader
    from trainmaster.train.dataset import Position
    from trainmaster.train.device import Runtime
    from trainmaster.train.preflight import Env
    from trainmaster.train.step import Stepper

    kind = "cpu" if a.dry else "cuda"
    precision = _precision(a)
    cfg = jobfile.preset(
        "local-cpu",
        [
            f'model.preset="{"bert-tiny" if a.dry else "bert-large"}"',
            f'train.precision="{precision}"',
            f'train.device="{kind}"',
            "train.lr=1e-4",
            "train.max_steps=100000",
            f"data.seq_len={SEQ}",
            f"data.max_pred={PRED}",
        ],
    )
    rt = Runtime(Env(), kind, bf16=precision == "bf16")
    home = model.home_of(rt.kind, rt.device)  # as the trainer does: on the GPU itself
    bert = model.build(cfg, VOCAB, rt.options.attn_implementation, home).to(rt.device)
    opt = optim.make_optimizer(cfg, bert, kind)
    compiled = mode.startswith("compile")
    stepper = Stepper(bert, opt, optim.make_scheduler(cfg, opt), rt, compile=compiled)
    loader = ShardLoader(
        fmt.list_shards(Path(a.data)),
        rank=0,
        world=1,
        batch_size=batch,
        seed=1,
        vocab_size=VOCAB,
        start=Position(),
    )
    return rt, stepper, rt.batches(loader), model.flops_for(cfg, VOCAB)


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _precision(a: argparse.Namespace) -> str:
    """bf16 on the GPU; fp32 in the dry run (bf16 matmuls crawl on a CPU without AVX512-BF16)."""
    return "fp32" if a.dry else "bf16"


# What a micro-batch may take of the GPU's memory in the fit: the other modes need more than the
# eager Stepper (the hand-written loop runs the MLM head on every position; the launch's trainer
# stages checkpoints), and the fit's own peak is the Stepper's alone.
FIT_SHARE = 0.85


def fit_probe(a: argparse.Namespace) -> dict[str, Any]:
    """In a child of its own (`--child fit`): two eager steps of the micro-batch. The second
    step's peak holds AdamW's state, which the first step's optimizer only creates; a child
    leaves no weights or CUDA cache behind in the parent, and any allocation failure (cuBLAS's
    handle too, which the backward makes at its peak) ends only the child."""
    import torch

    _, stepper, batches, _ = _setup(a, "eager", a.batch)
    stepper(batches, 1)
    float(stepper(batches, 1).losses[0])
    if a.dry:
        return {"fits": True}
    reserved, total = (
        torch.cuda.max_memory_reserved(),
        torch.cuda.get_device_properties(0).total_memory,
    )
    return {"fits": reserved <= FIT_SHARE * total, "reserved_gib": round(reserved / 2**30, 1)}


def failure(proc: subprocess.CompletedProcess[str]) -> str:
    """A child's failure in one line: its last line of stderr, and the signal that ended it (the
    kernel's out-of-memory killer says nothing on stderr)."""
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    if proc.returncode < 0:
        try:
            killed = f"killed by {signal.Signals(-proc.returncode).name}"
        except ValueError:  # a real-time signal has no name
            killed = f"killed by signal {-proc.returncode}"
        if last:
            return f"{killed} after: {last}"
        return f"{killed} (out of host memory?)" if proc.returncode == -9 else killed
    return last or f"exit {proc.returncode} with no output"


def _fits(a: argparse.Namespace, batch: int) -> tuple[bool, str]:
    """Whether `batch` fits, probed in a child of its own, and why (its peak or its end)."""
    cmd = [sys.executable, __file__, "--child", "fit", "--batch", str(batch), "--data", a.data]
    cmd += ["--dry"] if a.dry else []
    proc = subprocess.run(cmd, capture_output=True, text=True)
    said = proc.stdout.strip().splitlines()
    probe = json.loads(said[-1]) if proc.returncode == 0 and said else {"fits": False}
    if "reserved_gib" in probe:
        why = f"a peak of {probe['reserved_gib']} GiB reserved"
    elif proc.returncode != 0:
        why = failure(proc)
    else:
        why = "no GPU memory to count"
    print(f"gpu_bench: micro-batch {batch}: fits={probe['fits']} ({why})", file=sys.stderr)
    return bool(probe["fits"]), why


def _pick(a: argparse.Namespace) -> tuple[int, str]:
    """The first of CANDIDATES (largest first) that fits, or 0; with the last reason given."""
    why = "none tried"
    for batch in CANDIDATES:
        fits, why = _fits(a, batch)
        if fits:
            return batch, why
    return 0, why


def child(a: argparse.Namespace) -> dict[str, Any]:
    """One mode in this (fresh) process; the figures of that mode."""
    import torch

    mode, batch = a.child, a.batch
    cuda = not a.dry
    if cuda and mode != "launch":  # launch trains in processes of its own: no CUDA here
        torch.cuda.reset_peak_memory_stats()
    if mode == "fit":
        return fit_probe(a)
    if mode == "profile":
        import gpu_profile  # beside this file: the script's folder is on sys.path

        return gpu_profile.profile(a, batch, _setup)
    if mode in ("handwritten", "checkpoint", "launch"):
        import gpu_modes

        if mode == "launch":
            return gpu_modes.launch(a, batch, VOCAB)
        run = gpu_modes.handwritten if mode == "handwritten" else gpu_modes.checkpoint
        return run(a, batch, _setup)
    rt, stepper, batches, flops = _setup(a, mode, batch)
    float(stepper(batches, 1).losses[0])  # the first step: compiled here in compile mode
    first = time.time() - STARTED
    for _ in range(max(0, a.warmup - 1)):
        stepper(batches, 1)
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        result = stepper(batches, 1)
    loss = float(result.losses[0])  # the one host read of the timed steps (waits for the GPU)
    seconds = time.perf_counter() - t0
    seq_s = a.steps * batch / seconds
    peak = _peak_tflops(a, rt)
    return {
        "mode": mode,
        "seq_per_s": round(seq_s, 2),
        "mfu": round(seq_s * flops / (peak * 1e12), 4) if peak else None,
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        "time_to_first_step_s": round(first, 2),
        "timed_steps": a.steps,
        "step_s": round(seconds / a.steps, 4),
        "final_loss": round(loss, 4),
    }


def _peak_tflops(a: argparse.Namespace, rt: Any) -> float | None:
    if a.peak_tflops:
        return float(a.peak_tflops)
    if a.dry:
        return None
    from trainmaster import catalog

    known = catalog.peak_for_device(rt.device_name)
    return known[0] if known else None


def _run_child(
    a: argparse.Namespace, mode: str, batch: int, data: Path, cache: Path
) -> dict[str, Any]:
    """One mode in a fresh process; the compile modes share one empty compile cache, so that
    compile runs cold and compile_warm after it warm (the trainer's cache settings). The cache
    is the default cacheset of the launch mode's storage (STORAGE/cache/default)."""
    from gpu_modes import STORAGE_ENV, notes_in
    from trainmaster.compile.cache import env
    from trainmaster.train.step import COMPILE_SCOPE_ENV

    cmd = [
        sys.executable,
        __file__,
        "--child",
        mode,
        "--batch",
        str(batch),
        "--data",
        str(data),
        "--steps",
        str(a.steps),
        "--warmup",
        str(a.warmup),
        "--modes",
        mode,
        "--ckpt-steps",
        str(a.ckpt_steps),
        "--ckpt-every",
        str(a.ckpt_every),
    ]
    cmd += ["--dry"] if a.dry else []
    cmd += ["--peak-tflops", str(a.peak_tflops)] if a.peak_tflops else []
    environ = dict(os.environ)
    if mode == "compile_layers":  # cold too, in a cache of its own
        environ |= env("inductor", cache.with_name("layers-cache")) | {COMPILE_SCOPE_ENV: "layers"}
    elif mode.startswith("compile") or mode == "profile":
        environ |= env("inductor", cache)
    elif mode == "launch":  # the launcher sets the cache's variables from the job's cacheset
        environ |= {STORAGE_ENV: str(cache.parents[1])}
        if a.peak_tflops:  # the trainer's MFU on the same peak as the other modes
            environ |= {"TRAINMASTER_PEAK_TFLOPS": str(a.peak_tflops)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=environ)
    if proc.returncode != 0:
        return {"mode": mode, "error": failure(proc)}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    # A fallback says so on stderr (a staging block the driver would not page-lock, writes
    # without O_DIRECT): the figures beside it were measured that way, so it goes with them.
    notes = notes_in([*result.get("notes", []), *proc.stderr.splitlines()])
    if notes:
        result["notes"] = notes
    return result


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The headline figures, from the modes that ran (None where a mode did not run)."""
    by = {r["mode"]: r for r in results if "error" not in r}

    def get(mode: str, key: str) -> Any:
        return by.get(mode, {}).get(key)

    ours, hand = (
        get("compile", "seq_per_s") or get("eager", "seq_per_s"),
        get("handwritten", "seq_per_s"),
    )
    return {
        "seq_per_s_eager": get("eager", "seq_per_s"),
        "seq_per_s_compiled": get("compile_warm", "seq_per_s") or get("compile", "seq_per_s"),
        "mfu_compiled": get("compile_warm", "mfu") or get("compile", "mfu"),
        "first_step_s_eager": get("eager", "time_to_first_step_s"),
        "first_step_s_compile_cold": get("compile", "time_to_first_step_s"),
        "first_step_s_compile_warm": get("compile_warm", "time_to_first_step_s"),
        "first_step_s_compile_layers_cold": get("compile_layers", "time_to_first_step_s"),
        "seq_per_s_compile_layers": get("compile_layers", "seq_per_s"),
        "standstill_per_save_s": get("checkpoint", "standstill_per_save_s"),
        "vs_handwritten": round(ours / hand, 3) if ours and hand else None,
        "seq_per_s_launch": get("launch", "seq_per_s"),
        "mfu_launch": get("launch", "mfu"),
        "first_step_s_launch": get("launch", "time_to_first_step_s"),
        "standstill_per_save_s_launch": get("launch", "standstill_per_save_s"),
        "cost_line_launch": get("launch", "cost_line"),
        "gpu_busy_compiled": get("profile", "gpu_busy"),
        "syncs_per_step": get("profile", "syncs_per_step"),
        "attention_kernel": get("profile", "attention"),
    }


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.check_args:
        return 0
    if a.child:
        print(json.dumps(child(a)), flush=True)
        return 0
    from trainmaster.data.prepare import prepare

    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "pydoc"
        prepare(
            builtin="pydoc",
            output=data,
            seq_len=SEQ,
            max_pred=PRED,
            vocab_size=4096,
            dupe_factor=1 if a.dry else 5,
            shards=1,
            workers=1,
        )
        batch = a.batch
        if batch == 0:
            a.data = str(data)
            batch, last = _pick(a)
            if batch == 0:
                print(
                    json.dumps(
                        {"error": f"not even a micro-batch of {CANDIDATES[-1]} fits (last: {last})"}
                    )
                )
                return 1
        cache = Path(d) / "storage" / "cache" / "default"
        cache.mkdir(parents=True)
        print(f"gpu_bench: micro-batch {batch}", file=sys.stderr, flush=True)
        results = []
        for mode in a.modes:
            # Each mode's result as it comes, on stderr: a run stopped at a time limit (a lent
            # machine's command has 600 s) still leaves what it measured in its output.
            t0 = time.perf_counter()
            results.append(_run_child(a, mode, batch, data, cache))
            took = f"{time.perf_counter() - t0:.0f} s"
            print(
                f"gpu_bench: {mode} ({took}): {json.dumps(results[-1])}",
                file=sys.stderr,
                flush=True,
            )
    import torch

    cuda = torch.cuda.is_available() and not a.dry
    print(
        json.dumps(
            {
                "bench": "gpu",
                "dry": a.dry,
                "model": "bert-tiny" if a.dry else "bert-large",
                "device": torch.cuda.get_device_name(0) if cuda else "cpu",
                "gpus": 1,
                "seq_len": SEQ,
                "max_pred": PRED,
                "precision": _precision(a),
                "micro_batch": batch,
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
                "transformers": _version("transformers"),
                "python": sys.executable,
                "results": results,
                "summary": summary(results),
                "published": PUBLISHED,
            }
        )
    )
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
