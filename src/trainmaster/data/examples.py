"""Pretraining examples as in Google's/NVIDIA's create_pretraining_data.py, vectorised.

The algorithm is theirs: fill a chunk of sentences up to a target length, split it into
segments A and B at a random sentence, make B a random document's text half of the time
(always when the chunk has one sentence) and put the unused sentences back, truncate the
pair from random ends, then mask ~15% of the tokens (80% [MASK], 10% random, 10% kept).

What differs is how it runs: no Python loop over sentences or tokens. Sentences are spans of
one flat token array, so an example is four integers (where A and B start and end); the
pairs of all documents are planned at once (plan_pairs), and truncating, building the
[N, S] arrays, choosing and masking are whole-array numpy operations. Three choices are
ours: a short target length is drawn per example, not once per document (the reference's
comment intends "10% of examples"), the random B document is never A's own (the reference
gives up after 10 tries), and the random replacement token is never a special token.
Randomness comes from (seed, the chunk's place in the input) only, never from worker order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainmaster.data.settings import ExampleSettings
from trainmaster.data.vocab import SpecialIds, Vocab


@dataclass(frozen=True)
class VocabTables:
    """What masking needs from the vocabulary, as arrays (built once per process)."""

    special: SpecialIds
    random_ids: np.ndarray  # ids a "random token" may be: every non-special token
    continuation: np.ndarray  # bool per id: a ## piece (for whole-word masking)

    @classmethod
    def of(cls, vocab: Vocab) -> VocabTables:
        sp = vocab.special
        specials = [sp.pad, sp.unk, sp.cls, sp.sep, sp.mask]
        random_ids = np.setdiff1d(np.arange(len(vocab)), specials).astype(np.int32)
        continuation = np.array([t.startswith("##") for t in vocab.tokens], dtype=bool)
        return cls(sp, random_ids, continuation)


def _generator(seed: int, chunk: tuple[int, ...]) -> np.random.Generator:
    """All of a chunk's draws: from (seed, the chunk's place in the input) only."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(1, *chunk))))


def plan_pairs(
    lengths: np.ndarray | list[int],
    doc_sizes: np.ndarray | list[int],
    s: ExampleSettings,
    gen: np.random.Generator,
) -> np.ndarray:
    """[M, 5] int64: a0, a1, b0, b1 (token spans) and is_random_next, for every duplicate.

    The reference walks each document sentence by sentence, and where one pair ends decides
    where the next begins. Here every sentence of every duplicate gets the draws of a pair
    that would start there, all at once (searchsorted on the token offsets finds where its
    target length is reached); then the walk from pair start to pair start, which the
    reference's loop does, is found for all documents at once. Each start a walk visits uses
    draws of its own, so the pairs have the reference's distribution; draws at unvisited
    starts are simply not used.
    """
    lens = np.asarray(lengths, dtype=np.int64)
    sizes = np.asarray(doc_sizes, dtype=np.int64)
    n, ndocs, max_tokens = len(lens), len(sizes), s.seq_len - 3
    cum = np.concatenate([[0], np.cumsum(lens)])  # sentence k is tokens cum[k]:cum[k+1]
    doc_end = np.cumsum(sizes)
    doc_start = doc_end - sizes
    doc = np.repeat(np.arange(ndocs), sizes)
    dupes = s.dupe_factor
    f = np.tile(np.arange(n), dupes)  # a pair starting at sentence f, in each duplicate
    d = np.tile(doc, dupes)
    end = doc_end[d]
    u = gen.random((6, len(f)))
    short = u[0] < s.short_seq_prob
    want = np.where(short, 2 + (u[1] * (max_tokens - 1)).astype(np.int64), max_tokens)
    # The chunk: sentences f..i, the first whose running total reaches want (or the doc's last).
    i = np.minimum(np.searchsorted(cum, cum[f] + want) - 1, end - 1)
    n_seg = i - f + 1
    a_end = f + np.where(n_seg >= 2, 1 + (u[2] * (n_seg - 1)).astype(np.int64), 1)
    a0, a1 = cum[f], cum[a_end]
    rand = (n_seg == 1) | (u[3] < 0.5)
    # A random other document (the reference tries 10 times; here never the same one).
    if ndocs > 1:
        r = (u[4] * (ndocs - 1)).astype(np.int64)
        r += r >= d
    else:
        r = d
    j = doc_start[r] + (u[5] * sizes[r]).astype(np.int64)
    need = want - (a1 - a0)
    j_last = np.clip(np.searchsorted(cum, cum[j] + need) - 1, j, doc_end[r] - 1)
    b0 = np.where(rand, cum[j], a1)
    b1 = np.where(rand, cum[j_last + 1], cum[i + 1])
    nxt = np.where(rand, a_end, i + 1)  # a random B puts the unused sentences back
    # The walk, on flat (duplicate, sentence) indices, by pointer doubling: after round r,
    # `seen` holds every start within 2**r steps of a document's first sentence and `jump`
    # goes 2**r steps (a document's end leads to `last`, which leads to itself).
    shift = np.repeat(np.arange(dupes) * n, n)
    last = n * dupes
    jump = np.append(np.where(nxt < end, nxt + shift, last), last)
    seen = np.zeros(last + 1, dtype=bool)
    seen[(np.tile(doc_start, dupes) + np.repeat(np.arange(dupes) * n, ndocs))] = True
    span = 1
    while span < (sizes.max() if ndocs else 0):
        seen[jump[seen]] = True
        jump = jump[jump]
        span *= 2
    at = np.flatnonzero(seen[:last])  # in order: duplicate, document, position
    plan = np.stack([a0[at], a1[at], b0[at], b1[at], rand[at].astype(np.int64)], axis=1)
    truncate(plan, max_tokens, gen)
    return plan


def truncate(plan: np.ndarray, max_tokens: int, gen: np.random.Generator) -> None:
    """The reference's truncate_seq_pair, in place: while too long, drop a token from the
    front or back (1/2 each) of the longer segment (B when equal). So the longer one loses
    tokens until both are equal, then they alternate, B first."""
    la, lb = plan[:, 1] - plan[:, 0], plan[:, 3] - plan[:, 2]
    excess = np.maximum(la + lb - max_tokens, 0)
    first = np.minimum(excess, np.abs(la - lb))
    rest = excess - first
    cut_a = np.where(la > lb, first, 0) + rest // 2
    cut_b = np.where(la > lb, 0, first) + rest - rest // 2
    for lo, cut in ((0, cut_a), (2, cut_b)):
        front = gen.binomial(cut, 0.5)
        plan[:, lo] += front
        plan[:, lo + 1] -= cut - front


def build(
    flat: np.ndarray, plan: np.ndarray, seq_len: int, sp: SpecialIds
) -> tuple[np.ndarray, np.ndarray]:
    """[CLS] A [SEP] B [SEP] + padding: input_ids and maskable ([N, S]); the masks are two
    lengths per row (see `expand`), so they are not made here.

    int32 index arithmetic and a full gather then a multiply: ~2x faster than int64 and
    boolean-mask indexing on [N, S] arrays (chunks are far below 2**31 tokens).
    """
    p32 = plan.astype(np.int32)
    a0, a1, b0, b1 = (p32[:, k, None] for k in range(4))
    n = len(plan)
    pos = np.arange(seq_len, dtype=np.int32)
    b_start = a1 - a0 + 2
    length = b_start + (b1 - b0) + 1
    in_a = (pos >= 1) & (pos < b_start - 1)
    maskable = in_a | ((pos >= b_start) & (pos < length - 1))
    src = np.where(in_a, a0 - 1 + pos, b0 - b_start + pos)
    np.clip(src, 0, max(len(flat) - 1, 0), out=src)
    ids = np.take(flat, src) if len(flat) else np.zeros((n, seq_len), dtype=np.int32)
    ids *= maskable
    rows = np.arange(n)
    ids[:, 0] = sp.cls
    ids[rows, b_start[:, 0] - 1] = sp.sep
    ids[rows, length[:, 0] - 1] = sp.sep
    return ids, maskable


def choose(
    maskable: np.ndarray,
    ids: np.ndarray,
    a_len: np.ndarray,
    s: ExampleSettings,
    tables: VocabTables,
    gen: np.random.Generator,
) -> np.ndarray:
    """[N, max_pred] int32: the positions to predict, ascending, then 0s.

    How many: num_to_predict of the reference. Which: uniformly among the maskable
    positions, or whole words with --whole-word-mask.
    """
    n, seq = maskable.shape
    maskable_count = np.count_nonzero(maskable, axis=1)
    # len(tokens) of the reference counts [CLS] and both [SEP]s; rint rounds half to even
    # exactly as Python's round() there.
    count = np.rint((maskable_count + 3) * s.masked_lm_prob).astype(np.int64)
    k = np.minimum(np.minimum(s.max_pred, np.maximum(1, count)), maskable_count)
    if s.whole_word_mask:
        keys = gen.random((n, seq), dtype=np.float32)
        chosen = _whole_words(maskable, ids, k, keys, tables)
        positions = np.argsort(~chosen, axis=1, kind="stable")[:, : s.max_pred]
        return np.where(np.arange(s.max_pred) < chosen.sum(1)[:, None], positions, 0).astype(
            np.int32
        )
    # Floyd's sampling, a column per draw for all rows: k of the m maskable tokens, uniformly,
    # in max_pred draws of N numbers (not a random key for each of the N x S positions).
    m = maskable_count.astype(np.int64)
    u = gen.random((s.max_pred, n))
    rows = np.arange(n)
    taken = np.zeros((n, seq + s.max_pred), dtype=bool)  # rows past k draw beyond m: unused
    picked = np.empty((s.max_pred, n), dtype=np.int64)
    for q in range(s.max_pred):
        j = m - k + q
        t = (u[q] * (j + 1)).astype(np.int64)
        t = np.where(taken[rows, t], j, t)
        taken[rows, t] = True
        picked[q] = t
    picked = picked.T
    picked[np.arange(s.max_pred) >= k[:, None]] = seq
    picked.sort(axis=1)
    # The t-th maskable token: past [CLS], and past the middle [SEP] once beyond A.
    positions = picked + 1 + (picked >= a_len[:, None])
    positions[picked == seq] = 0
    return positions.astype(np.int32)


def _whole_words(
    maskable: np.ndarray, ids: np.ndarray, k: np.ndarray, keys: np.ndarray, tables: VocabTables
) -> np.ndarray:
    """Bool [N, S]. A ## piece belongs to the word before it; words are taken in random
    order, skipping any that would overshoot num_to_predict (the reference's greedy loop)."""
    n, seq = maskable.shape
    cont = tables.continuation[ids] & maskable
    cont[:, 0] = False
    starts = maskable & ~(cont & np.roll(maskable, 1, axis=1))
    word = np.cumsum(starts, axis=1) - 1
    nwords = starts.sum(axis=1)
    flat_word = (np.arange(n)[:, None] * seq + word)[maskable]
    wlen = np.bincount(flat_word, minlength=n * seq).reshape(n, seq)
    keys[np.arange(seq) >= nwords[:, None]] = 2.0
    order = np.argsort(keys, axis=1)
    lens = np.take_along_axis(wlen, order, 1)
    taken = np.zeros((n, seq), dtype=bool)
    total = np.zeros(n, dtype=np.int64)
    for j in range(int(nwords.max(initial=0))):
        t = (lens[:, j] > 0) & (total + lens[:, j] <= k)
        taken[:, j] = t
        total += np.where(t, lens[:, j], 0)
    by_word = np.zeros_like(taken)
    np.put_along_axis(by_word, order, taken, 1)
    return maskable & np.take_along_axis(by_word, np.maximum(word, 0), 1)


def mask(
    ids: np.ndarray,
    positions: np.ndarray,
    s: ExampleSettings,
    tables: VocabTables,
    gen: np.random.Generator,
) -> np.ndarray:
    """Replace the tokens at positions in place (80/10/10); return the original ids, 0-padded."""
    n = len(ids)
    used = positions != 0
    originals = np.where(used, np.take_along_axis(ids, positions, 1), 0).astype(np.int32)
    r = gen.random((n, s.max_pred), dtype=np.float32)
    random_tok = tables.random_ids[gen.integers(0, len(tables.random_ids), (n, s.max_pred))]
    new = np.where(r < 0.8, tables.special.mask, np.where(r < 0.9, originals, random_tok))
    rows = np.broadcast_to(np.arange(n)[:, None], (n, s.max_pred))
    ids[rows[used], positions[used]] = new[used]
    return originals


def make_examples(
    flat: np.ndarray,
    lengths: np.ndarray,
    doc: np.ndarray,
    chunk: tuple[int, ...],
    s: ExampleSettings,
    tables: VocabTables,
) -> dict[str, np.ndarray]:
    """All duplicates of one chunk's examples, compact (see `expand`): flat tokens, each
    line's length and document (lines run in document order), the chunk's place in the input.
    """
    keep = lengths > 0  # a line of nothing but dropped characters is no sentence
    sizes = np.bincount(doc[keep]) if keep.any() else np.zeros(0, np.int64)
    gen = _generator(s.seed, chunk)
    plan = plan_pairs(lengths[keep], sizes[sizes > 0], s, gen)
    ids, maskable = build(flat, plan, s.seq_len, tables.special)
    a_len, b_len = plan[:, 1] - plan[:, 0], plan[:, 3] - plan[:, 2]
    positions = choose(maskable, ids, a_len, s, tables, gen)
    originals = mask(ids, positions, s, tables, gen)
    small = np.uint16 if len(tables.continuation) <= 1 << 16 else np.int32
    return {
        "input_ids": ids.astype(small),
        "length": (a_len + b_len + 3).astype(np.int32),
        "b_start": (a_len + 2).astype(np.int32),
        "masked_lm_positions": positions.astype(np.uint16),
        "masked_lm_ids": originals.astype(small),
        "next_sentence_labels": plan[:, 4].astype(np.int8),
    }


# What each array of the shard format is made of, in the compact form.
SOURCES: dict[str, tuple[str, ...]] = {
    "input_ids": ("input_ids",),
    "input_mask": ("length",),
    "segment_ids": ("length", "b_start"),
    "masked_lm_positions": ("masked_lm_positions",),
    "masked_lm_ids": ("masked_lm_ids",),
    "next_sentence_labels": ("next_sentence_labels",),
}


def expand(key: str, c: dict[str, np.ndarray], seq_len: int) -> np.ndarray:
    """One array of the shard format (rows of a block) from compact examples (SOURCES[key]).

    Examples pass through a scratch file between the two stages (every shard takes rows of
    every chunk); in compact form (16-bit ids, masks as two lengths) that is ~3x fewer bytes
    than the format.
    """
    # A bool array is 0/1 bytes: viewed as int8, it is the mask (no copy).
    if key == "input_mask":
        return (np.arange(seq_len) < c["length"][:, None]).view(np.int8)
    if key == "segment_ids":
        pos = np.arange(seq_len)
        length, b_start = c["length"][:, None], c["b_start"][:, None]
        return ((pos >= b_start) & (pos < length)).view(np.int8)
    return c[key]
