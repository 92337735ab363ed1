"""The per-device choices of the trainer, in one table: cpu, cuda, neuron (TorchNeuron) and xla.

cpu, cuda and neuron are one native path: the device and its process-group backend come from
torch (`torch.accelerator`, `torch.distributed.get_default_backend_for_device`), so a device
that registers itself with torch, as TorchNeuron does through PyTorch's PrivateUse1 mechanism
(named "neuron"), runs the same trainer code. xla is the PyTorch/XLA path, kept for trn1, whose
training stack Neuron froze (cluster/versions.py). Sources of the neuron row: aws-neuron-sdk
torch/index ("TorchNeuron: Native PyTorch on AWS Neuron", Neuron 2.33, public beta):
`torch.autocast(device_type="neuron")`, `torch.compile(backend="neuron")`, "the TorchNeuron
backend fully supports the caching mechanism provided by TorchDynamo", DDP/FSDP through
torch.distributed, asynchronous execution ("operations are enqueued to the device
asynchronously"). Not documented there, so left at the safe choice: a fused AdamW kernel for
the neuron device (foreach instead), pinned host memory for it (off).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

DeviceKind = Literal["cpu", "cuda", "neuron", "xla"]
NATIVE: tuple[DeviceKind, ...] = ("cpu", "cuda", "neuron")  # through torch.accelerator
CUDA_SYNC_EVERY = 10  # steps between host reads of the loss on an asynchronous device


@dataclasses.dataclass(frozen=True)
class DeviceRow:
    """What a worker does on one kind of device; `options_for` adds the job's precision."""

    autocast: bool  # bf16 autocast around forward and loss (fp32 master weights) when bf16
    adamw: str  # "fused" | "foreach": torch.optim.AdamW's implementation
    attn_implementation: str | None  # transformers' attention; None = its default
    pin_memory: bool  # page-locked host batches, copied non-blocking
    tf32: bool
    sync_every: int  # host syncs (loss read, metrics row) every N steps; 1 = every step
    compile_backend: str | None  # torch.compile's backend; None: the device compiles anyway
    compile_cache: Literal["inductor", "neuron"]  # compile/cache.py's mechanism on the device
    bf16_weights: bool  # bf16 parameters (with stochastic rounding) instead of autocast


TABLE: dict[DeviceKind, DeviceRow] = {
    "cpu": DeviceRow(True, "fused", "sdpa", False, False, 1, "inductor", "inductor", False),
    "cuda": DeviceRow(
        True, "fused", "sdpa", True, True, CUDA_SYNC_EVERY, "inductor", "inductor", False
    ),
    # TorchDynamo's caches (FX graph, AOTAutograd) live under the Inductor cache folder, which
    # compile/cache.py's "inductor" mechanism puts on shared storage.
    "neuron": DeviceRow(
        True, "foreach", None, False, False, CUDA_SYNC_EVERY, "neuron", "inductor", False
    ),
    # XLA: the loss read is the step's barrier; Neuron's compiler cache; bf16 weights as the
    # installed torch_xla expects (docs/architecture.md 5: 12.5). Attention named, "eager":
    # transformers' default moved from eager to SDPA in 4.54, and trn1's graphs (their compile
    # cache, their numerics) must not change with the transformers pip picks.
    "xla": DeviceRow(False, "foreach", "eager", False, False, 1, None, "neuron", True),
}


@dataclasses.dataclass(frozen=True)
class DeviceOptions:
    """The per-device choices of the fast path for one job (kind and precision), tested for each
    kind. On CUDA: bf16 autocast (fp32 master weights), fused AdamW, SDPA attention, batches
    pinned and copied non-blocking, TF32 for what stays fp32, and the host reads the loss only
    every `sync_every` steps, so the GPU never waits for Python in between. With a padding mask,
    PyTorch's SDPA runs its memory-efficient kernel (the flash kernel takes no mask)."""

    autocast_bf16: bool
    adamw: str
    attn_implementation: str | None
    pin_memory: bool
    non_blocking: bool
    tf32: bool
    sync_every: int
    compile_backend: str | None
    compile_cache: str


def options_for(kind: DeviceKind, *, bf16: bool) -> DeviceOptions:
    """What a worker on this kind of device does; a pure function of (kind, precision)."""
    row = TABLE[kind]
    return DeviceOptions(
        autocast_bf16=bf16 and row.autocast,
        adamw=row.adamw,
        attn_implementation=row.attn_implementation,
        pin_memory=row.pin_memory,
        non_blocking=row.pin_memory,
        tf32=row.tf32,
        sync_every=row.sync_every,
        compile_backend=row.compile_backend,
        compile_cache=row.compile_cache,
    )


def dist_backend(kind: DeviceKind) -> str:
    """The process group's backend: torch's default for the device (gloo, nccl, and what
    TorchNeuron registers for "neuron"); torch_xla's "xla" on the XLA path."""
    if kind == "xla":
        return "xla"
    import torch.distributed as dist

    return str(dist.get_default_backend_for_device(kind))
