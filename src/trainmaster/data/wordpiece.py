"""Sentences -> WordPiece ids, fast: the one step that touches every character of the input.

HF `tokenizers` is exact but spends ~2 us per token building Encoding objects (offsets,
token strings) we do not need. Most English text is plain ASCII, where BERT's normalizer and
pre-tokenizer reduce to "lower-case, split into runs of letters/digits and single
punctuation characters". For such sentences we find the words with numpy (data/wordscan.py)
and look each distinct word up in a cache filled by the HF tokenizer itself, so the pieces
are the HF pieces. Any sentence the shortcut cannot be sure about (non-ASCII, control
characters) goes to HF whole.
tests/data/test_wordpiece.py checks both paths agree on the built-in corpus and edge cases.
"""

from __future__ import annotations

import re
import unicodedata
from itertools import chain

import numpy as np

from trainmaster.data.vocab import Vocab, hf_tokenizer
from trainmaster.data.wordscan import NEWLINE, KeyTable, Scanner

# Control characters BERT's clean_text deletes (so they join words); \t \n \r are whitespace.
# \x1c-\x1f are also whitespace to Python's regex but control characters to BERT.
_UNSURE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_UNUSUAL = re.compile(r"[^\t\n\r\x20-\x7e]")  # _UNSURE or non-ASCII
# Every printable ASCII character that is not a letter or digit is BERT punctuation; so is
# any non-ASCII character the shortcut lets through (see _plain_punctuation): wordscan makes
# each a word. A batch is one string, sentences joined by "\n": "\n" is a word of its own
# (the sentence boundary, no pieces), so one scan and one lower() serve the whole batch.
_BOUNDARY = 0  # the CSR table's entry for "\n" (no pieces)
_CACHE_LIMIT = 2_000_000  # distinct words; bounds memory on huge corpora


def _plain_punctuation(c: str) -> bool:
    """Punctuation the normaliser leaves alone (curly quotes, dashes): a word of its own."""
    return (
        unicodedata.category(c).startswith("P")
        and c.lower() == c
        and unicodedata.normalize("NFD", c) == c
    )


class Encoder:
    """Encodes batches of sentences; one per process (it keeps a word cache).

    The cache is a table of distinct words' keys -> their pieces (CSR: start, length,
    pieces), so turning a chunk's words into token ids is a hash lookup and a gather.
    """

    def __init__(self, vocab: Vocab, lower_case: bool) -> None:
        self.lower_case = lower_case
        self._hf = hf_tokenizer(vocab, lower_case)
        self._model = self._hf.model  # WordPiece alone: 3x faster per word than the pipeline
        self._scanner = Scanner()
        self._plain: dict[str, bool] = {}
        self._reset()

    def _reset(self) -> None:
        self._table = KeyTable()  # word key -> its row of the CSR table
        # numpy, grown by concatenation: no list -> array conversion of the cache per batch
        self._starts = np.zeros(1, np.int64)
        self._lens = np.zeros(1, np.int64)
        self._pieces = np.zeros(0, np.int32)

    def encode_exact(self, sentences: list[str]) -> list[list[int]]:
        """The reference path: HF for every sentence."""
        return [e.ids for e in self._hf.encode_batch_fast(sentences, add_special_tokens=False)]

    def _unsure_lines(self, text: str) -> list[int]:
        """Lines of text the shortcut cannot be sure about, found with one or two scans of
        the whole text (not a check per line): control characters, or non-ASCII characters
        other than plain punctuation."""
        if text.isascii() and not _UNSURE.search(text):
            return []
        plain = self._plain
        chars = set(_UNUSUAL.findall(text))
        for c in chars - plain.keys():
            plain[c] = not _UNSURE.match(c) and _plain_punctuation(c)
        bad = "".join(re.escape(c) for c in sorted(chars) if not plain[c])
        if not bad:
            return []
        at = np.fromiter((m.start() for m in re.finditer(f"[{bad}]", text)), dtype=np.int64)
        ends = np.cumsum(np.fromiter(map(len, text.split("\n")), dtype=np.int64) + 1)
        return np.unique(np.searchsorted(ends, at, side="right")).tolist()

    @staticmethod
    def _grow(
        starts: np.ndarray, lens: np.ndarray, pieces: np.ndarray, new: list[list[int]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The CSR table with one entry per item of new appended (a copy)."""
        n = np.fromiter(map(len, new), dtype=np.int64, count=len(new))
        at = len(pieces) + np.cumsum(n) - n
        flat = np.fromiter(chain.from_iterable(new), dtype=np.int32, count=int(n.sum()))
        return (
            np.concatenate([starts, at]),
            np.concatenate([lens, n]),
            np.concatenate([pieces, flat]),
        )

    def _add(self, keys: np.ndarray, pieces: list[list[int]]) -> None:
        first = len(self._starts)
        self._table.add(keys, np.arange(first, first + len(pieces)))
        self._starts, self._lens, self._pieces = self._grow(
            self._starts, self._lens, self._pieces, pieces
        )

    def encode(self, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of all sentences, concatenated (int32), and each sentence's length."""
        if not sentences:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        text = "\n".join(sentences)
        if text.count("\n") == len(sentences) - 1:
            return self.encode_text(text)
        # A sentence with a "\n" of its own goes to HF (it is whitespace there).
        own = {k: s for k, s in enumerate(sentences) if "\n" in s}
        return self._encode("\n".join("" if k in own else s for k, s in enumerate(sentences)), own)

    def encode_text(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of every line of text (a sentence per line), concatenated, and each
        line's length (0 for a blank one)."""
        return self._encode(text, {})

    def _encode(self, text: str, exact: dict[int, str]) -> tuple[np.ndarray, np.ndarray]:
        """Lines of text by the word cache, but those in exact (emptied in text) and those
        the shortcut is unsure of, which HF encodes whole."""
        if self._table.size > _CACHE_LIMIT:
            self._reset()
        unsure = self._unsure_lines(text)
        if unsure:
            lines = text.split("\n")
            exact = {**exact, **{k: lines[k] for k in unsure}}
            for k in unsure:
                lines[k] = ""
            text = "\n".join(lines)
        low = text.lower() if self.lower_case else text
        keys, word_starts, word_ends, kinds = self._scanner.scan(low)
        wid = self._table.get(keys)
        wid[kinds == NEWLINE] = _BOUNDARY
        boundary = np.flatnonzero(wid == _BOUNDARY)
        counts = np.diff(np.concatenate([[-1], boundary, [len(wid)]])) - 1  # words per line
        missing = np.flatnonzero(wid < 0)
        if missing.size:
            # A word here is normalised already (lower-cased ASCII or plain punctuation) and
            # one pre-token: the normaliser and pre-tokenizer would pass it through unchanged.
            new, first = np.unique(keys[missing], return_index=True)
            one = missing[first]  # an occurrence of each new word
            spans = zip(word_starts[one].tolist(), word_ends[one].tolist(), strict=True)
            words = [low[a:b] for a, b in spans]
            tokenize = self._model.tokenize
            self._add(new, [[t.id for t in tokenize(w)] for w in words])
            wid[missing] = self._table.get(keys[missing])
        wid = wid[wid != _BOUNDARY]
        starts, lens, pieces = self._starts, self._lens, self._pieces
        if exact:
            # Each line HF had to do is one pseudo-word of this call only (not cached).
            order = sorted(exact)
            done = self.encode_exact([exact[k] for k in order])
            local = np.arange(len(starts), len(starts) + len(order))
            starts, lens, pieces = self._grow(starts, lens, pieces, done)
            at = (np.cumsum(counts) - counts)[order]
            wid = np.insert(wid, at, local)
            counts[order] = 1
        wl = lens[wid]
        ends = np.cumsum(wl)
        src = np.repeat(starts[wid] - (ends - wl), wl)
        flat = pieces[src + np.arange(len(src))]
        cum = np.concatenate([[0], ends])
        last = np.cumsum(counts)
        return flat, cum[last] - cum[last - counts]
