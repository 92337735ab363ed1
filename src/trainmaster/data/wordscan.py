"""The words of normalised text as arrays: where each starts and ends, and a 64-bit key.

The encoder's shortcut needs, for every word of a chunk, its entry in the word cache. A
regex findall makes a Python string per word and then a dict lookup per word (~200 ns
each, half of all the time `data prepare` spent). Here the text is one array of code
points; a word is a run of ASCII letters/digits, any other non-space character alone, or
"\\n" (a line's end); and each word's key is a polynomial hash of its characters, read off
one cumulative sum: ~2x faster for the step. Keys are hashes mod 2**64 plus the length, so
two words could share one (odds ~n**2 / 2**65 for n distinct words, 3e-10 for 100k) and
then share pieces; the strings of new words are still taken from the text.
"""

from __future__ import annotations

import numpy as np

WORD, OTHER, NEWLINE = 1, 2, 3
_BASE = 0x9E3779B97F4A7C15  # odd: invertible mod 2**64
_LENGTH = np.uint64(0xC2B2AE3D27D4EB4F)

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
