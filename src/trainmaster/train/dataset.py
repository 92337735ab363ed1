"""Shards as the trainer sees them: header checks, whole-shard loading, the reading order.

numpy and h5py only (no torch), so that every check here runs before a worker imports torch or
joins the process group. The reading order follows NVIDIA's loader (DeepLearningExamples
PyTorch/LanguageModeling/BERT/run_pretraining.py, HDF5 era, commit 78ec6802):
per epoch the sorted file list is shuffled with `random.Random(seed + epoch)`, and in file
round f rank r reads `files[(f * world + r) % n]`. An epoch has ceil(n / world) rounds, so
with n a multiple of the world size every shard is read once per epoch. Inside a shard the
samples are visited in a permutation seeded by (seed, epoch, round, rank); micro-batches are
cut from it in order and the remainder (fewer than a micro-batch) is dropped.

A position (epoch, round, offset) says where a rank is: offset counts samples of the current
shard's permutation already consumed. Batches are cut by sample offset, so the same samples
come in the same order whatever the micro-batch size.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from trainmaster.data import shards as fmt
from trainmaster.errors import ConfigError, DataError
from trainmaster.storage import SHARD_GLOB

KEYS = fmt.KEYS
IGNORE = -100  # label of an unused prediction slot (CrossEntropyLoss's ignore_index)
# What h5py raises for a damaged file, depending on which bytes are missing.
DAMAGE = (OSError, KeyError, RuntimeError, ValueError)


@dataclass(frozen=True)
class Position:
    epoch: int = 0
    round: int = 0
    offset: int = 0  # samples of this shard's permutation already consumed

    def to_list(self) -> list[int]:
        return [self.epoch, self.round, self.offset]

    @classmethod
    def of(cls, value: Any) -> Position:
        epoch, rnd, offset = (int(v) for v in value)
        return cls(epoch, rnd, offset)


@dataclass(frozen=True)
class ShardInfo:
    path: Path
    rows: int


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _damaged(path: Path, exc: BaseException) -> DataError:
    return DataError(
        f"cannot read the shard ({_first_line(exc)}): it is truncated or corrupt; "
        "re-create it (trainmaster data prepare) or copy it again, and check the "
        "folder with `trainmaster data verify`",
        where=str(path),
    )


def check_header(path: Path, seq_len: int, max_pred: int) -> int:
    """Keys, shapes and integer dtypes of one shard, from its metadata only; returns its rows."""
    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in KEYS if k not in f]
            if missing:
                raise DataError(
                    f"not a BERT pretraining shard: lacks {', '.join(missing)} "
                    f"(needs {', '.join(KEYS)})",
                    where=str(path),
                )
            shapes = {k: tuple(f[k].shape) for k in KEYS}
            kinds = {k: f[k].dtype.kind for k in KEYS}
    except DataError:
        raise
    except DAMAGE as exc:
        raise _damaged(path, exc) from exc
    bad = [k for k, kind in kinds.items() if kind not in "iu"]
    if bad:
        raise DataError(
            f"{', '.join(bad)} must hold integers (found {kinds[bad[0]]!r} data)", where=str(path)
        )
    n, s = shapes["input_ids"][0], shapes["input_ids"][-1]
    if len(shapes["input_ids"]) != 2 or s != seq_len:
        raise ConfigError(
            f"{seq_len}, but the shards hold sequences of {s} tokens "
            f"({path.name} in {path.parent}); set data.seq_len = {s} or use shards "
            f"made with --seq-len {seq_len}",
            where="data.seq_len",
        )
    p = shapes["masked_lm_positions"][-1]
    if len(shapes["masked_lm_positions"]) != 2 or p != max_pred:
        raise ConfigError(
            f"{max_pred}, but the shards have {p} prediction slots per sequence "
            f"({path.name} in {path.parent}); set data.max_pred = {p}",
            where="data.max_pred",
        )
    expected = {
        "input_mask": (n, s),
        "segment_ids": (n, s),
        "masked_lm_positions": (n, p),
        "masked_lm_ids": (n, p),
        "next_sentence_labels": (n,),
    }
    for key, shape in expected.items():
        if shapes[key] != shape and not (key == "next_sentence_labels" and shapes[key] == (n, 1)):
            raise DataError(
                f"{key} has shape {shapes[key]}, expected {shape} to match "
                f"input_ids {shapes['input_ids']}",
                where=str(path),
            )
    return int(n)


def list_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise DataError(
            "no such dataset folder; make it with `trainmaster data prepare "
            f"--builtin pydoc --output {folder}` or fix data.dataset",
            where=str(folder),
        )
    return fmt.list_shards(folder)


def check_dataset(
    folder: Path, *, seq_len: int, max_pred: int, world: int, batch_size: int
) -> list[ShardInfo]:
    """Every check that needs no shard's data: count, headers, sizes."""
    files = list_files(folder)
    if not files:
        raise DataError(
            f"no shards ({SHARD_GLOB}) in the dataset folder; make them with "
            "`trainmaster data prepare`",
            where=str(folder),
        )
    if len(files) < world:
        raise DataError(
            f"{len(files)} shards for {world} workers: every worker reads a whole "
            f"shard at a time, so at least {world} are needed; prepare more "
            f"(data prepare --shards {world}) or run fewer workers",
            where=str(folder),
        )
    infos = []
    for path in files:
        rows = check_header(path, seq_len, max_pred)
        if rows < batch_size:
            raise DataError(
                f"{rows} sequences, fewer than one micro-batch "
                f"(train.batch_size = {batch_size}); use a smaller batch_size or "
                "bigger shards",
                where=str(path),
            )
        infos.append(ShardInfo(path, rows))
    return infos


def vocab_lines(folder: Path) -> int | None:
    path = folder / fmt.VOCAB
    if not path.is_file():
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        return sum(1 for _ in f)


def load_shard(path: Path, vocab_size: int) -> dict[str, np.ndarray]:
    """A whole shard as int64 arrays the model takes, every id checked against the vocabulary.

    Prediction slots count up to the first 0 in masked_lm_positions, as in NVIDIA's loader;
    unused slots get position 0 and label IGNORE, so every batch has the same shapes.
    """
    try:
        raw = fmt.read_arrays(path)
    except DAMAGE as exc:
        raise _damaged(path, exc) from exc
    missing = [k for k in KEYS if k not in raw]
    if missing:
        raise DataError(
            f"not a BERT pretraining shard: lacks {', '.join(missing)}", where=str(path)
        )
    a = {k: np.asarray(raw[k]).astype(np.int64, copy=False) for k in KEYS}
    ids, positions, labels = a["input_ids"], a["masked_lm_positions"], a["masked_lm_ids"]
    valid = np.cumprod(positions != 0, axis=1).astype(bool)
    for name, values in (("input_ids", ids), ("masked_lm_ids", np.where(valid, labels, 0))):
        if values.size and (values.max() >= vocab_size or values.min() < 0):
            row, col = (int(i) for i in np.argwhere((values >= vocab_size) | (values < 0))[0])
            raise DataError(
                f"{name} holds token id {int(values[row, col])} (row {row}), outside "
                f"the vocabulary of {vocab_size} ids: the shards were made with "
                "another vocabulary; put its vocab.txt next to the shards or set "
                "model.vocab_size",
                where=str(path),
            )
    seq_len = ids.shape[1]
    if positions.size and (positions.max() >= seq_len or positions.min() < 0):
        raise DataError(
            f"masked_lm_positions points outside the sequence of {seq_len} tokens", where=str(path)
        )
    return {
        "input_ids": ids,
        "token_type_ids": a["segment_ids"],
        "attention_mask": a["input_mask"],
        "mlm_positions": np.where(valid, positions, 0),
        "mlm_labels": np.where(valid, labels, IGNORE),
        "nsp_labels": a["next_sentence_labels"].reshape(-1),
    }


def rounds_per_epoch(n_files: int, world: int) -> int:
    return math.ceil(n_files / world)


def file_for(files: list[Path], *, seed: int, epoch: int, rnd: int, rank: int, world: int) -> Path:
    order = list(files)
    random.Random(seed + epoch).shuffle(order)
    return order[(rnd * world + rank) % len(order)]


def sample_order(n: int, *, seed: int, epoch: int, rnd: int, rank: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, rnd, rank]).permutation(n)


def next_shard(pos: Position, n_files: int, world: int) -> Position:
    if pos.round + 1 < rounds_per_epoch(n_files, world):
        return Position(pos.epoch, pos.round + 1, 0)
    return Position(pos.epoch + 1, 0, 0)


def full_labels(positions: np.ndarray, labels: np.ndarray, seq_len: int) -> np.ndarray:
    """[N, seq_len] labels (IGNORE where not masked): what Hugging Face's full head takes."""
    out = np.full((positions.shape[0], seq_len), IGNORE, dtype=np.int64)
    rows, slots = np.nonzero(labels != IGNORE)
    out[rows, positions[rows, slots]] = labels[rows, slots]
    return out
