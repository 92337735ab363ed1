"""`data inspect`: what is in a folder of shards, in numbers and as readable examples.

The ratios are the ones to eyeball before a long run: ~15% of real tokens masked (less when
max_pred caps long rows), of those ~80% [MASK] / ~10% random / ~10% kept, ~50% random
next sentences, and how much of each row is padding (the compute spent on nothing).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from trainmaster.data import shards as fmt
from trainmaster.data.rows import BLOCK_ROWS, Expect, expectations
from trainmaster.errors import DataError


@dataclass
class Example:
    shard: str
    row: int
    text: str  # as the model sees it, [MASK] and random tokens included
    original: str  # with the masked tokens put back
    next_sentence_random: bool


@dataclass
class Stats:
    folder: str
    vocab: str  # where the ids' meaning came from
    shards: int = 0
    examples: int = 0
    seq_len: int = 0
    max_pred: int = 0
    real_tokens: int = 0
    padding_ratio: float = 0.0
    masked: int = 0
    mask_ratio: float = 0.0  # masked / real tokens
    masked_as_mask: float = 0.0  # of masked slots: shown as [MASK]
    masked_as_random: float = 0.0
    masked_as_kept: float = 0.0
    next_sentence_random: float = 0.0  # fraction of examples whose B is random
    per_shard: dict[str, int] = field(default_factory=dict)
    samples: list[Example] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def inspect(folder: str | Path, examples: int = 3) -> Stats:
    """Statistics of every shard, and the first `examples` rows decoded to text."""
    root = Path(folder)
    files = fmt.list_shards(root) if root.is_dir() else []
    if not files:
        raise DataError(
            "no shards here (files matching *_training_*.hdf5); give the dataset's folder",
            where=str(root),
        )
    try:
        manifest = fmt.read_manifest(root)
    except (ValueError, UnicodeDecodeError):
        manifest = None
    expect, _ = expectations(root, manifest)
    st = Stats(str(root), expect.source, shards=len(files))
    as_mask = kept = nsp_random = 0
    for path in files:
        try:
            f = h5py.File(path, "r")
        except OSError as exc:
            raise DataError(
                f"cannot open as HDF5 ({exc}); run `trainmaster data verify`", where=str(path)
            ) from exc
        with f:
            missing = [k for k in fmt.KEYS if k not in f]
            if missing:
                raise DataError(
                    f"missing {', '.join(missing)}; run `trainmaster data verify`", where=str(path)
                )
            n, st.seq_len = f["input_ids"].shape
            st.max_pred = f["masked_lm_positions"].shape[1]
            st.per_shard[path.name] = n
            for start in range(0, n, BLOCK_ROWS):
                b = {
                    k: np.asarray(f[k][start : start + BLOCK_ROWS]).astype(np.int64)
                    for k in fmt.KEYS
                }
                used = b["masked_lm_positions"] != 0
                inside = np.clip(b["masked_lm_positions"], 0, st.seq_len - 1)  # damaged shards too
                shown = np.take_along_axis(b["input_ids"], inside, 1)
                st.examples += len(b["input_ids"])
                st.real_tokens += int((b["input_mask"] != 0).sum())
                st.masked += int(used.sum())
                as_mask += int((used & (shown == expect.special.mask)).sum())
                kept += int((used & (shown == b["masked_lm_ids"])).sum())
                nsp_random += int((b["next_sentence_labels"] == 1).sum())
                for r in range(len(b["input_ids"])):
                    if len(st.samples) >= examples:
                        break
                    st.samples.append(_decode(b, r, path.name, start + r, expect))
    slots = st.examples * st.seq_len
    st.padding_ratio = 1 - st.real_tokens / slots if slots else 0.0
    st.mask_ratio = st.masked / st.real_tokens if st.real_tokens else 0.0
    if st.masked:
        st.masked_as_mask = as_mask / st.masked
        st.masked_as_kept = kept / st.masked
        st.masked_as_random = 1 - st.masked_as_mask - st.masked_as_kept
    st.next_sentence_random = nsp_random / st.examples if st.examples else 0.0
    return st


def _decode(b: dict[str, np.ndarray], r: int, shard: str, row: int, e: Expect) -> Example:
    length = int((b["input_mask"][r] != 0).sum())
    shown = b["input_ids"][r, :length].copy()
    original = shown.copy()
    used = b["masked_lm_positions"][r] != 0
    original[b["masked_lm_positions"][r][used]] = b["masked_lm_ids"][r][used]
    return Example(
        shard,
        row,
        detokenize(shown.tolist(), e),
        detokenize(original.tolist(), e),
        bool(b["next_sentence_labels"][r] == 1),
    )


def detokenize(ids: list[int], e: Expect) -> str:
    """Tokens joined by spaces, ## pieces glued to their word; unknown ids as #ID."""
    names = {
        e.special.cls: "[CLS]",
        e.special.sep: "[SEP]",
        e.special.mask: "[MASK]",
        e.special.pad: "[PAD]",
        e.special.unk: "[UNK]",
    }
    words: list[str] = []
    for i in ids:
        if e.tokens is not None and 0 <= i < len(e.tokens):
            tok = e.tokens[i]
        else:
            tok = names.get(i, f"#{i}")
        if tok.startswith("##") and len(tok) > 2 and words and not words[-1].startswith("["):
            words[-1] += tok[2:]
        else:
            words.append(tok)
    return " ".join(words)
