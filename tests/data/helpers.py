"""Helpers of the data tests: write text, rewrite shards, make an NVIDIA-like vocabulary."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from trainmaster.data.shards import KEYS

# Small enough to be quick, large enough for the statistical tests (~4k examples).
SMALL: dict[str, Any] = {"seq_len": 128, "max_pred": 20, "dupe_factor": 4, "shards": 4}


def write_docs(path: Path, docs: list[list[str]], repeat: int = 1) -> Path:
    """Google's format: a line per sentence, a blank line between documents."""
    path.write_text("\n\n".join("\n".join(d) for d in docs * repeat) + "\n", encoding="utf-8")
    return path


def rewrite(
    path: Path, change: Mapping[str, np.ndarray | None], compression: str | None = "gzip"
) -> None:
    """Replace a shard's arrays (None drops one), keeping the others as they are."""
    with h5py.File(path, "r") as f:
        arrays: dict[str, np.ndarray | None] = {k: np.asarray(f[k][:]) for k in KEYS}
    arrays.update(change)
    with h5py.File(path, "w") as f:
        for k, a in arrays.items():
            if a is not None:
                f.create_dataset(k, data=a, compression=compression)


def nvidia_vocab(ours: Path, dst: Path) -> Path:
    """A vocab laid out like Google's bert-base-uncased: [PAD]=0, [UNK]=100, [CLS]=101,
    [SEP]=102, [MASK]=103, 30522 lines (our words after the specials, then [unused])."""
    words = [t for t in ours.read_text(encoding="utf-8").split("\n") if t and not t.startswith("[")]
    head = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tail = [f"[unused{i}]" for i in range(99, 99 + 30522 - len(head) - len(words))]
    dst.write_text("\n".join([*head, *words, *tail]) + "\n", encoding="utf-8")
    return dst
