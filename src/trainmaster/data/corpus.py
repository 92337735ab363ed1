"""Input text: files, folders, .gz files and the built-in corpus, as documents of lines.

The format is Google's: one sentence (or paragraph) per line, documents separated by blank
lines. read_corpus reads and checks everything at once (for training a vocabulary, and the
benchmark's reference); `data prepare` has its workers read slices of it (data/slices.py),
with the same checks and messages, and the same sentences and documents from the helpers
below, each a few passes over a chunk's whole text.
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainmaster.errors import DataError

BUILTINS = ("pydoc",)
Document = list[str]  # lines: sentences or paragraphs

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
# The same within a line; no lookbehind: ~2x faster on a whole text.
_SENTENCE_IN_TEXT = re.compile(r"([.!?])[^\S\n]+(?=[A-Z])")
_DECORATION = re.compile(r"[\W_]+")  # "*****", "=====": headings' underlines, not prose
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


@dataclass(frozen=True)
class SourceInfo:
    name: str  # the path as given, or "builtin:pydoc"
    bytes: int


@dataclass(frozen=True)
class Corpus:
    documents: list[Document]
    sources: list[SourceInfo]

    @property
    def chars(self) -> int:
        return sum(len(line) for doc in self.documents for line in doc)

    def lines(self) -> list[str]:
        return [line for doc in self.documents for line in doc]


def split_sentences(line: str) -> list[str]:
    """A long line is usually a paragraph: split it after . ! ? followed by a capital."""
    return _SENTENCE_END.split(line)


def sentence_lines(text: str) -> str:
    """split_sentences of every line of text at once: each sentence on a line of its own."""
    return _SENTENCE_IN_TEXT.sub(_end_line, text)


def _end_line(m: re.Match[str]) -> str:
    return m[1] + "\n"  # a function: cheaper per match than the template r"\1\n"


def document_ids(text: str, lengths: np.ndarray) -> tuple[np.ndarray, int]:
    """Each line's document (a blank line ends one, as documents_from_text reads them), and
    how many lines are not blank. lengths: the lines' token counts (a blank line has none).
    """
    lines = text.split("\n")
    zero = np.flatnonzero(lengths == 0)
    blank = np.zeros(len(lines), dtype=bool)
    blank[zero] = [not lines[k] or lines[k].isspace() for k in zero.tolist()]
    return np.cumsum(blank), len(lines) - int(blank.sum())


def documents_from_text(text: str) -> list[Document]:
    docs: list[Document] = []
    current: Document = []
    for raw in text.split("\n"):
        line = raw.strip()
        if line:
            current.append(line)
        elif current:
            docs.append(current)
            current = []
    if current:
        docs.append(current)
    return docs


def pydoc_documents() -> list[Document]:
    """Python's reference docs shipped with CPython: one document per topic, sorted.

    The topics are wrapped at ~70 columns, so a line is not a sentence: paragraphs are joined
    into one line each (the sentence splitter cuts them later) and headings' underlines go.
    """
    from pydoc_data.topics import topics

    docs: list[Document] = []
    for key in sorted(topics):
        paragraphs = []
        for block in _PARAGRAPH_BREAK.split(topics[key]):
            words = [
                ln
                for ln in block.split("\n")
                if ln.strip() and not _DECORATION.fullmatch(ln.strip())
            ]
            text = " ".join(" ".join(words).split())
            if text:
                paragraphs.append(text)
        if paragraphs:
            docs.append(paragraphs)
    return docs


def expand_inputs(inputs: list[Path]) -> list[Path]:
    """Files as given; folders recursively, sorted, skipping hidden files (.DS_Store, .git)."""
    files: list[Path] = []
    for p in inputs:
        if p.is_dir():
            found = sorted(
                f
                for f in p.rglob("*")
                if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts)
            )
            if not found:
                raise DataError(
                    "folder holds no files; give text files or folders of them", where=str(p)
                )
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise DataError("no such file or folder; check the INPUT path", where=str(p))
    return files


def read_text(path: Path) -> str:
    """UTF-8 text of a file (.gz decompressed); DataError for anything binary."""
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise DataError(
            f"cannot read ({reason}); inputs must be text or gzip'd text", where=str(path)
        ) from exc
    nul = raw.find(b"\0")
    if nul >= 0:
        raise DataError(
            f"binary file (NUL byte at offset {nul}); inputs must be UTF-8 text", where=str(path)
        )
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"not UTF-8 text (bad byte at offset {exc.start}); convert it with iconv or drop it",
            where=str(path),
        ) from exc


def check_inputs(inputs: list[Path], builtin: str | None) -> None:
    """Some input, and a built-in corpus that exists: before anything is read."""
    if builtin is not None and builtin not in BUILTINS:
        raise DataError(
            f"unknown built-in corpus {builtin!r}; choose one of: {', '.join(BUILTINS)}",
            where="--builtin",
        )
    if not inputs and builtin is None:
        raise DataError("no input: give text files or folders, or --builtin pydoc")


def read_corpus(inputs: list[Path], builtin: str | None = None) -> Corpus:
    check_inputs(inputs, builtin)
    documents: list[Document] = []
    sources: list[SourceInfo] = []
    if builtin == "pydoc":
        docs = pydoc_documents()
        documents.extend(docs)
        sources.append(SourceInfo("builtin:pydoc", sum(len(ln.encode()) for d in docs for ln in d)))
    for path in expand_inputs(inputs):
        documents.extend(documents_from_text(read_text(path)))
        sources.append(SourceInfo(str(path), path.stat().st_size))
    if not documents:
        names = ", ".join(s.name for s in sources)
        raise DataError(
            f"no text in {names}; give lines of text, documents separated by blank lines"
        )
    return Corpus(documents, sources)
