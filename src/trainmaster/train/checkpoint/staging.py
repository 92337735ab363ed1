"""The staging buffer the trainer and its checkpoint writer process share (background).

A checkpoint's tensors are copied into one block of shared memory, allocated at the first save
and reused by every later one, so a save costs the training thread one memory copy (torch's
copy_, which releases the GIL) and no allocation, and the writer process reads the same pages
without a second copy: each tensor starts on a page of its own, so the writer hands its pages
to the disk directly (odirect). What is not a tensor (the structure of the state dicts, the
scheduler, the RNG states) is small and travels pickled with each write request, each tensor
replaced by its Slot in the block.

The block is a memfd (anonymous shared memory, not limited by the size of /dev/shm, which is
64 MB in a default Kubernetes pod); where there is none (macOS), an unlinked temporary file.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# Each tensor starts on a page of its own: odirect writes the whole pages of each with
# O_DIRECT, which needs the memory, the file offset and the length aligned to the disk's block.
ALIGN = 4096
# cudaHostRegisterPortable: the block counts as pinned in every CUDA context, not only in the
# one of the thread that registers it (a thread of its own: _in_own_thread).
HOST_REGISTER_PORTABLE = 1


@dataclass(frozen=True)
class Slot:
    """Stands for tensor number `index` of the block in a flattened state."""

    index: int


@dataclass(frozen=True)
class Spec:
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


Layout = tuple[Spec, ...]


def flatten(obj: Any) -> tuple[Any, list[torch.Tensor]]:
    """`obj` with every tensor replaced by a Slot, and the tensors in slot order. Tensors that
    are the same view of one storage (tied weights) share a slot: written once, as before.

    Only an address tells two views of one storage: an XLA tensor has none (data_ptr() is 0
    for every one of them, torch_xla 2.9), so keyed by it all tensors of one shape and dtype
    shared a slot and the checkpoint held one of them for all (every LayerNorm's weight for
    its bias, exp_avg for exp_avg_sq: NaN at the first update after a resume). Such a tensor
    gets a slot of its own (tied weights saved twice, as to_cpu's synchronous save does)."""
    tensors: list[torch.Tensor] = []
    seen: dict[tuple[Any, ...], Slot] = {}

    def walk(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            ptr = o.data_ptr()
            where = ptr if ptr else ("object", id(o))  # `obj` holds o: its id stays its own
            key = (o.device, o.dtype, where, tuple(o.shape), o.stride())
            if key not in seen:
                seen[key] = Slot(len(tensors))
                tensors.append(o.detach())
            return seen[key]
        if isinstance(o, dict):
            return {k: walk(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return type(o)(walk(v) for v in o)
        return o

    return walk(obj), tensors


def unflatten(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(skeleton, Slot):
        return tensors[skeleton.index]
    if isinstance(skeleton, dict):
        return {k: unflatten(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(unflatten(v, tensors) for v in skeleton)
    return skeleton


def layout_of(tensors: list[torch.Tensor]) -> tuple[Layout, int]:
    """Where each tensor goes in the block, and the block's size."""
    specs, offset = [], 0
    for t in tensors:
        spec = Spec(t.dtype, tuple(t.shape), offset)
        specs.append(spec)
        offset += -(-max(spec.nbytes, 1) // ALIGN) * ALIGN
    return tuple(specs), max(offset, ALIGN)


def shared_fd() -> int:
    """An empty shared block, sized (os.ftruncate) once the first checkpoint's layout is known:
    the writer process gets it when it starts, before that."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("trainmaster-checkpoint")
    with tempfile.TemporaryFile() as f:  # pragma: no cover - macOS: an unlinked file
        return os.dup(f.fileno())


class Arena:
    """The block, mapped in one process, and the tensors of a layout that view it."""

    def __init__(self, fd: int, size: int, layout: Layout) -> None:
        self.size, self.layout = size, layout
        self._pinned = 0  # the block's address while it is page-locked for a GPU
        self._pinned_on: torch.device | None = None
        self._pin_failed = False
        self._map = mmap.mmap(fd, size)
        # Each view has a storage of its own (frombuffer), so torch.save writes every tensor
        # alone, exactly as it would write the trainer's own tensors.
        self.views = [_view(self._map, s) for s in layout]

    @property
    def buffer(self) -> mmap.mmap:
        return self._map

    def fill(self, tensors: list[torch.Tensor]) -> None:
        """Copy the live tensors in. From a GPU into a pinned block (pin_for_cuda) the copies
        are only queued, on the caller's current stream."""
        for dst, src in zip(self.views, tensors, strict=True):
            if src.device.type not in ("cpu", "cuda"):
                src = src.cpu()  # XLA: through its own transfer, as saving.to_cpu does
            dst.copy_(src, non_blocking=bool(self._pinned))

    def pin_for_cuda(self, device: torch.device) -> None:
        """Page-lock the block (cudaHostRegister), so that copies from a GPU run on its copy
        engine while it computes. Where that fails the copies still work, slower and each one
        waited for by the copying thread; said once, not tried again."""
        if self._pinned or self._pin_failed:
            return
        anchor = ctypes.c_char.from_buffer(self._map)  # the block's address, then let go
        ptr = ctypes.addressof(anchor)
        del anchor
        register = torch.cuda.cudart().cudaHostRegister
        err = _in_own_thread(device, register, ptr, self.size, HOST_REGISTER_PORTABLE)
        if int(err) != 0:
            self._pin_failed = True
            print(f"checkpoint: staging block not page-locked ({err})", file=sys.stderr)
            return
        self._pinned, self._pinned_on = ptr, device

    def close(self) -> None:
        if self._pinned:
            _in_own_thread(self._pinned_on, torch.cuda.cudart().cudaHostUnregister, self._pinned)
            self._pinned = 0
        self.views = []
        with contextlib.suppress(BufferError):  # a tensor still views it: unmapped with it
            self._map.close()


def _in_own_thread(device: torch.device | None, call: Callable[..., Any], *args: Any) -> Any:
    """A CUDA runtime call whose failure must not reach training: the runtime keeps a failed
    call's error per host thread until cudaGetLastError reads it, which torch does after its
    next kernel launch in that thread (and raises). torch binds no cudaGetLastError, so the
    call runs in a thread of its own, whose error dies with it; on the training's device (a new
    thread starts on device 0, whose context a rank on another GPU must not create). -1 when
    the thread raised."""
    out: list[Any] = []

    def run() -> None:
        if device is not None:
            torch.cuda.set_device(device)
        out.append(call(*args))

    worker = threading.Thread(target=run, name="checkpoint-pin")
    worker.start()
    worker.join()
    return out[0] if out else -1


class Fill:
    """One checkpoint's copy into the block, while training goes on: the next step's forward
    and backward read the saved tensors and change none of them (gradients are not saved), so
    only the optimizer's update has to wait, in before_update(). `then` runs once the bytes are
    in the block (it hands them to the writer process), `failed` if the copy raised.

    On the CPU the copy runs in a thread (copy_ releases the GIL). From a GPU, a side stream
    copies, after the step's last kernels (an event on the training stream), into the pinned
    block; before_update() then makes the training stream wait on the GPU, not the host. XLA
    tensors are copied in start(), on the training thread: its lazy tensors are not for two
    threads."""

    def __init__(
        self,
        arena: Arena,
        tensors: list[torch.Tensor],
        then: Callable[[], None],
        failed: Callable[[BaseException], None],
    ) -> None:
        self._queued = threading.Event()  # every copy done (CPU) or queued on the side stream
        self._settled = threading.Event()  # the copies are over, done or failed
        self._copied: Any = None  # the side stream's event after the copies (CUDA)
        self._stall: tuple[Any, Any] | None = None  # timing events around the stream's wait
        self._then, self._failed = then, failed
        self._work: tuple[Arena, list[torch.Tensor]] | None = (arena, tensors)

    def start(self) -> Fill:
        """Begin the copy (once); the tensors are the copy's alone from here."""
        assert self._work is not None, "a Fill starts once"
        (arena, tensors), self._work = self._work, None
        devices = {t.device.type for t in tensors}
        cuda = next((t.device for t in tensors if t.is_cuda), None)
        if not devices <= {"cpu", "cuda"}:
            self._copy(arena, tensors, None)
            return self
        ready = None
        if cuda is not None:
            arena.pin_for_cuda(cuda)
            ready = torch.cuda.current_stream(cuda).record_event()
        threading.Thread(
            target=self._copy, args=(arena, tensors, ready), name="checkpoint-copy", daemon=True
        ).start()
        return self

    def _copy(self, arena: Arena, tensors: list[torch.Tensor], ready: Any) -> None:
        try:
            if ready is None:
                arena.fill(tensors)
            else:
                side = torch.cuda.Stream(device=next(t.device for t in tensors if t.is_cuda))
                with torch.cuda.stream(side):
                    side.wait_event(ready)
                    arena.fill(tensors)
                    self._copied = side.record_event()
            self._queued.set()
            if self._copied is not None:
                self._copied.synchronize()  # an asynchronous copy's error surfaces here
        except BaseException as exc:
            self._queued.set()
            self._failed(exc)
            return
        finally:
            self._settled.set()
        self._then()

    def settle(self) -> None:
        """Until the copy is over, whatever its outcome: before the block is unmapped."""
        self._settled.wait()

    def before_update(self) -> float:
        """Block until the optimizer may change the saved tensors; the seconds this thread
        waited. On a GPU the wait is the stream's, between two timing events: gpu_stall_s()
        reads how long it stood once the GPU has got past it."""
        t0 = time.perf_counter()
        self._queued.wait()
        if self._copied is not None:
            stream = torch.cuda.current_stream(self._copied.device)
            begin = stream.record_event(torch.cuda.Event(enable_timing=True))
            stream.wait_event(self._copied)
            self._stall = (begin, stream.record_event(torch.cuda.Event(enable_timing=True)))
        return time.perf_counter() - t0

    @property
    def stall_pending(self) -> bool:
        """A stream's wait was timed and not yet read."""
        return self._stall is not None

    def gpu_stall_s(self) -> float | None:
        """The seconds the training stream stood still for this copy, once; None while the GPU
        has not got past the wait yet (a query, never a sync), or when there is nothing to read
        (a timing that fails is dropped: it must not cost the training)."""
        if self._stall is None:
            return None
        begin, end = self._stall
        try:
            if not end.query():
                return None
            seconds = float(begin.elapsed_time(end)) / 1000
        except (RuntimeError, ValueError):  # torch: ValueError for an event without timing
            seconds = None
        self._stall = None
        return seconds


def _view(buf: mmap.mmap, spec: Spec) -> torch.Tensor:
    numel = spec.nbytes // spec.dtype.itemsize
    if numel == 0:
        return torch.empty(spec.shape, dtype=spec.dtype)
    flat = torch.frombuffer(buf, dtype=spec.dtype, count=numel, offset=spec.offset)
    return flat.view(spec.shape)
