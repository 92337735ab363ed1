"""What the worker processes of `data prepare` do: two stages, nothing serial (data/share.py
says how the tasks are shared).

Stage 1, per slice of the input (data/slices.py): read and decode it, split sentences,
tokenise, make the examples of each chunk, and append them (compact) to the process's
scratch file. Stage 2, per shard: gather the shard's rows (the seed's permutation of all
examples) from every scratch file and write the shard, one HDF5 chunk (~512 KiB) at a
time: a worker's memory stays in its caches and a fresh process faults in little of it.
Tasks are slice and shard numbers, results row counts: no text and no example crosses a
process boundary.
"""

from __future__ import annotations

import mmap
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainmaster.data import shards as fmt
from trainmaster.data.corpus import document_ids, sentence_lines
from trainmaster.data.examples import SOURCES, VocabTables, expand, make_examples
from trainmaster.data.settings import ExampleSettings
from trainmaster.data.slices import Slice, read_slice
from trainmaster.data.vocab import Vocab
from trainmaster.data.wordpiece import Encoder

Layout = list[tuple[str, str, tuple[int, ...], int]]  # key, dtype, shape, byte offset


@dataclass(frozen=True)
class SliceResult:
    """What stage 1 returns for a slice: small, whatever the slice's size."""

    index: int
    path: str  # the scratch file holding its examples (with other slices')
    rows: int
    layout: Layout
    tokens: int  # WordPiece tokens of its text
    lines: int  # lines that are not blank: none in any slice means no text at all
    seconds: dict[str, float]  # per step, for the benchmark's breakdown


def save(path: Path, parts: list[dict[str, np.ndarray]]) -> Layout:
    """Append the parts' arrays, key by key (each key's parts back to back), to this process's
    scratch file; what the shard writers need to find them again. Each key starts at a
    multiple of its row's bytes, so the whole file also reads as one array of that key's rows
    (Worker.rows): a shard block's rows from every slice of the file are one gather."""
    layout: Layout = []
    with open(path, "ab") as f:
        at = f.tell()
        for key in parts[0]:
            pieces = [np.ascontiguousarray(p[key]) for p in parts]
            shape = (sum(len(a) for a in pieces), *pieces[0].shape[1:])
            pad = -at % _row_bytes(pieces[0].dtype, shape[1:])
            f.write(bytes(pad))
            at += pad
            layout.append((key, pieces[0].dtype.str, shape, at))
            for a in pieces:
                f.write(a.data)
                at += a.nbytes
    return layout


def _row_bytes(dtype: np.dtype[Any], row: tuple[int, ...]) -> int:
    return max(1, dtype.itemsize * int(np.prod(row, dtype=np.int64)))


class Worker:
    """What runs in each worker process; built once per process (the encoder's word cache
    pays off across slices). The task functions below are module-level so that a process
    pool can pickle them."""

    def __init__(
        self, tokens: tuple[str, ...], lower_case: bool, settings: ExampleSettings
    ) -> None:
        vocab = Vocab(tokens, "worker")
        self.encoder = Encoder(vocab, lower_case)
        self.tables = VocabTables.of(vocab)
        self.settings = settings
        self._maps: dict[str, mmap.mmap] = {}

    def rows(self, path: str, dtype: str, row: tuple[int, ...]) -> np.ndarray:
        """A scratch file as one array of rows of a kind (all of a key's rows are aligned to
        it, see `save`). Each file (one per stage-1 process, so few whatever the number of
        slices) is mapped once per process, pages populated in one call: the shards this
        process writes all take rows from every slice."""
        if path not in self._maps:
            with open(path, "rb") as f:
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                self._maps[path] = mmap.mmap(f.fileno(), 0, flags, mmap.PROT_READ)
        data, dt = self._maps[path], np.dtype(dtype)
        count = len(data) // _row_bytes(dt, row)
        return np.frombuffer(data, dt, count * int(np.prod(row, dtype=np.int64))).reshape(
            count, *row
        )

    def examples(self, piece: Slice, size: int, scratch: Path) -> SliceResult:
        clock = _Clock("examples/")
        parts: list[dict[str, np.ndarray]] = []
        tokens = lines = 0
        for k, raw in read_slice(piece, size):
            clock.lap("read")
            text = sentence_lines(raw)
            clock.lap("sentences")
            flat, lengths = self.encoder.encode_text(text)
            doc, nonblank = document_ids(text, lengths)
            clock.lap("tokenise")
            chunk = (piece.index, k)
            parts.append(make_examples(flat, lengths, doc, chunk, self.settings, self.tables))
            clock.lap("pairs_mask")
            tokens += len(flat)
            lines += nonblank
        if not parts:
            parts.append(make_examples(*_nothing(), (piece.index, 0), self.settings, self.tables))
        path = scratch / f"examples-{os.getpid()}.bin"
        layout = save(path, parts)
        rows = sum(len(p["input_ids"]) for p in parts)
        clock.lap("save")
        return SliceResult(piece.index, str(path), rows, layout, tokens, lines, clock.seconds)


class _Clock:
    """CPU seconds per step (of this process): on a shared machine, steadier than wall time."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.seconds: dict[str, float] = {}
        self.last = time.process_time()

    def lap(self, name: str) -> None:
        now = time.process_time()
        key = self.prefix + name
        self.seconds[key] = self.seconds.get(key, 0.0) + now - self.last
        self.last = now


def _nothing() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64)


_WORKER: Worker | None = None


def init_pool_worker(worker: Worker) -> None:
    """The Worker of a forked process: the parent's own, copied by the fork (built once)."""
    global _WORKER
    _WORKER = worker


def examples_task(item: tuple[Slice, int, str], worker: Worker | None = None) -> SliceResult:
    w = worker or _WORKER
    assert w is not None, "init_pool_worker did not run"
    piece, size, scratch = item
    return w.examples(piece, size, Path(scratch))


def write_task(
    item: tuple[str, np.ndarray, list[SliceResult]], worker: Worker | None = None
) -> tuple[str, dict[str, float]]:
    """Shard rows (global example numbers, in shard order) gathered from the scratch files,
    an HDF5 chunk at a time."""
    w = worker or _WORKER
    assert w is not None, "init_pool_worker did not run"
    clock = _Clock("write/")
    path, rows, slices = item
    first = np.cumsum([0] + [s.rows for s in slices])
    which = np.searchsorted(first, rows, side="right") - 1
    local = rows - first[which]
    files = sorted({s.path for s in slices if s.rows})
    file_of = np.array([files.index(s.path) if s.rows else 0 for s in slices])[which]
    # Per compact key: each row's place among that key's rows of its file.
    spec: dict[str, tuple[list[np.ndarray], np.ndarray]] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for j, (key, dtype, shape, _) in enumerate(slices[0].layout):
        row = tuple(shape[1:])
        size = _row_bytes(np.dtype(dtype), row)
        base = np.array([s.layout[j][3] // size for s in slices])
        spec[key] = ([w.rows(f, dtype, row) for f in files], base[which] + local)
        shapes[key] = row
    seq = shapes["input_ids"][0]

    def block(key: str, lo: int, hi: int) -> np.ndarray:
        clock.lap("hdf5")
        here = file_of[lo:hi]
        picks = [np.flatnonzero(here == k) for k in range(len(files))]
        compact = {}
        for ck in SOURCES[key]:
            views, index = spec[ck]
            at = index[lo:hi]
            if len(views) == 1:
                compact[ck] = views[0][at]
                continue
            out = np.empty((hi - lo, *shapes[ck]), views[0].dtype)
            for v, pick in zip(views, picks, strict=True):
                out[pick] = v[at[pick]]
            compact[ck] = out
        clock.lap("gather")
        made = expand(key, compact, seq)
        clock.lap("expand")
        return made

    rows_of = {
        key: (seq,) if key in ("input_mask", "segment_ids") else shapes[key] for key in SOURCES
    }
    fmt.write_blocks(Path(path), len(rows), rows_of, block, durable=False)  # caller fsyncs
    clock.lap("hdf5")
    return path, clock.seconds
