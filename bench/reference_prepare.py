"""The minimal reference pipeline `bench/data_prepare.py` compares `data prepare` with.

What a careful user writes in an afternoon: the algorithm of Google's/NVIDIA's
create_pretraining_data.py (NVIDIA/DeepLearningExamples
PyTorch/LanguageModeling/BERT/create_pretraining_data.py) written plainly, one process:
tokenise each document with HF `tokenizers` (encode_batch per document, its threads off so
one process uses one core), make instances and mask them in Python loops, shuffle, and write
NVIDIA-format HDF5 shards the way that script does (gzip, h5py's default level 4, no shuffle
filter). It is stronger than that script itself: its tokeniser is pure Python, ours here is
Rust. Not used by the product; not imported by tests.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import h5py
import numpy as np

from trainmaster.data.corpus import Document, split_sentences
from trainmaster.data.vocab import Vocab, hf_tokenizer


def _instances(
    doc: list[list[int]],
    all_docs: list[list[list[int]]],
    d: int,
    seq_len: int,
    short_p: float,
    rng: random.Random,
) -> list[tuple[list[int], list[int], int]]:
    """(tokens A, tokens B, is_random_next) pairs of one document, as the reference makes them."""
    max_tokens = seq_len - 3
    target = rng.randint(2, max_tokens) if rng.random() < short_p else max_tokens
    out: list[tuple[list[int], list[int], int]] = []
    chunk: list[list[int]] = []
    length, i = 0, 0
    while i < len(doc):
        chunk.append(doc[i])
        length += len(doc[i])
        if i == len(doc) - 1 or length >= target:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            a = [t for s in chunk[:a_end] for t in s]
            if len(chunk) == 1 or rng.random() < 0.5:
                is_random = 1
                r = d
                for _ in range(10):
                    r = rng.randint(0, len(all_docs) - 1)
                    if r != d:
                        break
                other = all_docs[r]
                b: list[int] = []
                for s in other[rng.randint(0, len(other) - 1) :]:
                    b.extend(s)
                    if len(b) >= target - len(a):
                        break
                i -= len(chunk) - a_end  # put the unused sentences back
            else:
                is_random = 0
                b = [t for s in chunk[a_end:] for t in s]
            while len(a) + len(b) > max_tokens:  # truncate_seq_pair
                longer = a if len(a) > len(b) else b
                del longer[0 if rng.random() < 0.5 else -1]
            if a and b:
                out.append((a, b, is_random))
            chunk, length = [], 0
            target = rng.randint(2, max_tokens) if rng.random() < short_p else max_tokens
        i += 1
    return out


def _mask(
    tokens: list[int],
    special: set[int],
    n_vocab: int,
    mask_id: int,
    max_pred: int,
    prob: float,
    rng: random.Random,
) -> tuple[list[int], list[int], list[int]]:
    """create_masked_lm_predictions: 80% [MASK], 10% kept, 10% a random token."""
    cand = [i for i, t in enumerate(tokens) if t not in special]
    rng.shuffle(cand)
    k = min(max_pred, max(1, int(round(len(tokens) * prob))))
    out = list(tokens)
    picked = sorted(cand[:k])
    for p in picked:
        r = rng.random()
        out[p] = mask_id if r < 0.8 else tokens[p] if r < 0.9 else rng.randint(0, n_vocab - 1)
    return out, picked, [tokens[p] for p in picked]


def reference_prepare(
    docs: list[Document],
    vocab: Vocab,
    out: Path,
    *,
    seq_len: int = 128,
    max_pred: int = 20,
    dupe_factor: int = 5,
    shards: int = 8,
    short_p: float = 0.1,
    prob: float = 0.15,
    seed: int = 12345,
    stages: dict[str, float] | None = None,
) -> int:
    """Write `shards` NVIDIA-format files into out; return the input's token count.

    stages, when given, gets the seconds of each step (timing only: the logic is as above).
    """
    clock = [time.monotonic()]

    def lap(name: str) -> None:
        now = time.monotonic()
        if stages is not None:
            stages[name] = now - clock[0]
        clock[0] = now

    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core, as our one worker
    tok = hf_tokenizer(vocab, lower_case=True)
    tokenised: list[list[list[int]]] = []
    n_tokens = 0
    for doc in docs:
        sentences = [s for line in doc for s in split_sentences(line)]
        ids = [e.ids for e in tok.encode_batch(sentences, add_special_tokens=False) if e.ids]
        n_tokens += sum(map(len, ids))
        if ids:
            tokenised.append(ids)
    lap("tokenise")
    rng = random.Random(seed)
    sp = vocab.special
    special = {sp.cls, sp.sep}
    examples = []
    for _ in range(dupe_factor):
        for d, doc_ids in enumerate(tokenised):
            for a, b, is_random in _instances(doc_ids, tokenised, d, seq_len, short_p, rng):
                tokens = [sp.cls, *a, sp.sep, *b, sp.sep]
                segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
                masked, positions, labels = _mask(
                    tokens, special, len(vocab), sp.mask, max_pred, prob, rng
                )
                examples.append((masked, segments, positions, labels, is_random))
    lap("pairs_mask")
    rng.shuffle(examples)
    per = -(-len(examples) // shards)
    out.mkdir(parents=True, exist_ok=True)
    for k in range(shards):
        part = examples[k * per : (k + 1) * per]
        n = len(part)
        arr = {
            "input_ids": np.zeros((n, seq_len), "i4"),
            "input_mask": np.zeros((n, seq_len), "i1"),
            "segment_ids": np.zeros((n, seq_len), "i1"),
            "masked_lm_positions": np.zeros((n, max_pred), "i4"),
            "masked_lm_ids": np.zeros((n, max_pred), "i4"),
            "next_sentence_labels": np.zeros(n, "i1"),
        }
        for r, (masked, segments, positions, labels, is_random) in enumerate(part):
            arr["input_ids"][r, : len(masked)] = masked
            arr["input_mask"][r, : len(masked)] = 1
            arr["segment_ids"][r, : len(segments)] = segments
            arr["masked_lm_positions"][r, : len(positions)] = positions
            arr["masked_lm_ids"][r, : len(labels)] = labels
            arr["next_sentence_labels"][r] = is_random
        with h5py.File(out / f"ref_training_{k}.hdf5", "w") as f:
            for key, a in arr.items():
                f.create_dataset(key, data=a, compression="gzip")
    lap("shuffle_write")
    return n_tokens
