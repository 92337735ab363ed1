"""The words of normalised text as arrays: where each starts and ends, and a 64-bit key.

The encoder's shortcut needs, for every word of a chunk, its entry in the word cache. A
regex findall makes a Python string per word and then a dict lookup per word (~200 ns
each, half of all the time `data prepare` spent). Here the text is one array of code
points; a word is a run of ASCII letters/digits, any other non-space character alone, or
"\\n" (a line's end); and each word's key is a polynomial hash of its characters, read off
one cumulative sum, faster for the step (bench/data_prepare.py times the stages). Keys are hashes mod 2**64 plus the length, so
two words could share one (odds ~n**2 / 2**65 for n distinct words, 3e-10 for 100k) and
then share pieces; the strings of new words are still taken from the text.
"""

from __future__ import annotations

import numpy as np

WORD, OTHER, NEWLINE = 1, 2, 3
_BASE = 0x9E3779B97F4A7C15  # odd: invertible mod 2**64
_LENGTH = np.uint64(0xC2B2AE3D27D4EB4F)
_SPREAD = np.uint64(0xBF58476D1CE4E5B9)

_CLASS = np.full(128, OTHER, dtype=np.uint8)  # ASCII punctuation: a word of its own
for _c in " \t\r\x0b\x0c\x1c\x1d\x1e\x1f":
    _CLASS[ord(_c)] = 0
_CLASS[ord("\n")] = NEWLINE
for _c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789":
    _CLASS[ord(_c)] = WORD


def _powers(base: int, n: int) -> np.ndarray:
    p = np.full(n, base, dtype=np.uint64)
    p[0] = 1
    return np.cumprod(p, dtype=np.uint64)  # wraps mod 2**64, as intended


class Scanner:
    """One per encoder: keeps the powers of the base (grown to the longest text seen)."""

    def __init__(self) -> None:
        self._pow = np.ones(1, np.uint64)
        self._inv = np.ones(1, np.uint64)

    def _ensure(self, n: int) -> None:
        if len(self._pow) < n:
            size = max(n, 2 * len(self._pow))
            self._pow = _powers(_BASE, size)
            self._inv = _powers(pow(_BASE, -1, 2**64), size)

    def scan(self, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """keys (uint64), starts, ends (character offsets) and kinds of text's words.

        The text must be what the shortcut handles: its only whitespace ASCII, every
        non-ASCII character punctuation (a word alone).
        """
        if text.isascii():
            codes: np.ndarray = np.frombuffer(text.encode("ascii"), np.uint8)
            kind = _CLASS[codes]
        else:
            codes = np.frombuffer(text.encode("utf-32-le"), np.uint32)
            kind = np.where(codes < 128, _CLASS[np.minimum(codes, 127)], OTHER).astype(np.uint8)
        n = len(codes)
        word = kind == WORD
        before = np.zeros(n, dtype=bool)
        before[1:] = word[:-1]
        after = np.zeros(n, dtype=bool)
        after[:-1] = word[1:]
        starts = np.flatnonzero((word & ~before) | (kind >= OTHER))
        ends = starts + 1
        ends[word[starts]] = np.flatnonzero(word & ~after) + 1
        self._ensure(n + 1)
        prefix = np.zeros(n + 1, dtype=np.uint64)
        np.cumsum(codes * self._pow[:n], out=prefix[1:])
        length = (ends - starts).astype(np.uint64)
        keys = (prefix[ends] - prefix[starts]) * self._inv[starts] + length * _LENGTH
        return keys, starts, ends, kind[starts]


class KeyTable:
    """Word keys -> rows of the encoder's CSR table: open addressing, a key's home slot the
    top bits of key * an odd constant, at most 1/4 full. Lookups and inserts are
    whole-array rounds: one for nearly every key (~3x faster than a binary search)."""

    def __init__(self, bits: int = 12) -> None:
        self._alloc(bits)
        self.size = 0

    def _alloc(self, bits: int) -> None:
        self._key = np.zeros(1 << bits, np.uint64)
        self._row = np.full(1 << bits, -1, np.int64)
        self._shift = np.uint64(64 - bits)

    def _home(self, keys: np.ndarray) -> np.ndarray:
        # Multiplied first: short words' keys differ in their low bits only.
        return ((keys * _SPREAD) >> self._shift).astype(np.int64)

    def get(self, keys: np.ndarray) -> np.ndarray:
        """Each key's row, -1 where the table lacks it."""
        out = np.full(len(keys), -1, np.int64)
        slot, pending, last = self._home(keys), np.arange(len(keys)), len(self._row) - 1
        while pending.size:
            s = slot[pending]
            row = self._row[s]
            found = (self._key[s] == keys[pending]) & (row >= 0)
            out[pending[found]] = row[found]
            pending = pending[(row >= 0) & ~found]  # a full slot, another key: probe on
            slot[pending] = (slot[pending] + 1) & last
        return out

    def add(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """New, distinct keys."""
        if 4 * (self.size + len(keys)) > len(self._row):
            old = self._row >= 0
            keys = np.concatenate([self._key[old], keys])
            rows = np.concatenate([self._row[old], rows])
            self._alloc(max((4 * len(keys)).bit_length(), 12))
            self.size = 0
        slot, pending, last = self._home(keys), np.arange(len(keys)), len(self._row) - 1
        while pending.size:
            s = slot[pending]
            free = self._row[s] < 0
            _, first = np.unique(s[free], return_index=True)  # one key per free slot
            won = pending[free][first]
            self._key[slot[won]], self._row[slot[won]] = keys[won], rows[won]
            pending = np.setdiff1d(pending, won, assume_unique=True)
            slot[pending] = (slot[pending] + 1) & last
        self.size += len(keys)
