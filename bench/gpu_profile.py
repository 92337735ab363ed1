"""bench/gpu_bench.py's profile mode: where one step's time goes, for issue 36's hunt.

The trainer's compiled Stepper (eager in --dry: a CPU compiles for minutes), in compile's
cacheset, so warm when compile ran before it: --warmup steps, then PROFILED_STEPS steps under
torch.profiler (CPU and CUDA activities). It reports, per step:

  gpu_busy            the share of the profiled wall time with a kernel or a copy running (the
                      union of their intervals): well below 1 the GPU waits for the host (the
                      profiler's own host overhead lowers it a little against a run without)
  categories          device time by kind of kernel (attention, gemm, optimizer, triton-fused,
                      element-wise, copy, communication, other), milliseconds per step
  attention           which SDPA kernel ran (flash, efficient, cudnn, math): the mask decides
  syncs_per_step      synchronising calls seen by torch.cuda.set_sync_debug_mode("warn")
  host_reads_per_step aten ops that read a tensor's value on the host (.item() and bool(t), both
                      through _local_scalar_dense; nonzero); on a CPU they include reads of CPU
                      tensors (AdamW's step count), which are no GPU sync
  top                 the ten kernels (CPU ops in --dry) with the most self time

With TRAINMASTER_BENCH_OUT=DIR the chrome trace goes to DIR/profile-trace.json.gz (open it in
Perfetto); the JSON carries the figures either way.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PROFILED_STEPS = 3
OUT_ENV = "TRAINMASTER_BENCH_OUT"
# Kernel name fragments, first match wins (lower case). Names as NVIDIA's libraries and
# PyTorch's own kernels carry them: cutlass/xmma/nvjet gemms, fmha/flash attention, the fused
# and foreach optimizer kernels, triton_* from inductor, NCCL, the runtime's copies.
# Inductor names its kernels after their source ops (triton_poi_fused__scaled_dot_product_...
# is a layout copy, not attention): its own come first, its matmul templates as gemm.
CATEGORIES = (
    ("communication", ("nccl",)),
    ("copy", ("memcpy", "memset")),
    ("gemm", ("triton_tem_",)),
    ("triton", ("triton_",)),
    ("attention", ("fmha", "flash", "attention", "sdpa")),
    ("optimizer", ("adam", "lpnorm", "multi_tensor_apply")),
    ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas")),
    ("elementwise", ("elementwise", "reduce_kernel", "softmax", "layer_norm", "dropout")),
)
SDPA = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
    "aten::_scaled_dot_product_attention_math": "math",
}
HOST_READS = {"aten::_local_scalar_dense", "aten::nonzero"}  # bool(t): is_nonzero calls the first


def category(kernel: str) -> str:
    low = kernel.lower()
    return next((cat for cat, keys in CATEGORIES if any(k in low for k in keys)), "other")


def busy_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Microseconds covered by at least one interval (kernels on side streams overlap)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def breakdown(
    kernels: list[tuple[str, float, float]], ops: list[str], steps: int, span_us: float
) -> dict[str, Any]:
    """The figures from the profiled steps: kernels as (name, start_us, end_us) on the device
    (empty on a CPU), ops the names of the CPU ops, span_us the profiled wall time."""
    seen = Counter(ops)
    attention = sorted({SDPA[name] for name in seen if name in SDPA})
    per_step: dict[str, float] = defaultdict(float)
    by_name: dict[str, float] = defaultdict(float)
    for name, start, end in kernels:
        per_step[category(name)] += (end - start) / 1e3 / steps
        by_name[name] += (end - start) / 1e3 / steps
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:10]
    return {
        "profiled_steps": steps,
        "step_ms": round(span_us / 1e3 / steps, 2),
        "gpu_busy": round(busy_us((s, e) for _, s, e in kernels) / span_us, 3)
        if kernels and span_us > 0
        else None,
        "categories_ms_per_step": {k: round(v, 2) for k, v in sorted(per_step.items())},
        "attention": attention,
        "host_reads_per_step": round(sum(seen[n] for n in HOST_READS) / steps, 2),
        "top_ms_per_step": [[name[:120], round(ms, 3)] for name, ms in top],
    }


def kernels_of(events: Iterable[Any]) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of what ran on the GPU: kernels and copies. record_function
    spans (Optimizer.step#AdamW.step) are listed on the device too, as user annotations: not
    kernels, and counted they would double the optimizer's time."""
    from torch.autograd import DeviceType

    return [
        (e.name, e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type == DeviceType.CUDA and not e.is_user_annotation
    ]


def _top_cpu_ops(events: Any, steps: int) -> list[list[Any]]:
    """On a CPU (no kernels): the ops with the most self time, ms per step."""
    ranked = sorted(events.key_averages(), key=lambda e: -e.self_cpu_time_total)[:10]
    return [[e.key[:120], round(e.self_cpu_time_total / 1e3 / steps, 3)] for e in ranked]


def profile(a: argparse.Namespace, batch: int, setup: Any) -> dict[str, Any]:
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = not a.dry
    rt, stepper, batches, _ = setup(a, "eager" if a.dry else "compile", batch)
    for _ in range(max(1, a.warmup)):
        stepper(batches, 1)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
    with (
        warnings.catch_warnings(record=True) as caught,
        torch_profile(activities=activities) as prof,
    ):
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        for _ in range(PROFILED_STEPS):
            result = stepper(batches, 1)
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()  # the steps' kernels end inside the span
        span_us = (time.perf_counter() - t0) * 1e6
    loss = float(result.losses[0])
    events = prof.events()
    kernels = kernels_of(events)
    ops = [e.name for e in events if e.device_type == DeviceType.CPU]
    out = {"mode": "profile", "compiled": cuda, **breakdown(kernels, ops, PROFILED_STEPS, span_us)}
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    out["syncs_per_step"] = round(len(syncs) / PROFILED_STEPS, 2) if cuda else None
    if not kernels:
        out["top_ms_per_step"] = _top_cpu_ops(prof, PROFILED_STEPS)
    if os.environ.get(OUT_ENV):
        trace = Path(os.environ[OUT_ENV]) / "profile-trace.json.gz"
        prof.export_chrome_trace(str(trace))
        out["trace"] = str(trace)
    out["final_loss"] = round(loss, 4)
    return out
