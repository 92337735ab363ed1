"""The row rules of the shard format, as whole-block numpy checks (used by verify).

A row is `[CLS] A [SEP] B [SEP]` then padding: input_mask is 1s then 0s, segment_ids are 0
through the first [SEP] and 1 after it (0 in padding), padding ids are 0, masked positions are
strictly increasing real non-[CLS]/[SEP] positions followed by 0s, with the original id (never
0) in masked_lm_ids and 0 in unused slots; next_sentence_labels is 0 or 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainmaster.data import shards as fmt
from trainmaster.data.vocab import NVIDIA_SPECIAL_IDS, NVIDIA_VOCAB_SIZE, SpecialIds, load_vocab
from trainmaster.errors import DataError

BLOCK_ROWS = 1 << 15  # rows read at a time: bounded memory for shards of any size


@dataclass(frozen=True)
class Expect:
    """What the ids mean: from vocab.txt, else dataset.json's size, else Google's vocab."""

    vocab_size: int
    special: SpecialIds
    tokens: tuple[str, ...] | None  # to decode ids, when vocab.txt is there
    source: str


def expectations(folder: Path, manifest: dict[str, Any] | None) -> tuple[Expect, str | None]:
    """The expectations and, if vocab.txt is present but unusable, why."""
    problem = None
    if (folder / fmt.VOCAB).is_file():
        try:
            v = load_vocab(folder / fmt.VOCAB)
            return Expect(len(v), v.special, v.tokens, fmt.VOCAB), None
        except DataError as exc:
            problem = f"{exc.args[0].split(': ', 1)[-1]}; checked with Google's BERT vocab ids"
    size = manifest.get("vocab_size") if manifest else None
    if isinstance(size, int) and size > 0:
        return Expect(size, NVIDIA_SPECIAL_IDS, None, fmt.MANIFEST), problem
    return Expect(NVIDIA_VOCAB_SIZE, NVIDIA_SPECIAL_IDS, None, "bert-uncased defaults"), problem


Found = list[tuple[int, str, str]]


def _emit(out: Found, bad: np.ndarray | np.bool_, kind: str, message: Callable[[int], str]) -> None:
    for r in np.flatnonzero(bad).tolist():
        out.append((r, kind, message(r)))


def check_block(b: dict[str, np.ndarray], e: Expect) -> Found:
    """(row within the block, rule, message) for every broken rule of every row."""
    ids, m, seg = b["input_ids"], b["input_mask"], b["segment_ids"]
    pos, mids, nsp = b["masked_lm_positions"], b["masked_lm_ids"], b["next_sentence_labels"]
    n, width = ids.shape
    col = np.arange(width)
    rows = np.arange(n)
    v, sp = e.vocab_size, e.special
    out: Found = []

    bad_id = (ids < 0) | (ids >= v)
    _emit(
        out,
        bad_id.any(1),
        "id-range",
        lambda r: (
            f"input_ids holds id "
            f"{ids[r, np.argmax(bad_id[r])]} outside [0, {v}) (vocab: {e.source})"
        ),
    )
    mask_vals = ((m != 0) & (m != 1)).any(1)
    _emit(out, mask_vals, "input-mask", lambda r: "input_mask holds values other than 0 and 1")
    mask_order = ~mask_vals & (m[:, 1:] > m[:, :-1]).any(1)
    _emit(
        out,
        mask_order,
        "input-mask",
        lambda r: (
            "input_mask is not 1s followed by 0s "
            f"(a 1 at position {int(np.argmax(m[r, 1:] > m[r, :-1])) + 1} after a 0)"
        ),
    )
    mask_ok = ~mask_vals & ~mask_order
    length = np.where(mask_ok, m.sum(1), 0)
    real = col < length[:, None]
    _emit(
        out,
        ids[:, 0] != sp.cls,
        "cls",
        lambda r: f"input_ids[0] is {ids[r, 0]}, not [CLS] ({sp.cls})",
    )
    pad_bad = mask_ok & ((ids != 0) & ~real).any(1)
    _emit(
        out,
        pad_bad,
        "padding",
        lambda r: (
            f"padding slot {int(np.argmax((ids[r] != 0) & ~real[r]))}"
            " holds a nonzero id; padding must be 0"
        ),
    )

    is_sep = (ids == sp.sep) & real
    first = np.argmax(is_sep, 1)
    last_id = ids[rows, np.maximum(length - 1, 0)]
    sep_ok = (
        mask_ok & (is_sep.sum(1) == 2) & (last_id == sp.sep) & (first >= 2) & (first <= length - 3)
    )
    _emit(
        out,
        mask_ok & ~sep_ok,
        "sep",
        lambda r: (
            "[SEP] misplaced: expected exactly 2, ending "
            f"a non-empty A and as the last of the {length[r]} real tokens; found at positions "
            f"{np.flatnonzero(is_sep[r]).tolist()}"
        ),
    )
    want_seg = (col > first[:, None]) & real
    seg_bad = sep_ok & (seg != want_seg).any(1)
    _emit(
        out,
        seg_bad,
        "segment-ids",
        lambda r: (
            "segment_ids wrong at position "
            f"{int(np.argmax(seg[r] != want_seg[r]))}: 0 through the first [SEP], 1 after it, "
            "0 in padding"
        ),
    )

    used = pos != 0
    _emit(
        out,
        (pos < 0).any(1),
        "positions",
        lambda r: "masked_lm_positions holds a negative position",
    )
    gap = (used[:, 1:] & ~used[:, :-1]).any(1)
    _emit(
        out,
        gap,
        "positions",
        lambda r: "masked_lm_positions has a position after a 0; used slots come first, then 0s",
    )
    unsorted = (used[:, 1:] & used[:, :-1] & (pos[:, 1:] <= pos[:, :-1])).any(1)
    _emit(
        out,
        unsorted,
        "positions",
        lambda r: "masked_lm_positions not sorted (must be strictly increasing)",
    )
    beyond = mask_ok & (used & (pos >= length[:, None])).any(1)
    _emit(
        out,
        beyond,
        "positions",
        lambda r: (
            f"masked_lm_positions: position "
            f"{pos[r][used[r] & (pos[r] >= length[r])][0]} is beyond the {length[r]} real tokens"
        ),
    )
    at_sep = sep_ok & (used & ((pos == first[:, None]) | (pos == (length - 1)[:, None]))).any(1)
    _emit(out, at_sep, "positions", lambda r: "masked_lm_positions points at a [SEP]")

    bad_mid = (mids < 0) | (mids >= v)
    _emit(
        out,
        bad_mid.any(1),
        "masked-ids",
        lambda r: f"masked_lm_ids holds id {mids[r, np.argmax(bad_mid[r])]} outside [0, {v})",
    )
    _emit(
        out,
        (used & (mids == 0)).any(1),
        "masked-ids",
        lambda r: "masked_lm_ids is 0 for a used position (must be the original token id)",
    )
    _emit(
        out,
        (~used & (mids != 0)).any(1),
        "masked-ids",
        lambda r: "masked_lm_ids is nonzero in an unused slot (must be 0)",
    )
    _emit(
        out,
        (nsp != 0) & (nsp != 1),
        "nsp",
        lambda r: f"next_sentence_labels is {nsp[r]}, must be 0 or 1",
    )
    out.sort(key=lambda t: t[0])
    return out
