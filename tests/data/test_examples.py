"""The example algorithm on synthetic token streams, where the right answer is known."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np

from trainmaster.data.examples import (
    ExampleSettings,
    VocabTables,
    build,
    choose,
    plan_pairs,
    truncate,
)
from trainmaster.data.prepare import prepare
from trainmaster.data.shards import read_arrays
from trainmaster.data.stats import inspect
from trainmaster.data.verify import verify
from trainmaster.data.vocab import Vocab, load_vocab


def test_next_sentence_is_random_half_the_time() -> None:
    """One long document of one-token sentences: every chunk has many sentences, so the
    50% draw alone decides (only the last chunk of a pass can be a forced random)."""
    s = ExampleSettings(seq_len=64, short_seq_prob=0.0, dupe_factor=10)
    plan = plan_pairs([1] * 20_000, [20_000], s, np.random.default_rng(3))
    n = len(plan)
    p = plan[:, 4].mean()
    assert abs(p - 0.5) < 5 * math.sqrt(0.25 / n) + s.dupe_factor / n, (p, n)


def test_pairs_fit_and_actual_next_follows_a() -> None:
    rng = random.Random(5)
    lengths = [rng.choice([1, 3, 10, 40, 300]) for _ in range(3000)]  # some far too long
    docs = [100] * 30
    s = ExampleSettings(seq_len=32, dupe_factor=2)
    plan = plan_pairs(lengths, docs, s, np.random.default_rng(6))
    a0, a1, b0, b1, rand = plan.T
    assert ((a1 - a0) >= 1).all() and ((b1 - b0) >= 1).all()
    assert ((a1 - a0) + (b1 - b0) <= s.seq_len - 3).all()
    assert (b0[rand == 0] >= a1[rand == 0]).all()  # B really follows A in the document
    total = sum(lengths)
    assert (plan[:, :4] >= 0).all() and (plan[:, :4] <= total).all()
    assert set(np.unique(rand)) == {0, 1}


def _reference_lengths(la: int, lb: int, max_tokens: int) -> tuple[int, int]:
    """Google's truncate_seq_pair, lengths only (which end is cut is the random part)."""
    while la + lb > max_tokens:
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return la, lb


def test_truncation_matches_the_reference() -> None:
    rng = np.random.default_rng(0)
    n = 5000
    a0 = rng.integers(0, 1000, n)
    b0 = rng.integers(0, 1000, n)
    la, lb = rng.integers(1, 200, n), rng.integers(1, 200, n)
    plan = np.stack([a0, a0 + la, b0, b0 + lb, np.zeros(n, dtype=np.int64)], axis=1)
    before = plan.copy()
    truncate(plan, 61, np.random.default_rng(1))
    got = list(
        zip((plan[:, 1] - plan[:, 0]).tolist(), (plan[:, 3] - plan[:, 2]).tolist(), strict=True)
    )
    assert got == [
        _reference_lengths(x, y, 61) for x, y in zip(la.tolist(), lb.tolist(), strict=True)
    ]
    assert (plan[:, 0] >= before[:, 0]).all() and (plan[:, 1] <= before[:, 1]).all()
    cut_front = plan[:, 0] - before[:, 0]
    cut = (before[:, 1] - before[:, 0]) - (plan[:, 1] - plan[:, 0])
    assert abs(cut_front.sum() / cut.sum() - 0.5) < 0.01  # front or back, 1/2 each


def test_short_targets_follow_short_seq_prob() -> None:
    s = ExampleSettings(seq_len=128, short_seq_prob=0.3, dupe_factor=3)
    plan = plan_pairs([5] * 30_000, [30_000], s, np.random.default_rng(1))
    used = (plan[:, 1] - plan[:, 0]) + (plan[:, 3] - plan[:, 2])
    short = (used < 100).mean()  # a target below ~100 only comes from the short draw
    assert 0.2 < short < 0.35


def test_whole_word_masking_masks_words(tmp_path: Path, pydoc_vocab: Path) -> None:
    out = prepare(
        builtin="pydoc",
        output=tmp_path / "wwm",
        vocab=pydoc_vocab,
        seq_len=64,
        max_pred=10,
        dupe_factor=1,
        shards=1,
        workers=1,
        whole_word_mask=True,
    ).output
    assert verify(out) == []
    tokens = load_vocab(out / "vocab.txt").tokens
    a = {k: v.astype(np.int64) for k, v in read_arrays(out / "wwm_training_0.hdf5").items()}
    original = a["input_ids"].copy()
    np.put_along_axis(original, a["masked_lm_positions"], a["masked_lm_ids"], 1)
    original[:, 0] = a["input_ids"][:, 0]  # slot 0 took the padding writes
    cont = np.array([t.startswith("##") for t in tokens])[original]
    masked = np.zeros_like(cont)
    np.put_along_axis(masked, a["masked_lm_positions"], True, 1)
    masked[:, 0] = False
    sp = load_vocab(out / "vocab.txt").special
    after_word = ~np.isin(original[:, :-1], [sp.cls, sp.sep])  # not cut off by truncation
    # A masked ## piece has its word's previous piece masked too, and vice versa.
    assert not (masked[:, 1:] & cont[:, 1:] & after_word & ~masked[:, :-1]).any()
    assert not (masked[:, :-1] & cont[:, 1:] & ~masked[:, 1:]).any()
    assert (masked & cont).sum() > 50  # the rule was exercised
    assert abs(inspect(out).mask_ratio - 0.15) < 0.03  # whole words overshoot less than this


def test_masked_positions_are_uniform_over_a_and_b() -> None:
    """Floyd's sampling picks k of the maskable tokens uniformly: every position of A and B
    (never [CLS] or a [SEP]) is taken about equally often."""
    vocab = Vocab(("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"), "test")
    s = ExampleSettings(seq_len=32, max_pred=5)
    n = 20_000
    plan = np.tile(np.array([[0, 10, 10, 30, 0]]), (n, 1))  # A 10 tokens, B 19 after truncation
    truncate(plan, s.seq_len - 3, np.random.default_rng(0))
    flat = np.full(40, 5, dtype=np.int32)
    ids, maskable = build(flat, plan, s.seq_len, vocab.special)
    positions = choose(
        maskable, ids, plan[:, 1] - plan[:, 0], s, VocabTables.of(vocab), np.random.default_rng(1)
    )
    counts = np.bincount(positions[positions != 0], minlength=s.seq_len)
    allowed = np.flatnonzero(maskable[0])
    assert set(np.flatnonzero(counts)) == set(allowed.tolist())
    expected = n * (positions[0] != 0).sum() / len(allowed)
    assert np.abs(counts[allowed] - expected).max() < 5 * math.sqrt(expected)
    assert (np.diff(positions, axis=1)[:, :4] > 0).all()  # ascending, k = 5 in every row
