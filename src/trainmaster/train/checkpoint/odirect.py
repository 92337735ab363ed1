"""A checkpoint file written from the shared staging block (staging) past the page cache.

torch.save copies every byte into the kernel's page cache: system CPU in the writer process
that a machine with few cores takes from training. The same bytes written with O_DIRECT from the
page-aligned block cost almost none (`python bench/checkpoint_cost.py --write-cpu`; the figures
are in bench/README.md). So a file is written in two passes, and stays the same torch-loadable
zip:

1. torch.save under skip_data, every record aligned to 4096 bytes and no crc32: the zip's
   headers and pickle, with a hole where each storage's bytes go;
2. each storage's bytes pwritten into its hole straight from the block, the whole pages with
   O_DIRECT, the tail (< 4096 bytes, its page shared with the next zip header) buffered;
3. every record's CRC-32 set in the zip's headers (zipcrc), computed from the bytes written:
   the block's for a storage, the file's for the records torch wrote itself (the pickle,
   version, byte order). Without them every zip reader that checks takes the file for corrupt.
   isal's crc32 (zlib's function, several times faster) keeps that a small part of a write
   (the same bench measures both).

Which record holds which tensor: torch.save numbers storages in the order it pickles them, and
the pickler visits dicts, lists and tuples in their iteration order, the order of walk() below.
That is checked against the file itself (each record's pickled type and size, in order, read
from the zip's own directory: no torch internals); a mismatch, a state that does not live in
the block, or a zip whose headers are not where zipcrc expects them raises Unsuitable, and the
caller saves the plain way instead (crc32 on). O_DIRECT refused (tmpfs, not Linux) falls back to
buffered writes of the same bytes, with the same CRCs: they are computed from the block,
whichever way its bytes went.

The whole path is an optimisation on torch's serialization options (torch.utils.serialization.
config's save.storage_alignment and save.compute_crc32, torch.serialization.skip_data), which
not every torch has: unavailable() probes them once per process, and saving._save takes any
failure here, not only Unsuitable, as "save the plain way" (docs/architecture.md, "Private and
too-new APIs").
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from isal.isal_zlib import crc32

from trainmaster.train.checkpoint import zipcrc
from trainmaster.train.checkpoint.staging import ALIGN, Arena, Spec

CHUNK = 64 << 20  # bytes per pwrite: a bounded call, well under Linux's 2 GB cap


class Unsuitable(Exception):
    """This state cannot be written the direct way (say why); save it the plain way."""


# torch.save's options for the first pass: every record on a page of its own, no CRCs yet.
LAYOUT = {"save.storage_alignment": ALIGN, "save.compute_crc32": False}


@functools.cache
def unavailable() -> str | None:
    """Why this torch cannot write the direct way (None: it can). Probed once per process: the
    serialization options of the first pass exist from torch 2.7 on (skip_data from 2.6)."""
    try:
        return _probe()
    except Exception as why:  # whatever the probe meets, the answer is "the plain way"
        return f"torch {torch.__version__}: probing the save options failed: {why!r}"


def _probe() -> str | None:
    try:
        from torch.utils.serialization import config
    except ImportError:
        return f"torch {torch.__version__} has no torch.utils.serialization.config"
    if not callable(getattr(torch.serialization, "skip_data", None)):
        return f"torch {torch.__version__} has no torch.serialization.skip_data"
    try:
        with config.patch(LAYOUT):  # type: ignore[attr-defined]
            pass
    except (AttributeError, KeyError, TypeError, AssertionError) as why:
        return f"torch {torch.__version__} lacks the save options {sorted(LAYOUT)}: {why}"
    return None


def save(obj: Any, path: Path, arena: Arena) -> int:
    """Write `obj` (whose tensors are `arena`'s views) to `path` as torch.save would; returns
    the file's size. Raises Unsuitable before the file is used for anything."""
    missing = unavailable()
    if missing is not None:
        raise Unsuitable(missing)
    from torch.utils.serialization import config

    slots = _storages(obj, arena)
    with config.patch(LAYOUT), torch.serialization.skip_data():  # type: ignore[attr-defined]
        torch.save(obj, path)
    fd = os.open(path, os.O_RDWR)
    try:
        holes, whole = _records(fd, slots)
        crcs = [(r, crc32(os.pread(fd, r.size, r.data))) for r in whole]
        crcs += _fill(fd, path, arena, holes)
        zipcrc.set_crcs(fd, crcs)
        os.fsync(fd)  # one inode: the direct writes' metadata, the tails and the CRCs
    finally:
        os.close(fd)
    return path.stat().st_size


def _storages(obj: Any, arena: Arena) -> list[Spec]:
    """The block's slot of each storage torch.save will write, in its numbering order."""
    specs = {id(v): s for v, s in zip(arena.views, arena.layout, strict=True)}
    seen: set[int] = set()
    order: list[Spec] = []
    for t in walk(obj):
        spec = specs.get(id(t))
        if spec is None:
            raise Unsuitable("a tensor that is not in the staging block")
        cdata = t.untyped_storage()._cdata
        if cdata not in seen:
            seen.add(cdata)
            order.append(spec)
    return order


def walk(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from walk(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from walk(v)


class _Pids(pickle.Unpickler):
    """Reads the file's pickle for its storage references only (nothing is rebuilt)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.storages: dict[str, tuple[Any, int]] = {}

    def persistent_load(self, pid: Any) -> None:
        _, kind, key, _, numel = pid
        self.storages.setdefault(key, (kind, numel))

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name.endswith("Storage"):
            return getattr(torch, name)
        return _Stub  # rebuild functions, OrderedDict, dtypes: only walked through


class _Stub(dict[Any, Any]):
    """Whatever the pickle builds besides storage references: takes items, state, calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def __call__(self, *args: Any, **kwargs: Any) -> _Stub:
        return _Stub()

    def __setstate__(self, state: Any) -> None:
        pass


def _check(pickled: bytes, slots: list[Spec], sizes: dict[str, int]) -> None:
    """The file's pickle references exactly the block's slots, in order, with their sizes."""
    pids = _Pids(pickled)
    pids.load()
    if list(pids.storages) != [str(k) for k in range(len(slots))]:
        raise Unsuitable(f"{len(pids.storages)} storages in the file, {len(slots)} in the block")
    for key, spec in enumerate(slots):
        kind, numel = pids.storages[str(key)]
        with warnings.catch_warnings():  # TypedStorage's deprecation, for its dtype
            warnings.simplefilter("ignore", UserWarning)
            itemsize = 1 if kind is torch.UntypedStorage else kind.dtype.itemsize
        size = sizes.get(f"data/{key}")
        if itemsize != spec.dtype.itemsize or not itemsize * numel == size == spec.nbytes:
            raise Unsuitable(f"record {key}: {size} bytes, its slot {spec.nbytes}")


def _records(
    fd: int, slots: list[Spec]
) -> tuple[list[tuple[zipcrc.Record, Spec]], list[zipcrc.Record]]:
    """The record of each storage with its slot, and the records torch wrote whole, from the
    zip's central directory (names inside the archive: "data.pkl", "data/0", ...)."""
    try:
        found = {r.name.partition("/")[2]: r for r in zipcrc.records(fd)}
    except zipcrc.BadZip as why:
        raise Unsuitable(str(why)) from None
    pickled = found.get("data.pkl")
    if pickled is None:
        raise Unsuitable("no data.pkl record in the file")
    _check(os.pread(fd, pickled.size, pickled.data), slots, {k: r.size for k, r in found.items()})
    holes = []
    for key, spec in enumerate(slots):
        record = found.pop(f"data/{key}")  # _check found each
        if record.data % ALIGN:
            raise Unsuitable(f"record {key} is not aligned to {ALIGN} bytes")
        holes.append((record, spec))
    for name, record in found.items():
        if name.startswith("data/"):  # a hole we have no bytes for
            raise Unsuitable(f"{record.name} is not in the staging block")
    return holes, list(found.values())


def _fill(
    buffered: int, path: Path, arena: Arena, holes: list[tuple[zipcrc.Record, Spec]]
) -> list[tuple[zipcrc.Record, int]]:
    """Each record's bytes into its hole, whole pages direct where the kernel allows it; returns
    each record's CRC-32, of the bytes written."""
    block = memoryview(arena.buffer)
    crcs = []
    try:
        direct = _open_direct(path)
        try:
            for record, spec in holes:
                data = block[spec.offset : spec.offset + spec.nbytes]
                crcs.append((record, crc32(data)))
                whole = 0
                if direct is not None:
                    pages = data[: len(data) // ALIGN * ALIGN]
                    whole = _pwrite(direct, pages, record.data, buffered)
                _pwrite(buffered, data[whole:], record.data + whole)
                data.release()
        finally:
            if direct is not None:
                os.close(direct)
    finally:
        block.release()
    return crcs


def _open_direct(path: Path) -> int | None:
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_WRONLY | flag)
    except OSError:  # tmpfs and some FUSE file systems refuse O_DIRECT at open
        return None


def _pwrite(fd: int, data: memoryview, offset: int, fallback: int | None = None) -> int:
    """All of `data` at `offset`; returns its length. A direct write refused part-way (EINVAL:
    a file system that accepts the flag but not the alignment) goes on through `fallback`."""
    done = 0
    while done < len(data):
        try:
            done += os.pwrite(fd, data[done : done + CHUNK], offset + done)
        except OSError:
            if fallback is None:
                raise
            fd, fallback = fallback, None
    return done
