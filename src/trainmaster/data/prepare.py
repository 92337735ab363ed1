"""`data prepare`: text -> shards, across processes, all-or-nothing.

Stages: check every argument, read and check the input, get the vocabulary, make examples per
chunk (in worker processes), shuffle them all with the seed, write the shards under temporary
names (in workers), and only then put them in place and write dataset.json last. Whatever
stops the run (an error, Ctrl-C) removes the temporaries; an old dataset is replaced only
once the new one is complete (--overwrite).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainmaster.data import corpus as corpus_mod
from trainmaster.data import shards as fmt
from trainmaster.data.corpus import Document, split_sentences
from trainmaster.data.examples import ExampleSettings, VocabTables, expand, make_examples
from trainmaster.data.output import Output
from trainmaster.data.progress import Reporter, make_reporter
from trainmaster.data.vocab import (
    DEFAULT_VOCAB_SIZE,
    MIN_VOCAB_SIZE,
    Vocab,
    load_vocab,
    train_vocab,
)
from trainmaster.data.wordpiece import Encoder
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
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage

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
    seq_len: int = 128,
    max_pred: int = 20,
    masked_lm_prob: float = 0.15,
    short_seq_prob: float = 0.1,
    dupe_factor: int = 5,
    whole_word_mask: bool = False,
    shards: int = 8,
    workers: int | None = None,
    seed: int = 12345,
    overwrite: bool = False,
    quiet: bool = True,
    reporter: Reporter | None = None,
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
        with _timed(timings, "read"):
            text = corpus_mod.read_corpus([Path(p) for p in inputs], builtin)
        with _timed(timings, "vocab"):
            voc = known or train_vocab(text.lines(), vocab_size or DEFAULT_VOCAB_SIZE, lower_case)
        chunks = corpus_mod.make_chunks(text.documents)
        n_workers = min(n_workers, len(chunks))
        # The pool stops (its workers killed) before the output is cleaned after a failure.
        with out.writing(), _pool(n_workers, voc, lower_case, settings) as run:
            report.stage("making examples", len(chunks))
            with _timed(timings, "examples"):
                arrays, tokens = _make_examples(run, chunks, report)
            total = len(arrays["input_ids"])
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
            report.stage("writing shards", shards)
            with _timed(timings, "write"):
                counts = _write_shards(run, arrays, shards, settings.seed, out, report)
            del arrays
            manifest = _manifest(out, counts, tokens, settings, lower_case, voc, text.sources)
            out.commit(voc, manifest)
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


@contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    start = time.monotonic()
    yield
    timings[name] = time.monotonic() - start


Runner = Callable[[Callable[..., Any], Iterable[Any]], Iterator[Any]]


@contextmanager
def _pool(
    workers: int, vocab: Vocab, lower_case: bool, settings: ExampleSettings
) -> Iterator[Runner]:
    """map-like runner: in this process for one worker, else a process pool.

    Workers ignore SIGINT (Ctrl-C reaches the whole process group): this process alone
    decides to stop, terminates them and cleans up. tokenizers must not use its own threads
    in a worker (one worker per core already) nor after a fork.
    """
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        if workers == 1:
            local = Worker(vocab.tokens, lower_case, settings)
            yield lambda fn, items: (fn(item, local) for item in items)
            return
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by forked workers
        try:
            pool = mp.get_context(method).Pool(
                workers, init_pool_worker, (vocab.tokens, lower_case, settings)
            )
        finally:
            signal.signal(signal.SIGINT, previous)
        try:
            yield lambda fn, items: pool.imap_unordered(fn, items)
            pool.close()
        finally:
            pool.terminate()
            pool.join()
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


class Worker:
    """What runs in each worker process: tokenise a chunk and make its examples.

    Built once per process (the encoder's word cache pays off across chunks); the task
    functions below are module-level so that a process pool can pickle them.
    """

    def __init__(
        self, tokens: tuple[str, ...], lower_case: bool, settings: ExampleSettings
    ) -> None:
        vocab = Vocab(tokens, "worker")
        self.encoder = Encoder(vocab, lower_case)
        self.tables = VocabTables.of(vocab)
        self.settings = settings

    def examples(self, chunk: int, docs: list[Document]) -> tuple[dict[str, np.ndarray], int]:
        sentences: list[str] = []
        doc_sizes: list[int] = []
        for doc in docs:
            before = len(sentences)
            for line in doc:
                sentences.extend(split_sentences(line))
            doc_sizes.append(len(sentences) - before)
        flat, lengths = self.encoder.encode(sentences)
        arrays = make_examples(flat, lengths, doc_sizes, chunk, self.settings, self.tables)
        return arrays, int(lengths.sum())


_WORKER: Worker | None = None


def init_pool_worker(tokens: tuple[str, ...], lower_case: bool, settings: ExampleSettings) -> None:
    global _WORKER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    _WORKER = Worker(tokens, lower_case, settings)


def examples_task(
    item: tuple[int, list[Document]], worker: Worker | None = None
) -> tuple[int, dict[str, np.ndarray], int]:
    w = worker or _WORKER
    assert w is not None, "init_pool_worker did not run"
    chunk, docs = item
    arrays, tokens = w.examples(chunk, docs)
    return chunk, arrays, tokens


def write_task(item: tuple[str, dict[str, np.ndarray]], worker: Worker | None = None) -> str:
    path, arrays = item
    fmt.write_shard(Path(path), expand(arrays), durable=False)  # the caller fsyncs it
    return path


def _make_examples(
    run: Runner, chunks: list[list[Document]], report: Reporter
) -> tuple[dict[str, np.ndarray], int]:
    """All chunks' examples, concatenated in chunk order (whatever order workers finish in)."""
    results: list[dict[str, np.ndarray]] = [{} for _ in chunks]
    tokens = 0
    for index, arrays, n_tokens in run(examples_task, enumerate(chunks)):
        results[index] = arrays
        tokens += n_tokens
        report.advance(1, n_tokens)
    merged = {key: np.concatenate([r[key] for r in results]) for key in results[0]}
    return merged, tokens


def _write_shards(
    run: Runner,
    arrays: dict[str, np.ndarray],
    shards: int,
    seed: int,
    out: Output,
    report: Reporter,
) -> list[int]:
    """Shuffle all examples with the seed; shard sizes differ by at most one."""
    total = len(arrays["input_ids"])
    gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(2,))))
    parts = np.array_split(gen.permutation(total), shards)
    tasks = (
        (str(out.temp_path(k)), {key: a[rows] for key, a in arrays.items()})
        for k, rows in enumerate(parts)
    )
    # Each written shard is fsync'd by a thread here while the next one is made: waiting for
    # the disk does not hold up a worker, and the file system batches concurrent syncs.
    with ThreadPoolExecutor(4, thread_name_prefix="fsync") as syncs:
        pending = []
        for path in run(write_task, tasks):
            pending.append(syncs.submit(fmt.fsync_path, Path(path)))
            report.advance(1)
        for done in pending:
            done.result()  # every shard is durable before commit() names it
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
