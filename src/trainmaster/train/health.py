"""Node preflight (docs/architecture.md 5: 14.2): a short health check on every node
before the first step.

A bad node (a device that is missing or computes wrong numbers, a network far below the
others, a full disk, a tiny /dev/shm) otherwise shows up as a hang, a NaN or a crash hours in.
After the process group is up, every rank checks its own device and all ranks run one
all-reduce; local rank 0 of each node checks what the node shares. Rank 0 gathers the results:
they go into summary.json (`preflight`) and one log line per node; a failing check stops the
job on every rank with one line naming the node, its host and the check (exit code 2).

Checks (each only where it applies; what a CPU run here cannot have is not checked):
  device       the rank's device answers (cuda: the GPU of its local rank exists)
  matmul       a 512x512 fp32 matmul equals the float64 result (a device computing wrong
               numbers), and its rate, beside the catalog's peak per worker where it has one
  all_reduce   every rank's 4 MiB contribution sums exactly, with the bus bandwidth
               (2(n-1)/n x bytes / time, NCCL's convention: nccl-tests doc/PERFORMANCE.md)
  disk         free space where checkpoints go >= (keep_checkpoints + 1) x the checkpoint size
  shm          free /dev/shm >= SHM_NEED_MB (NCCL and gloo put intra-node buffers there; a
               node of one worker needs the CPU's figure whatever its device)
  neuron       trn: at least ceil(local workers / cores per device) /dev/neuronN devices; the
               Neuron runtime finds them there (Neuron docs, "Tutorial How to Build and Run a
               Neuron Container": `docker run --device=/dev/neuron0 ... neuron-ls`)
  efa          trn/p4d/p5 on Kubernetes: as many EFA devices as the catalog's interfaces; the
               efa kernel driver registers each as an RDMA device in /sys/class/infiniband
               (Linux drivers/infiniband/hw/efa; AWS's own check is `fi_info -p efa`)
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from trainmaster.catalog import InstanceType
from trainmaster.compile import cache
from trainmaster.errors import UserError
from trainmaster.train.device import Runtime
from trainmaster.train.nodefault import MATMUL_N, MATMUL_RTOL, mark_node, matmul_case

SHM_NEED_MB = {"cpu": 32, "cuda": 256, "xla": 256}
ALLREDUCE_BYTES = 4 << 20
BYTES_PER_PARAM = 12  # fp32 weights + two fp32 AdamW/LAMB moments (+4 with a bf16 master copy)

# Test hook (train/faults.py): called with (rank, product) and returns the product to check.
matmul_hooks: list[Callable[[int, torch.Tensor], torch.Tensor]] = []


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str  # what was measured, and what was needed


def _wait(rt: Runtime) -> None:
    """Until the device has done what was queued (XLA: run the graph; CUDA: synchronize), so
    that the timings below are of the work, not of its launch."""
    rt.sync()
    if rt.kind == "cuda":
        torch.cuda.synchronize(rt.device)


def _device(rt: Runtime) -> Check:
    if rt.kind == "cuda":
        n = torch.cuda.device_count()
        ok = rt.device.index is not None and rt.device.index < n
        return Check("device", ok, f"cuda:{rt.device.index} of {n} visible GPU(s)")
    return Check("device", True, str(rt.device))


def values_unchecked(environ: Mapping[str, str] = os.environ) -> str | None:
    """Why the device's results cannot be checked in this run, or None when they can.

    neuron_parallel_compile runs the script with NEURON_EXTRACT_GRAPHS_ONLY set to extract its
    graphs: "the output from the model is invalid" then (aws-neuron-sdk frameworks/torch/
    torch-neuronx/api-reference-guide/training/pytorch-neuron-parallel-compile.rst), so an exact
    matmul or all-reduce fails on every rank and stops the precompile before step 1 with the
    cache cold. AWS's BERT script skips its checks there too. The precompile job
    (compile.cache.PRECOMPILE_MARK) never checks them: it is a compile run, not the job. The ops
    still run, so their graphs are compiled with the others."""
    if environ.get("NEURON_EXTRACT_GRAPHS_ONLY"):
        return "graph extraction (NEURON_EXTRACT_GRAPHS_ONLY): outputs are invalid"
    if environ.get(cache.PRECOMPILE_MARK):
        return "a precompile run"
    return None


def _matmul(rt: Runtime, inst: InstanceType) -> Check:
    a, b, want = matmul_case()
    da, db = a.to(rt.device), b.to(rt.device)
    got = da @ db  # warm-up, and the product checked
    _wait(rt)
    reps = 5
    t0 = time.perf_counter()
    for _ in range(reps):
        da @ db
    _wait(rt)
    seconds = max(time.perf_counter() - t0, 1e-9) / reps
    out = got.to("cpu").double()
    for hook in matmul_hooks:
        out = hook(rt.rank, out)
    err = float((out - want).abs().max() / want.abs().max())
    tflops = 2 * MATMUL_N**3 / seconds / 1e12
    peak = inst.peak_tflops_per_worker
    rate = f"{tflops:.3f} TFLOP/s fp32" + (
        f" (catalog peak {peak:.1f} bf16 per worker)" if peak else ""
    )
    ok = err <= MATMUL_RTOL
    if (why := values_unchecked()) is not None:
        return Check("matmul", True, f"not checked ({why}); {rate}")
    return Check("matmul", ok, f"relative error {err:.1e} (limit {MATMUL_RTOL:g}); {rate}")


def _all_reduce(rt: Runtime) -> Check:
    n = ALLREDUCE_BYTES // 4
    x = torch.full((n,), float(rt.rank + 1), device=rt.device)
    rt.all_reduce_sum(x)  # warm-up: connections, algorithms
    x.fill_(float(rt.rank + 1))
    _wait(rt)
    t0 = time.perf_counter()
    rt.all_reduce_sum(x)
    _wait(rt)
    seconds = max(time.perf_counter() - t0, 1e-9)
    got = x[:8].to("cpu")
    want = rt.world * (rt.world + 1) / 2
    ok = bool(torch.all(got == want))
    busbw = 2 * (rt.world - 1) / rt.world * ALLREDUCE_BYTES / seconds / 1e9 if rt.world > 1 else 0.0
    if (why := values_unchecked()) is not None:
        ok, got_text = True, f"not checked ({why})"
    else:
        got_text = "exact" if ok else f"got {got[0].item():g}, want {want:g}"
    return Check(
        "all_reduce",
        ok,
        f"{ALLREDUCE_BYTES >> 20} MiB over {rt.world} ranks: "
        f"{got_text}; "
        f"{seconds * 1e3:.1f} ms, bus bandwidth {busbw:.2f} GB/s",
    )


def _free_mb(path: Path) -> float:
    return shutil.disk_usage(path).free / 2**20


def node_checks(
    *,
    kind: str,
    inst: InstanceType,
    local_workers: int,
    checkpoints: Path,
    checkpoint_mb: float,
    keep: int,
    dev: Path = Path("/dev"),
    sys_ib: Path = Path("/sys/class/infiniband"),
    on_aws: bool = False,
) -> list[Check]:
    """What the node shares: disk, /dev/shm, and on Trainium/AWS GPUs the devices (torch-free)."""
    need = (keep + 1) * checkpoint_mb
    free = _free_mb(checkpoints)
    out = [
        Check(
            "disk",
            free >= need,
            f"{free / 1024:.1f} GiB free in {checkpoints}, need "
            f"{need / 1024:.2f} GiB ({keep + 1} checkpoints of {checkpoint_mb:.0f} MB)",
        )
    ]
    shm = dev / "shm"
    if shm.is_dir():
        # An accelerator's collectives use /dev/shm between the ranks of one node; one worker
        # alone (a job on one GPU) has nothing to share there, like a CPU run.
        shm_need = SHM_NEED_MB.get(kind, 32) if local_workers > 1 else SHM_NEED_MB["cpu"]
        shm_free = _free_mb(shm)
        out.append(
            Check(
                "shm",
                shm_free >= shm_need,
                f"{shm_free:.0f} MiB free in {shm}, need {shm_need} MiB",
            )
        )
    if kind == "xla" and inst.devices:
        want = math.ceil(local_workers / max(1, inst.cores_per_device))
        found = len(list(dev.glob("neuron[0-9]*")))
        out.append(
            Check("neuron", found >= want, f"{found} Neuron device(s) in {dev}, need {want}")
        )
    if on_aws and inst.efa_interfaces:
        found = sum(
            1 for d in sys_ib.glob("*") if (d / "device" / "driver").resolve().name == "efa"
        )
        out.append(
            Check(
                "efa",
                found >= inst.efa_interfaces,
                f"{found} EFA device(s) in {sys_ib}, need {inst.efa_interfaces}",
            )
        )
    return out


def run(
    rt: Runtime,
    *,
    inst: InstanceType,
    node: int,
    local_rank: int,
    local_workers: int,
    checkpoints: Path,
    params: int,
    keep: int,
    on_aws: bool,
    checkpoint_mb: float | None = None,
) -> list[dict[str, Any]]:
    """Collective: every rank runs its checks and the all-reduce; all get every node's results.
    Raises UserError (the same on every rank) naming the first failing node and check.
    checkpoint_mb: the disk check's checkpoint size when the model is not known here (a custom
    script's, measured from its newest checkpoint: train/scriptnet.py); else from params."""
    checks = [_device(rt), _matmul(rt, inst), _all_reduce(rt)]
    if local_rank == 0:
        ckpt_mb = checkpoint_mb
        if ckpt_mb is None:
            per = BYTES_PER_PARAM + (4 if rt.model_dtype() == torch.bfloat16 else 0)
            ckpt_mb = params * per / 1e6
        checks += node_checks(
            kind=rt.kind,
            inst=inst,
            local_workers=local_workers,
            checkpoints=checkpoints,
            checkpoint_mb=ckpt_mb,
            keep=keep,
            on_aws=on_aws,
        )
    mine = {
        "node": node,
        "host": socket.gethostname(),
        "rank": rt.rank,
        "checks": [asdict(c) for c in checks],
    }
    every = sorted(
        rt.all_gather_object(mine, tag="preflight"), key=lambda r: (r["node"], r["rank"])
    )
    for r in every:
        for c in r["checks"]:
            if not c["ok"]:
                if r["host"] == mine["host"] and local_rank == 0:
                    mark_node(f"preflight-{c['name']}", c["detail"])
                raise UserError(
                    f"preflight check {c['name']} failed on {r['host']} (rank "
                    f"{r['rank']}): {c['detail']}",
                    where=f"node {r['node']}",
                )
    return every


def per_node(every: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """summary.json's `preflight`: each node's first rank (the one that also ran the node's
    checks); a 1,024-node job keeps 1,024 entries, not one per worker."""
    first: dict[int, dict[str, Any]] = {}
    for r in every:
        first.setdefault(r["node"], r)
    return [first[n] for n in sorted(first)]


def describe(node: dict[str, Any]) -> str:
    """One log line per node: every check's name and detail."""
    return f"preflight node {node['node']} ({node['host']}): " + " | ".join(
        f"{c['name']} {'ok' if c['ok'] else 'FAILED'}: {c['detail']}" for c in node["checks"]
    )


def on_aws_node(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """A pod of the Kubernetes backend (its EFA devices are requested, so they must be there)."""
    return bool(environ.get("KUBERNETES_SERVICE_HOST"))
