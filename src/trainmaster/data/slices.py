"""The input cut into slices that worker processes read and decode themselves.

The parent only stats the files and cuts each into byte ranges of a fixed size; it never
reads the text (unless it trains the vocabulary), so no worker waits on a serial reading
stage. A worker moves both ends of its range forward to the next document boundary (the end
of a blank line), looking at most half a chunk ahead, else to the next line start: a pure
function of the file and the offset, so neighbours agree on where one slice ends and the
next begins, and the chunks, hence the examples, do not depend on the number of workers.
A .gz file cannot be entered in the middle: one slice decompresses it and cuts it itself.
"""

from __future__ import annotations

import functools
import gzip
import mmap
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainmaster.data.corpus import (
    SourceInfo,
    check_inputs,
    expand_inputs,
    pydoc_documents,
)
from trainmaster.errors import DataError

# A line of nothing but ASCII whitespace ends a document (lines of Unicode whitespace do too,
# but are not used as cut points: a cut must be a boundary for sure, not every boundary).
_BLANK_LINE = re.compile(rb"\n[ \t\r\x0b\x0c\x1c-\x1f]*\n")
_BOM = "\ufeff".encode()


@dataclass(frozen=True)
class Slice:
    index: int  # its place in the input: the first part of its chunks' random keys
    source: str  # a file's path, or "builtin:NAME"
    start: int  # raw byte offsets (before moving to a boundary)
    stop: int  # -1: to the end


def chunk_size(total_bytes: int) -> int:
    """Bytes per chunk: at least 64 chunks, 32 KiB to 1 MiB each.

    Small chunks spread work across cores; large ones give the random second segment more
    documents to come from (it is drawn within the chunk, as NVIDIA draws within a shard).
    """
    return min(1 << 20, max(1 << 15, total_bytes // 64))


@functools.cache
def builtin_text(name: str) -> bytes:
    """The built-in corpus in the input format (computed once; forked workers inherit it)."""
    assert name == "pydoc", name
    return "\n\n".join("\n".join(doc) for doc in pydoc_documents()).encode()


def plan(inputs: list[Path], builtin: str | None) -> tuple[list[Slice], list[SourceInfo], int]:
    """The slices, the sources for the manifest, and the chunk size, from sizes alone."""
    check_inputs(inputs, builtin)
    sized: list[tuple[str, int]] = []
    if builtin is not None:
        sized.append((f"builtin:{builtin}", len(builtin_text(builtin))))
    for path in expand_inputs(inputs):
        try:
            sized.append((str(path), path.stat().st_size))
        except OSError as exc:
            raise DataError(f"cannot read ({exc.strerror})", where=str(path)) from exc
    size = chunk_size(sum(n for _, n in sized))
    slices: list[Slice] = []
    for name, n in sized:
        # A whole .gz file is one slice; else no slice of under half a chunk at the end.
        starts = [0] if name.endswith(".gz") else list(range(0, max(n - size // 2, 1), size))
        for lo, hi in zip(starts, [*starts[1:], -1], strict=True):
            slices.append(Slice(len(slices), name, lo, hi))
    sources = [
        SourceInfo(name, _builtin_line_bytes(name) if name.startswith("builtin:") else n)
        for name, n in sized
    ]
    return slices, sources, size


def _builtin_line_bytes(name: str) -> int:
    """What read_corpus reports for a built-in corpus: the bytes of its lines."""
    data = builtin_text(name.removeprefix("builtin:"))
    return len(data) - data.count(b"\n")


def boundary(data: bytes | mmap.mmap, offset: int, window: int) -> int:
    """The first document boundary at or after offset within window, else the next line
    start, else the end. Monotone in offset when window <= the distance between offsets."""
    if offset <= 0:
        return 0
    if offset >= len(data):
        return len(data)
    m = _BLANK_LINE.search(data, offset - 1, min(len(data), offset - 1 + window))
    if m:
        return m.end()
    nl = data.find(b"\n", offset - 1)
    return len(data) if nl < 0 else nl + 1


def _decode(data: bytes | mmap.mmap, lo: int, hi: int, source: str) -> str:
    nul = data.find(b"\0", lo, hi)
    if nul >= 0:
        raise DataError(
            f"binary file (NUL byte at offset {nul}); inputs must be UTF-8 text", where=source
        )
    if lo == 0 and data[:3] == _BOM:
        lo = 3
    try:
        return data[lo:hi].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"not UTF-8 text (bad byte at offset {lo + exc.start}); convert it with iconv "
            "or drop it",
            where=source,
        ) from exc


def _cannot_read(exc: Exception, source: str) -> DataError:
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return DataError(f"cannot read ({reason}); inputs must be text or gzip'd text", where=source)


def read_slice(s: Slice, size: int) -> Iterator[tuple[int, str]]:
    """(chunk number within the slice, text) for each chunk of about size bytes."""
    try:
        if s.source.startswith("builtin:"):
            yield from _chunks(builtin_text(s.source.removeprefix("builtin:")), s, size)
        elif s.source.endswith(".gz"):
            yield from _chunks(gzip.decompress(Path(s.source).read_bytes()), s, size)
        else:
            with open(s.source, "rb") as f:
                if f.seek(0, 2) == 0:
                    return
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                    yield from _chunks(data, s, size)
    except (OSError, EOFError, zlib.error) as exc:
        raise _cannot_read(exc, s.source) from exc


def _chunks(data: bytes | mmap.mmap, s: Slice, size: int) -> Iterator[tuple[int, str]]:
    window = size // 2
    lo = boundary(data, s.start, window)
    hi = len(data) if s.stop < 0 else boundary(data, s.stop, window)
    k = 0
    while lo < hi:
        # A rest under 1.5 chunks stays whole: no sliver of a chunk at a slice's end.
        end = hi if hi - lo < size + window else min(hi, boundary(data, lo + size, window))
        yield k, _decode(data, lo, end, s.source)
        lo, k = end, k + 1
