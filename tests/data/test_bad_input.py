"""Bad input: one clear DataError naming the field or file, and nothing left behind."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainmaster.data.prepare import prepare
from trainmaster.data.verify import verify
from trainmaster.errors import DataError, UserError

Setup = Callable[[Path, Path], dict[str, Any]]  # (tmp folder, good vocab) -> prepare kwargs


def _text(tmp: Path, name: str, data: bytes) -> Path:
    path = tmp / name
    path.write_bytes(data)
    return path


def _vocab_without(tmp: Path, vocab: Path, *drop: str) -> Path:
    lines = [t for t in vocab.read_text().splitlines() if t not in drop]
    return _text(tmp, "bad_vocab.txt", ("\n".join(lines) + "\n").encode())


SENTENCES = b"The first sentence is here.\nAnd a second one follows it.\n\nA new document.\n"

CASES: list[tuple[str, Setup, str]] = [
    ("empty input", lambda t, v: {"inputs": [_text(t, "empty.txt", b"\n\n   \n")]}, "no text in"),
    (
        "binary file",
        lambda t, v: {"inputs": [_text(t, "model.bin", b"PK\x03\x04\x00\x00abc")]},
        "model.bin: binary file (NUL byte at offset 4)",
    ),
    (
        "not UTF-8",
        lambda t, v: {"inputs": [_text(t, "latin1.txt", "caf\xe9 au lait".encode("latin-1"))]},
        "latin1.txt: not UTF-8 text (bad byte at offset 3)",
    ),
    (
        "broken gzip",
        lambda t, v: {"inputs": [_text(t, "x.txt.gz", gzip.compress(SENTENCES)[:-12])]},
        "x.txt.gz: cannot read",
    ),
    ("missing input", lambda t, v: {"inputs": [t / "nope.txt"]}, "nope.txt: no such file"),
    ("no input at all", lambda t, v: {}, "no input: give text files"),
    (
        "unknown builtin",
        lambda t, v: {"builtin": "wiki"},
        "--builtin: unknown built-in corpus 'wiki'",
    ),
    (
        "vocab lacks [CLS] and [MASK]",
        lambda t, v: {"builtin": "pydoc", "vocab": _vocab_without(t, v, "[CLS]", "[MASK]")},
        "bad_vocab.txt: vocabulary lacks [CLS], [MASK]",
    ),
    (
        "vocab is binary",
        lambda t, v: {"builtin": "pydoc", "vocab": _text(t, "v.bin", b"\x00\x01")},
        "v.bin: not a text vocabulary",
    ),
    (
        "seq_len below 16",
        lambda t, v: {"builtin": "pydoc", "seq_len": 8},
        "--seq-len: must be at least 16 (got 8)",
    ),
    (
        "max_pred 0",
        lambda t, v: {"builtin": "pydoc", "max_pred": 0},
        "--max-pred: must be between 1",
    ),
    (
        "max_pred above seq_len",
        lambda t, v: {"builtin": "pydoc", "seq_len": 32, "max_pred": 33},
        "--max-pred: must be between 1 and --seq-len (32); got 33",
    ),
    (
        "masked_lm_prob 0",
        lambda t, v: {"builtin": "pydoc", "masked_lm_prob": 0.0},
        "--masked-lm-prob",
    ),
    ("dupe_factor 0", lambda t, v: {"builtin": "pydoc", "dupe_factor": 0}, "--dupe-factor"),
    ("shards 0", lambda t, v: {"builtin": "pydoc", "shards": 0}, "--shards: must be at least 1"),
    ("workers 0", lambda t, v: {"builtin": "pydoc", "workers": 0}, "--workers: must be at least 1"),
    (
        "stall 0",
        lambda t, v: {"builtin": "pydoc", "stall_timeout": 0},
        "--stall-timeout: must be more than 0",
    ),
    ("tiny vocab", lambda t, v: {"builtin": "pydoc", "vocab_size": 10}, "--vocab-size"),
    (
        "only control characters",
        lambda t, v: {"inputs": [_text(t, "ctrl.txt", b"\x01\x02\n\n\x03\n")], "vocab": v},
        "the input gives no examples",
    ),
    (
        "more shards than examples",
        lambda t, v: {"inputs": [_text(t, "few.txt", SENTENCES)], "vocab": v, "shards": 500},
        "--shards: 500 shards but only",
    ),
]


@pytest.mark.parametrize(
    ("setup", "message"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_one_clear_error(
    tmp_path: Path, pydoc_vocab: Path, setup: Setup, message: str
) -> None:
    out = tmp_path / "out" / "set"
    with pytest.raises(DataError) as err:
        prepare(output=out, **{"workers": 1, **setup(tmp_path, pydoc_vocab)})
    assert message in str(err.value)
    assert "\n" not in str(err.value)
    assert not out.exists()  # nothing made, not even the folder


def test_vocab_and_vocab_size_together(tmp_path: Path, pydoc_vocab: Path) -> None:
    with pytest.raises(UserError, match="--vocab FILE or --vocab-size N, not both"):
        prepare(builtin="pydoc", output=tmp_path / "x", vocab=pydoc_vocab, vocab_size=5000)


SMALLSET = {"builtin": "pydoc", "seq_len": 32, "max_pred": 5, "dupe_factor": 1, "workers": 1}


def test_existing_dataset_is_refused_then_replaced(tmp_path: Path, pydoc_vocab: Path) -> None:
    out = tmp_path / "set"
    prepare(output=out, vocab=pydoc_vocab, shards=4, **SMALLSET)  # type: ignore[arg-type]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(
        DataError, match="holds a dataset already .4 shard.s. and dataset.json.; pass --overwrite"
    ):
        prepare(output=out, vocab=pydoc_vocab, shards=2, **SMALLSET)  # type: ignore[arg-type]
    # A failing --overwrite run leaves the old dataset as it was.
    with pytest.raises(DataError, match="--shards"):
        prepare(output=out, vocab=pydoc_vocab, shards=10**6, overwrite=True, **SMALLSET)  # type: ignore[arg-type]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    result = prepare(output=out, vocab=pydoc_vocab, shards=2, seed=1, overwrite=True, **SMALLSET)  # type: ignore[arg-type]
    assert sorted(p.name for p in out.iterdir()) == [
        "dataset.json",
        "set_training_0.hdf5",
        "set_training_1.hdf5",
        "vocab.txt",
    ]
    assert result.examples == sum(result.counts)
    assert verify(out) == []


def test_empty_or_unrelated_folder_is_fine(tmp_path: Path, pydoc_vocab: Path) -> None:
    out = tmp_path / "set"
    out.mkdir()
    (out / "README").write_text("notes")
    prepare(output=out, vocab=pydoc_vocab, shards=2, **SMALLSET)  # type: ignore[arg-type]
    assert (out / "README").read_text() == "notes"
    assert verify(out) == []
