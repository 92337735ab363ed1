"""Shards as NVIDIA's pipeline and the AWS tutorial leave them: no dataset.json, no vocab.txt,
Google's token ids; int32/int8 (NVIDIA) or int64 everywhere (the tutorial's copies)."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.data.helpers import nvidia_vocab, rewrite
from trainmaster.data.prepare import PrepareResult, prepare
from trainmaster.data.shards import KEYS, list_shards, read_arrays
from trainmaster.data.stats import inspect
from trainmaster.data.verify import verify


@pytest.fixture(scope="module")
def nvidia(tmp_path_factory: pytest.TempPathFactory, pydoc_vocab: Path) -> PrepareResult:
    """Our shards made with a Google-layout vocabulary, stripped to what NVIDIA ships."""
    tmp = tmp_path_factory.mktemp("nvidia")
    vocab = nvidia_vocab(pydoc_vocab, tmp / "vocab.txt")
    result = prepare(
        builtin="pydoc",
        output=tmp / "books_wiki_en_corpus",
        vocab=vocab,
        seq_len=128,
        max_pred=20,
        dupe_factor=2,
        shards=2,
        workers=1,
    )
    (result.output / "vocab.txt").unlink()
    (result.output / "dataset.json").unlink()
    return result


def _check(folder: Path, dtype: type) -> None:
    with h5py.File(list_shards(folder)[0]) as f:
        assert f["input_ids"].dtype == np.dtype(dtype)
        assert int(f["input_ids"][0, 0]) == 101  # [CLS] of bert-*-uncased
    assert verify(folder) == []
    st = inspect(folder, examples=1)
    assert st.vocab == "bert-uncased defaults"
    assert abs(st.mask_ratio - 0.15) < 0.005
    assert 0.75 < st.masked_as_mask < 0.85  # [MASK] recognised as id 103
    text = st.samples[0].text
    assert text.startswith("[CLS] ") and text.endswith(" [SEP]") and text.count("[SEP]") == 2


def test_nvidia_dtypes_verify_and_inspect(nvidia: PrepareResult) -> None:
    _check(nvidia.output, np.int32)


def test_int64_shards_verify_and_inspect(nvidia: PrepareResult, tmp_path: Path) -> None:
    folder = shutil.copytree(nvidia.output, tmp_path / "aws")
    for path in list_shards(folder):
        rewrite(
            path, {k: v.astype(np.int64) for k, v in read_arrays(path).items()}, compression=None
        )
    _check(folder, np.int64)


def test_our_ids_are_wrong_for_google_defaults(
    pydoc_dataset: PrepareResult, tmp_path: Path
) -> None:
    """Without vocab.txt, verify assumes Google's ids: our [CLS]=2 rows are then flagged."""
    folder = shutil.copytree(pydoc_dataset.output, tmp_path / "bare")
    (folder / "vocab.txt").unlink()
    found = verify(folder)
    assert found and all(v.kind in {"cls", "sep"} for v in found)
    assert sorted(read_arrays(list_shards(folder)[0])) == sorted(KEYS)
