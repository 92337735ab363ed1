"""`data prepare`: text -> shards, across processes, all-or-nothing.

Stages: check every argument, cut the input into slices (from file sizes alone), get the
vocabulary, make examples per slice (worker processes, this one among them, read, tokenise
and mask their slices themselves: data/pool.py, data/share.py), shuffle them all with the
seed, write the shards under temporary names (in workers, each gathering its rows; vocab.txt
and dataset.json meanwhile, in a thread), and only then name the shards and swap the new
folder in. The parent reads no text unless it trains the vocabulary. Whatever stops the run
(an error, Ctrl-C) removes the temporaries; an old dataset is replaced only once the new one
is complete (--overwrite).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainmaster.data import corpus as corpus_mod
from trainmaster.data import shards as fmt
from trainmaster.data import share, slices
from trainmaster.data.output import Output
from trainmaster.data.pool import SliceResult, examples_task, write_task
from trainmaster.data.progress import Reporter, make_reporter
from trainmaster.data.settings import DEFAULTS, SHARDS, ExampleSettings
from trainmaster.data.vocab import (
    DEFAULT_VOCAB_SIZE,
    MIN_VOCAB_SIZE,
    Vocab,
    load_vocab,
    train_vocab,
)
from trainmaster.errors import DataError, UserError


@dataclass(frozen=True)
class PrepareResult:
    output: Path
    shards: list[Path]
    counts: list[int]  # examples per shard
    input_tokens: int  # WordPiece tokens of the input text, counted once
    vocab_size: int
    workers: int
    seconds: float
    # wall seconds per stage; "examples/…", "write/…": workers' CPU seconds per step, summed
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def examples(self) -> int:
        return sum(self.counts)

    @property
    def tokens_per_s(self) -> float:
        return self.input_tokens / max(self.seconds, 1e-9)


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def prepare(
    inputs: Sequence[str | os.PathLike[str]] = (),
    *,
    output: str | os.PathLike[str],
    builtin: str | None = None,
    vocab: str | os.PathLike[str] | None = None,
    vocab_size: int | None = None,
    lower_case: bool = True,
    seq_len: int = DEFAULTS.seq_len,
    max_pred: int = DEFAULTS.max_pred,
    masked_lm_prob: float = DEFAULTS.masked_lm_prob,
    short_seq_prob: float = DEFAULTS.short_seq_prob,
    dupe_factor: int = DEFAULTS.dupe_factor,
    whole_word_mask: bool = DEFAULTS.whole_word_mask,
    shards: int = SHARDS,
    workers: int | None = None,
    seed: int = DEFAULTS.seed,
    overwrite: bool = False,
    quiet: bool = True,
    reporter: Reporter | None = None,
    stall_timeout: float | None = None,
) -> PrepareResult:
    """Make BERT pretraining shards from text; the same inputs and seed give the same bytes."""
    t0 = time.monotonic()
    settings = ExampleSettings(
        seq_len, max_pred, masked_lm_prob, short_seq_prob, dupe_factor, whole_word_mask, seed
    )
    settings.check()
    if shards < 1:
        raise DataError(f"must be at least 1 (got {shards})", where="--shards")
    n_workers = default_workers() if workers is None else workers
    if n_workers < 1:
        raise DataError(f"must be at least 1 (got {workers})", where="--workers")
    stall_s = share.STALL_S if stall_timeout is None else stall_timeout
    if stall_s <= 0:
        raise DataError(
            f"must be more than 0 seconds (got {stall_timeout:g})", where="--stall-timeout"
        )
    if vocab is not None and vocab_size is not None:
        raise UserError("give --vocab FILE or --vocab-size N, not both")
    if vocab is None and (vocab_size or DEFAULT_VOCAB_SIZE) < MIN_VOCAB_SIZE:
        raise DataError(
            f"must be at least {MIN_VOCAB_SIZE} (got {vocab_size})", where="--vocab-size"
        )
    out = Output(Path(output), shards, overwrite)
    out.check()
    known = load_vocab(vocab) if vocab is not None else None
    timings: dict[str, float] = {}
    report = reporter or make_reporter(quiet)
    try:
        with _timed(timings, "read"):  # stat and cut: the workers read
            pieces, sources, size = slices.plan([Path(p) for p in inputs], builtin)
        with _timed(timings, "vocab"):
            voc = known or _train(inputs, builtin, vocab_size, lower_case)
        n_workers = min(n_workers, len(pieces))
        # The forked workers stop (killed) before the output is cleaned after a failure.
        with out.writing(), share.workers(n_workers, voc, lower_case, settings, stall_s) as run:
            scratch = out.scratch()
            report.stage("making examples", len(pieces))
            with _timed(timings, "examples"):
                results: list[SliceResult] = []
                for r in run(examples_task, [(p, size, str(scratch)) for p in pieces]):
                    results.append(r)
                    _add(timings, r.seconds)
                    report.advance(1, r.tokens)
                results.sort(key=lambda r: r.index)  # they come as made; rows count in order
            tokens = sum(r.tokens for r in results)
            total = sum(r.rows for r in results)
            _check_counts(results, total, shards, sources)
            report.stage("writing shards", shards)

            def meta(counts: list[int]) -> None:
                manifest = _manifest(out, counts, tokens, settings, lower_case, voc, sources)
                out.write_meta(voc, manifest)

            with _timed(timings, "write"):
                counts = _write_shards(
                    run, results, total, shards, settings.seed, out, report, timings, meta
                )
            shutil.rmtree(scratch)
            out.commit()
    finally:
        report.close()
    timings["total"] = time.monotonic() - t0
    return PrepareResult(
        out.folder,
        out.final_paths(),
        counts,
        tokens,
        len(voc),
        n_workers,
        timings["total"],
        timings,
    )


def _train(
    inputs: Sequence[str | os.PathLike[str]],
    builtin: str | None,
    vocab_size: int | None,
    lower_case: bool,
) -> Vocab:
    """Training needs every line: the one case where this process reads the whole input."""
    text = corpus_mod.read_corpus([Path(p) for p in inputs], builtin)
    return train_vocab(text.lines(), vocab_size or DEFAULT_VOCAB_SIZE, lower_case)


def _add(timings: dict[str, float], seconds: dict[str, float]) -> None:
    """Workers' seconds per step, summed over slices or shards (CPU-bound: ~CPU seconds)."""
    for k, v in seconds.items():
        timings[k] = timings.get(k, 0.0) + v


def _check_counts(
    results: list[SliceResult], total: int, shards: int, sources: list[corpus_mod.SourceInfo]
) -> None:
    if not any(r.lines for r in results):
        names = ", ".join(s.name for s in sources)
        raise DataError(
            f"no text in {names}; give lines of text, documents separated by blank lines"
        )
    if total == 0:
        raise DataError(
            "the input gives no examples (no word survived tokenisation); "
            "give text files of sentences"
        )
    if shards > total:
        raise DataError(
            f"{shards} shards but only {total} examples; lower --shards, or "
            "give more text or a higher --dupe-factor",
            where="--shards",
        )


@contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    start = time.monotonic()
    yield
    timings[name] = time.monotonic() - start


def _write_shards(
    run: share.Runner,
    results: list[SliceResult],
    total: int,
    shards: int,
    seed: int,
    out: Output,
    report: Reporter,
    timings: dict[str, float],
    meta: Callable[[list[int]], None],
) -> list[int]:
    """Shuffle all examples with the seed; shard sizes differ by at most one. meta(sizes)
    writes the dataset's other files meanwhile."""
    gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(2,))))
    parts = np.array_split(gen.permutation(total), shards)
    tasks = [(str(out.temp_path(k)), rows, results) for k, rows in enumerate(parts)]
    # Each written shard is fsync'd by a thread here while the next one is made: waiting for
    # the disk does not hold up a worker, and the file system batches concurrent syncs.
    with ThreadPoolExecutor(4, thread_name_prefix="fsync") as syncs:
        pending = [syncs.submit(meta, [len(p) for p in parts])]
        for path, seconds in run(write_task, tasks, final=True):
            pending.append(syncs.submit(fmt.fsync_path, Path(path)))
            _add(timings, seconds)
            report.advance(1)
        for done in pending:
            done.result()  # every file is durable before commit() names the shards
    return [len(p) for p in parts]


def _manifest(
    out: Output,
    counts: list[int],
    tokens: int,
    s: ExampleSettings,
    lower_case: bool,
    vocab: Vocab,
    sources: list[corpus_mod.SourceInfo],
) -> dict[str, Any]:
    from trainmaster import __version__

    return {
        "format": fmt.FORMAT,
        "format_version": fmt.FORMAT_VERSION,
        "created_by": f"trainmaster {__version__}",
        "name": out.name,
        "examples": sum(counts),
        "shards": [
            {"file": p.name, "examples": c} for p, c in zip(out.final_paths(), counts, strict=True)
        ],
        "input_tokens": tokens,
        "seq_len": s.seq_len,
        "max_pred": s.max_pred,
        "masked_lm_prob": s.masked_lm_prob,
        "short_seq_prob": s.short_seq_prob,
        "dupe_factor": s.dupe_factor,
        "whole_word_mask": s.whole_word_mask,
        "seed": s.seed,
        "lower_case": lower_case,
        "vocab_size": len(vocab),
        "vocab_sha256": vocab.sha256(),
        "vocab_source": vocab.source,
        "dtypes": {k: np.dtype(v).name for k, v in fmt.DTYPES.items()},
        "sources": [{"name": s.name, "bytes": s.bytes} for s in sources],
    }
