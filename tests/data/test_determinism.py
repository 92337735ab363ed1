"""The same input and seed give byte-identical files, whatever the number of workers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from trainmaster.data.prepare import prepare

FAST: dict[str, Any] = {
    "builtin": "pydoc",
    "seq_len": 64,
    "max_pred": 10,
    "dupe_factor": 2,
    "shards": 3,
}


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_same_seed_same_bytes_for_any_workers(tmp_path: Path, pydoc_vocab: Path) -> None:
    one = prepare(output=tmp_path / "a" / "set", vocab=pydoc_vocab, workers=1, **FAST)
    two = prepare(output=tmp_path / "b" / "set", vocab=pydoc_vocab, workers=2, **FAST)
    assert two.workers == 2
    a, b = _files(one.output), _files(two.output)
    assert sorted(a) == [
        "dataset.json",
        "set_training_0.hdf5",
        "set_training_1.hdf5",
        "set_training_2.hdf5",
        "vocab.txt",
    ]
    assert a == b


def test_other_seed_other_bytes(tmp_path: Path, pydoc_vocab: Path) -> None:
    base = prepare(output=tmp_path / "a" / "set", vocab=pydoc_vocab, workers=1, **FAST)
    other = prepare(output=tmp_path / "b" / "set", vocab=pydoc_vocab, workers=1, seed=7, **FAST)
    for p, q in zip(base.shards, other.shards, strict=True):
        assert p.read_bytes() != q.read_bytes()
    assert (base.output / "vocab.txt").read_bytes() == (other.output / "vocab.txt").read_bytes()


def test_whole_pipeline_with_training_is_reproducible(tmp_path: Path) -> None:
    """Vocabulary training included, across processes (hash seeds differ per process)."""
    code = (
        "import sys; from trainmaster.data.prepare import prepare; "
        "prepare(builtin='pydoc', output=sys.argv[1], seq_len=32, max_pred=5, dupe_factor=1, "
        "shards=2, workers=1, vocab_size=3000)"
    )
    for name in ("x", "y"):
        subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / name / "set")], check=True, timeout=120
        )
    assert _files(tmp_path / "x" / "set") == _files(tmp_path / "y" / "set")
