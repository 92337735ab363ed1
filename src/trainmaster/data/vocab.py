"""WordPiece vocabularies: load a BERT vocab.txt, or train one deterministically.

A vocab.txt is one token per line; the line number is the id (Google's format). The shards
pad with id 0 and mark unused prediction slots with id 0, so [PAD] must be id 0: any other
token there would be indistinguishable from padding.

Training uses HF `tokenizers` (its WordPiece trainer is BPE underneath). Out of the box it is
not reproducible (huggingface/tokenizers#1794): the `##x` continuation tokens get their ids
in hash-map order, and those ids break ties between equally frequent merges. We register
every `##x` that can occur, sorted, as an initial token, so no id depends on hash order.
"""

from __future__ import annotations

import hashlib
import os
import string
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from trainmaster import files
from trainmaster.errors import DataError

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
DEFAULT_VOCAB_SIZE = 8192
MIN_VOCAB_SIZE = 100  # below this WordPiece degenerates to characters and the check is a typo
CONTINUATION = "##"


@dataclass(frozen=True)
class SpecialIds:
    """Ids of the tokens the example format relies on."""

    pad: int
    unk: int
    cls: int
    sep: int
    mask: int


# NVIDIA's shards use Google's bert-*-uncased vocab: what verify/inspect assume without a vocab.
NVIDIA_SPECIAL_IDS = SpecialIds(pad=0, unk=100, cls=101, sep=102, mask=103)
NVIDIA_VOCAB_SIZE = 30522


@dataclass(frozen=True)
class Vocab:
    tokens: tuple[str, ...]
    source: str  # the file it came from, or "trained"
    ids: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ids: dict[str, int] = {}
        for i, tok in enumerate(self.tokens):
            if tok and tok not in ids:
                ids[tok] = i
        object.__setattr__(self, "ids", ids)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def special(self) -> SpecialIds:
        return SpecialIds(*(self.ids[t] for t in SPECIAL_TOKENS))

    def text(self) -> str:
        return "".join(f"{t}\n" for t in self.tokens)

    def sha256(self) -> str:
        return hashlib.sha256(self.text().encode("utf-8")).hexdigest()

    def write(self, path: Path) -> None:
        """Atomically: a reader never sees half a vocabulary next to complete shards."""
        files.write_atomic(path, self.text())


def parse_vocab(text: str, source: str) -> Vocab:
    """Check a vocabulary's text; DataError names the file and what to fix."""
    tokens = tuple(line.strip() for line in text.splitlines())
    seen: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        if tok in seen and tok:
            raise DataError(
                f"line {i + 1} repeats the token {tok!r} of line {seen[tok] + 1}; "
                "each token must appear once",
                where=source,
            )
        seen.setdefault(tok, i)
    missing = [t for t in SPECIAL_TOKENS if t not in seen]
    if missing:
        raise DataError(
            f"vocabulary lacks {', '.join(missing)}; a BERT vocab.txt needs all of "
            f"{' '.join(SPECIAL_TOKENS)} (one per line)",
            where=source,
        )
    if seen[PAD] != 0:
        raise DataError(
            f"[PAD] is on line {seen[PAD] + 1}, but shards pad with id 0: "
            "put [PAD] on the first line",
            where=source,
        )
    return Vocab(tokens, source)


def load_vocab(path: str | os.PathLike[str]) -> Vocab:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise DataError(
            f"cannot read the vocabulary ({exc.strerror}); pass an existing vocab.txt to --vocab",
            where=str(p),
        ) from exc
    try:
        if b"\0" in raw:
            raise UnicodeDecodeError("utf-8", raw, raw.index(b"\0"), raw.index(b"\0") + 1, "NUL")
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            "not a text vocabulary (binary or not UTF-8); pass a BERT vocab.txt", where=str(p)
        ) from exc
    return parse_vocab(text, str(p))


def bert_normalizer(lower_case: bool) -> normalizers.Normalizer:
    # strip_accents=None follows lower_case, as Google's BERT tokenizer does.
    return normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lower_case
    )


def hf_tokenizer(vocab: Vocab, lower_case: bool) -> Tokenizer:
    """The BERT tokenizer without special tokens registered.

    Not registering [SEP] and friends as added tokens matters: a literal "[SEP]" in the text
    must become ordinary pieces, never the separator id the format gives meaning to.
    """
    tok = Tokenizer(models.WordPiece(dict(vocab.ids), unk_token=UNK, max_input_chars_per_word=100))
    tok.normalizer = bert_normalizer(lower_case)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tok


def _is_split_char(c: str) -> bool:
    """Whitespace and punctuation: the pre-tokenizer makes these words of their own."""
    return c.isspace() or c in string.punctuation or unicodedata.category(c).startswith("P")


def _continuation_tokens(lines: list[str], lower_case: bool) -> list[str]:
    """Every `##c` the trainer could create, in a fixed order (see the module docstring)."""
    raw_chars = set("".join(lines))
    norm = bert_normalizer(lower_case)
    chars: set[str] = set()
    for c in raw_chars:
        chars.update(norm.normalize_str(c))
    return [CONTINUATION + c for c in sorted(chars) if not _is_split_char(c)]


def train_vocab(
    lines: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE, lower_case: bool = True
) -> Vocab:
    """Train a WordPiece vocabulary on text lines; the same lines give the same vocab.

    The trainer counts words, so the line structure does not matter, only the words. It may
    return fewer than vocab_size tokens on a small corpus (words seen once are not merged).
    """
    text = list(lines)
    initial = [*SPECIAL_TOKENS, *_continuation_tokens(text, lower_case)]
    tok = Tokenizer(models.WordPiece(unk_token=UNK))
    tok.normalizer = bert_normalizer(lower_case)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=max(vocab_size, len(initial)),
        min_frequency=2,
        show_progress=False,
        special_tokens=initial,
        continuing_subword_prefix=CONTINUATION,
    )
    tok.train_from_iterator(_batches(text), trainer, length=len(text))
    by_id = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):  # the trainer numbers densely
        raise RuntimeError("tokenizers returned a vocabulary with gaps in its ids")
    return Vocab(tuple(t for t, _ in by_id), "trained")


def _batches(lines: list[str], size: int = 1000) -> Iterator[list[str]]:
    for i in range(0, len(lines), size):
        yield lines[i : i + size]
