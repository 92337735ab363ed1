"""The fast tokeniser path gives exactly HF's pieces; vocabularies load and train as BERT's."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from trainmaster.data.corpus import pydoc_documents, split_sentences
from trainmaster.data.vocab import load_vocab, parse_vocab, train_vocab
from trainmaster.data.wordpiece import Encoder
from trainmaster.data.wordscan import _SPREAD, KeyTable, Scanner
from trainmaster.errors import DataError

TRICKY = [
    "Hello, World! x_y == 3.14 -- (a[b]) {c}; 'q' \"r\" `s` ~t^ @u #v $w %x &y *z +1 <2> =3 ?4 |5 \\6 /7",
    "Tabs\tand\r\nnewlines stay whitespace",
    "Control\x01chars\x7fjoin words",  # BERT deletes them: "controlchars" is one word
    "Form\x0cfeed and vertical\x0btab are control characters to BERT",
    "File\x1cseparators\x1fare too",
    "Curly “quotes” and — dashes… stay punctuation",
    "Café, naïve, résumé: accents go when lower-casing",
    "Ünïcödé ΣΊΣΥΦΟΣ and 中文字符 and emoji 🙂 and\u00a0nbsp\u2009thin",
    "[CLS] [SEP] [MASK] [PAD] in the text are ordinary pieces, never the special ids",
    "x" * 150 + " is longer than a word may be",
    "",
    "   ",
]


@pytest.mark.parametrize("lower_case", [True, False])
def test_fast_path_equals_hf(pydoc_vocab: Path, lower_case: bool) -> None:
    vocab = load_vocab(pydoc_vocab)
    enc = Encoder(vocab, lower_case)
    sentences = [s for d in pydoc_documents() for line in d for s in split_sentences(line)]
    sentences += TRICKY
    flat, lengths = enc.encode(sentences)
    exact = enc.encode_exact(sentences)
    assert lengths.tolist() == [len(e) for e in exact]
    assert np.array_equal(flat, np.array([i for e in exact for i in e], dtype=np.int32))
    again, _ = enc.encode(sentences)  # now from the word cache
    assert np.array_equal(again, flat)


def test_special_tokens_in_text_are_not_special(pydoc_vocab: Path) -> None:
    vocab = load_vocab(pydoc_vocab)
    flat, _ = Encoder(vocab, True).encode(["a [SEP] b [CLS] c [MASK]"])
    sp = vocab.special
    assert not set(flat.tolist()) & {sp.cls, sp.sep, sp.mask, sp.pad}


def test_trained_vocab_is_bert_shaped() -> None:
    lines = [line for d in pydoc_documents()[:20] for line in d]
    v = train_vocab(lines, vocab_size=2000)
    assert v.tokens[:5] == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
    assert len(v) <= 2000 and len(set(v.tokens)) == len(v)
    assert any(t.startswith("##") and len(t) > 3 for t in v.tokens)  # real continuation pieces
    assert "the" in v.ids
    assert train_vocab(lines, vocab_size=2000).tokens == v.tokens


def test_vocab_rules() -> None:
    ok = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n"
    assert len(parse_vocab(ok, "v.txt")) == 6
    with pytest.raises(DataError, match=r"v.txt: \[PAD\] is on line 2"):
        parse_vocab("word\n" + ok, "v.txt")
    with pytest.raises(DataError, match="line 7 repeats the token 'the' of line 6"):
        parse_vocab(ok + "the\n", "v.txt")


@pytest.mark.parametrize(
    "batch",
    [
        ["plain ascii one", "two\nlines in one sentence", "three"],  # a "\n" of a sentence's own
        ["only one sentence here."],
        ["", "", "between empties", ""],
        [],
    ],
)
def test_whole_batch_path_keeps_sentence_boundaries(pydoc_vocab: Path, batch: list[str]) -> None:
    """The batch is encoded as one string with "\\n" between sentences; a sentence's own "\\n"
    or an empty sentence must not move a boundary."""
    enc = Encoder(load_vocab(pydoc_vocab), True)
    flat, lengths = enc.encode(batch)
    exact = enc.encode_exact(batch) if batch else []
    assert lengths.tolist() == [len(e) for e in exact]
    assert flat.tolist() == [i for e in exact for i in e]


def test_scanner_finds_the_words_a_regex_finds() -> None:
    """wordscan splits as [A-Za-z0-9]+ | any other non-space character | "\\n", and gives
    one word one key and different words different keys."""
    text = "\n".join(
        [s for d in pydoc_documents()[:30] for line in d for s in split_sentences(line)]
        + ["Tabs\tand\rreturns", "a “quoted” — word…", "x" * 150, "", "  end.", "ÉÉ is 2 words?"]
    )
    keys, starts, ends, _ = Scanner().scan(text)
    words = [text[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
    assert words == re.findall(r"[A-Za-z0-9]+|[^A-Za-z0-9\s]|\n", text)
    key_of: dict[str, int] = {}
    for w, k in zip(words, keys.tolist(), strict=True):
        assert key_of.setdefault(w, k) == k
    assert len(set(key_of.values())) == len(key_of) > 1000


def test_key_table_finds_every_key_it_holds() -> None:
    """Batches of keys, many sharing a home slot (equal top bits), across regrowths."""
    rng = np.random.default_rng(0)
    keys = np.unique(
        np.concatenate(
            [
                rng.integers(0, 2**63, 30_000, dtype=np.uint64) * np.uint64(2),
                # key * _SPREAD = 0..499: all of them in home slot 0
                np.arange(500, dtype=np.uint64) * np.uint64(pow(int(_SPREAD), -1, 2**64)),
            ]
        )
    )
    keys = rng.permutation(keys)
    rows = np.arange(len(keys))
    table = KeyTable()
    for part in np.array_split(np.arange(len(keys)), 7):
        table.add(keys[part], rows[part])
        assert np.array_equal(table.get(keys[: part[-1] + 1]), rows[: part[-1] + 1])
    absent = keys + np.uint64(1)  # odd: none of the random keys; some of the small ones
    got = table.get(absent)
    held = np.isin(absent, keys)
    assert (got[~held] == -1).all() and table.size == len(keys)
