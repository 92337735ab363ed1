"""Device, process group and collectives: the native path (cpu, cuda, neuron) and xla.

The native path asks torch for the device and its backend (gloo, nccl, TorchNeuron's), with
the per-device choices of train/devices.py's one table. torch_xla is imported only on the xla path. On XLA the process group is torch_xla's ("xla",
init_method xla://), gradients are reduced with xm.reduce_gradients after accumulation (one
all-reduce per optimizer step, like the AWS tutorial), graphs are cut with torch_xla.sync()
at step boundaries, and batches reach the device through MpDeviceLoader. torch_xla on a CPU
(PJRT_DEVICE=CPU) cannot run multi-process collectives: every process silently reports rank 0
of 1 (docs/architecture.md 4, "Stacks"), so such a world size is refused, before
and after init.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import importlib.util
import os
import pickle
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from trainmaster.errors import UserError
from trainmaster.train.devices import (
    CUDA_SYNC_EVERY,
    NATIVE,
    DeviceKind,
    DeviceOptions,
    dist_backend,
    options_for,
)
from trainmaster.train.env import Env

Batch = dict[str, torch.Tensor]
TIMEOUT_ENV = "TRAINMASTER_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 1800  # bounded: a lost peer ends the job instead of hanging it
__all__ = ["CUDA_SYNC_EVERY", "DeviceKind", "DeviceOptions", "Runtime", "options_for"]


def _registered(kind: str) -> bool:
    """Whether torch knows the device: cuda with a GPU; "neuron" once TorchNeuron has renamed
    PyTorch's PrivateUse1 backend (it autoloads with torch: no import needed, Neuron docs)."""
    if kind == "cuda":
        return torch.cuda.is_available()
    name = getattr(torch._C, "_get_privateuse1_backend_name", None)  # private: may go away
    return name is not None and bool(name() == kind)


def resolve_kind(requested: str) -> DeviceKind:
    if requested == "cuda" and not _registered("cuda"):
        raise UserError(
            "cuda was asked for, but torch sees no GPU (a CPU build of torch, or no "
            'driver); use train.device = "cpu" or "auto"',
            where="train.device",
        )
    if requested == "neuron" and not _registered("neuron"):
        raise UserError(
            "neuron was asked for, but torch has no neuron device: TorchNeuron (torch-neuronx, "
            "a beta; the torchneuron image) is not installed, or this is no Trn2/Trn3",
            where="train.device",
        )
    if requested == "xla" and importlib.util.find_spec("torch_xla") is None:
        raise UserError(
            "xla was asked for, but torch_xla is not installed in this environment",
            where="train.device",
        )
    if requested in ("cpu", "cuda", "xla", "neuron"):
        return requested  # type: ignore[return-value]
    if os.environ.get("PJRT_DEVICE") and importlib.util.find_spec("torch_xla") is not None:
        return "xla"
    # auto: the accelerator torch found (cuda, or neuron under TorchNeuron), else the CPU
    if torch.accelerator.is_available():
        found = torch.accelerator.current_accelerator()
        if found is not None and found.type in NATIVE:
            return found.type
    return "cpu"


class Runtime:
    """One worker's view of the job: its rank, its device and the collectives it needs."""

    def __init__(self, env: Env, kind: DeviceKind, *, bf16: bool, store: Any = None) -> None:
        """store: a c10d store for the process group instead of torchrun's env:// (the entry
        shim's preflight group, train/scriptnet.py: its keys must not meet the script's own)."""
        self.env, self.kind, self.bf16 = env, kind, bf16
        pg: dict[str, Any] = {}
        if store is not None:
            pg = {"store": store, "rank": env.rank, "world_size": env.world_size}
        self.options = options_for(kind, bf16=bf16)
        self.rank, self.world = env.rank, env.world_size
        self.distributed = env.world_size > 1
        self._xm: Any = None
        timeout = datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))
        if kind == "xla":
            self.device = self._init_xla(timeout)
        else:  # the native path: cpu, cuda, neuron (devices.py)
            self.device = self._init_native(timeout, pg)
        if self.distributed and dist.get_world_size() != self.world:
            raise UserError(
                f"the {kind} process group has {dist.get_world_size()} workers, but "
                f"torchrun started {self.world}",
                where="WORLD_SIZE",
            )

    def _init_native(self, timeout: datetime.timedelta, pg: dict[str, Any]) -> torch.device:
        """One device per worker (local rank) on an accelerator, its backend from torch."""
        if self.kind == "cpu":
            device = torch.device("cpu")
        else:
            device = torch.device(self.kind, self.env.local_rank)
            torch.accelerator.set_device_index(device)
        if self.options.tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        if self.distributed:
            backend = dist_backend(self.kind)
            bound = device if device.type != "cpu" else None
            dist.init_process_group(backend, timeout=timeout, device_id=bound, **pg)
        return device

    def _init_xla(self, timeout: datetime.timedelta) -> torch.device:
        pjrt = os.environ.get("PJRT_DEVICE", "").upper()
        if self.world > 1 and pjrt == "CPU":
            raise UserError(
                f"torch_xla on a CPU (PJRT_DEVICE=CPU) cannot run {self.world} "
                "workers: its collectives only work on accelerators; run one worker "
                'or use train.device = "cpu"',
                where="WORLD_SIZE",
            )
        if self.bf16:
            # bf16 weights need stochastic rounding on Neuron, or small updates are lost.
            os.environ.setdefault("NEURON_RT_STOCHASTIC_ROUNDING_EN", "1")
        torch_xla = importlib.import_module("torch_xla")
        xm = self._xm = importlib.import_module("torch_xla.core.xla_model")
        if self.distributed:
            importlib.import_module("torch_xla.distributed.xla_backend")  # the "xla" backend
            dist.init_process_group("xla", init_method="xla://", timeout=timeout)
        device: torch.device = (
            torch_xla.device() if hasattr(torch_xla, "device") else xm.xla_device()
        )
        return device

    # --- steps and data -----------------------------------------------------------------------

    @property
    def device_name(self) -> str:
        """The accelerator's name as its driver reports it ("NVIDIA H200"); "" for others."""
        return torch.cuda.get_device_name(self.device) if self.kind == "cuda" else ""

    def sync(self) -> None:
        """Cut and run the XLA graph (a step boundary); nothing elsewhere."""
        if self.kind == "xla":
            torch_xla = importlib.import_module("torch_xla")
            if hasattr(torch_xla, "sync"):
                torch_xla.sync()
            else:
                self._xm.mark_step()

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast around forward and loss on cpu/cuda/neuron (fp32 master weights)."""
        if self.options.autocast_bf16:
            return torch.autocast(device_type=self.kind, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def model_dtype(self) -> torch.dtype:
        """XLA keeps bf16 weights (as the installed torch_xla expects); elsewhere fp32."""
        return torch.bfloat16 if self.bf16 and self.kind == "xla" else torch.float32

    def batches(self, source: Iterable[Batch]) -> Iterator[Batch]:
        if self.kind == "xla":
            pl = importlib.import_module("torch_xla.distributed.parallel_loader")
            return iter(pl.MpDeviceLoader(source, self.device))
        return self._to_device(source)

    def _to_device(self, source: Iterable[Batch]) -> Iterator[Batch]:
        """Pinned (page-locked) host copies let the copy to the GPU run asynchronously; the
        caching host allocator reuses their memory once the copy has been done."""
        o = self.options
        if not o.pin_memory and self.device.type == "cpu":
            yield from source
            return
        for batch in source:
            if o.pin_memory:
                batch = {k: v.pin_memory() for k, v in batch.items()}
            yield {k: v.to(self.device, non_blocking=o.non_blocking) for k, v in batch.items()}

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """XLA has no DDP here: one all-reduce of the accumulated gradients per step."""
        if self.kind == "xla" and self.distributed:
            self._xm.reduce_gradients(optimizer)

    # --- collectives ---------------------------------------------------------------------------

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def all_gather_object(self, obj: Any, tag: str = "gather") -> list[Any]:
        if not self.distributed:
            return [obj]
        if self.kind == "xla":
            payloads = self._xm.rendezvous(tag, pickle.dumps(obj))
            return [pickle.loads(p) for p in payloads]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any, tag: str = "broadcast") -> Any:
        """Rank 0's value on every rank."""
        return self.all_gather_object(obj, tag)[0]

    # --- random state ----------------------------------------------------------------------------

    def rng_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"torch": torch.get_rng_state()}
        if self.kind == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        # neuron: TorchNeuron documents no device generator API; its dropout masks after a
        # resume are not the uninterrupted run's (unverified, so not claimed bit-exact).
        if self.kind == "xla":
            state["xla"] = int(self._xm.get_rng_state())
        return state

    def set_rng_state(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        if self.kind == "cuda" and "cuda" in state:
            torch.cuda.set_rng_state(state["cuda"], self.device)
        if self.kind == "xla" and "xla" in state:
            self._xm.set_rng_state(int(state["xla"]))

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)
        if self.kind == "xla":
            self._xm.set_rng_state(seed)

    def finish(self) -> None:
        """All ranks leave together on XLA (the tutorial's fix for a hang at exit)."""
        if self.kind == "xla" and self.distributed:
            self._xm.rendezvous("trainmaster-finished")
