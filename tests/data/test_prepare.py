"""`prepare` on the built-in corpus: the shards verify, read back as BERT examples, and have
the masking and next-sentence statistics of the reference algorithm."""

from __future__ import annotations

import hashlib
import json
import math

import h5py
import numpy as np

from tests.data.helpers import SMALL
from trainmaster.data.prepare import PrepareResult
from trainmaster.data.shards import DTYPES, KEYS, list_shards, read_arrays
from trainmaster.data.stats import inspect
from trainmaster.data.verify import verify


def _all(result: PrepareResult) -> dict[str, np.ndarray]:
    parts = [read_arrays(p) for p in result.shards]
    return {k: np.concatenate([p[k] for p in parts]).astype(np.int64) for k in KEYS}


def test_builtin_corpus_verifies(pydoc_dataset: PrepareResult) -> None:
    assert verify(pydoc_dataset.output) == []
    names = [p.name for p in list_shards(pydoc_dataset.output)]
    assert names == [f"pydoc_training_{k}.hdf5" for k in range(SMALL["shards"])]
    assert pydoc_dataset.input_tokens > 90_000  # the reference docs are ~100k tokens


def test_format_dtypes_and_balanced_sizes(pydoc_dataset: PrepareResult) -> None:
    with h5py.File(pydoc_dataset.shards[0]) as f:
        assert sorted(f.keys()) == sorted(KEYS)
        for key, dtype in DTYPES.items():
            assert f[key].dtype == np.dtype(dtype), key
            assert f[key].compression == "gzip"
        assert f["input_ids"].shape[1] == SMALL["seq_len"]
        assert f["masked_lm_positions"].shape[1] == SMALL["max_pred"]
    assert max(pydoc_dataset.counts) - min(pydoc_dataset.counts) <= 1


def test_manifest_describes_the_dataset(pydoc_dataset: PrepareResult) -> None:
    out = pydoc_dataset.output
    manifest = json.loads((out / "dataset.json").read_text())
    assert manifest["examples"] == pydoc_dataset.examples == sum(pydoc_dataset.counts)
    assert [s["file"] for s in manifest["shards"]] == [p.name for p in pydoc_dataset.shards]
    assert [s["examples"] for s in manifest["shards"]] == pydoc_dataset.counts
    assert manifest["vocab_sha256"] == hashlib.sha256((out / "vocab.txt").read_bytes()).hexdigest()
    assert manifest["vocab_size"] == len((out / "vocab.txt").read_text().splitlines())
    assert manifest["sources"][0]["name"] == "builtin:pydoc" and manifest["sources"][0]["bytes"] > 0
    for key in ("seq_len", "max_pred", "dupe_factor"):
        assert manifest[key] == SMALL[key]
    assert manifest["seed"] == 12345 and manifest["lower_case"] is True
    assert not any("date" in k or "time" in k for k in manifest)  # byte-identical reruns


def test_decoded_examples_are_cls_a_sep_b_sep(pydoc_dataset: PrepareResult) -> None:
    st = inspect(pydoc_dataset.output, examples=5)
    assert len(st.samples) == 5
    for ex in st.samples:
        for text in (ex.text, ex.original):
            words = text.split(" ")
            assert words[0] == "[CLS]" and words[-1] == "[SEP]"
            assert words.count("[SEP]") == 2
            sep = words.index("[SEP]")
            assert 1 < sep < len(words) - 2  # A and B are not empty
        assert "[MASK]" not in ex.original
        assert ex.text != ex.original  # something is masked


def test_every_row_masks_num_to_predict(pydoc_dataset: PrepareResult) -> None:
    """num_to_predict = min(max_pred, max(1, round(len * 0.15))), exactly, in every row."""
    a = _all(pydoc_dataset)
    length = a["input_mask"].sum(1)
    want = np.minimum(SMALL["max_pred"], np.maximum(1, np.rint(length * 0.15)))
    assert np.array_equal((a["masked_lm_positions"] != 0).sum(1), want)
    st = inspect(pydoc_dataset.output)
    assert abs(st.mask_ratio - 0.15) < 0.005  # rounding per row moves it a little
    assert st.real_tokens == int(length.sum())


def test_80_10_10_split(pydoc_dataset: PrepareResult) -> None:
    st = inspect(pydoc_dataset.output)
    n = st.masked
    for measured, p in (
        (st.masked_as_mask, 0.8),
        (st.masked_as_random, 0.1),
        (st.masked_as_kept, 0.1),
    ):
        tolerance = 5 * math.sqrt(p * (1 - p) / n)  # 5 sigma of a binomial proportion
        assert abs(measured - p) < tolerance, (measured, p, n)


def test_next_sentence_balance(pydoc_dataset: PrepareResult) -> None:
    """Half random, plus the chunks of one sentence, which are always random (as Google's):
    on this corpus of headings and short paragraphs that adds a few percent."""
    st = inspect(pydoc_dataset.output)
    sigma = math.sqrt(0.25 / st.examples)
    assert 0.5 - 5 * sigma < st.next_sentence_random < 0.6


def test_masked_ids_are_the_original_tokens(pydoc_dataset: PrepareResult) -> None:
    """Where the input still shows the token (10% kept), it equals masked_lm_ids; [MASK]
    never appears anywhere but at a masked position."""
    a = _all(pydoc_dataset)
    mask_id = 4  # trained vocabularies start [PAD] [UNK] [CLS] [SEP] [MASK]
    used = a["masked_lm_positions"] != 0
    shown = np.take_along_axis(a["input_ids"], a["masked_lm_positions"], 1)
    assert (shown[used] == mask_id).mean() > 0.7
    outside = a["input_ids"].copy()
    np.put_along_axis(outside, a["masked_lm_positions"], 0, 1)
    assert not (outside == mask_id).any()


def test_short_sequences_appear(pydoc_dataset: PrepareResult) -> None:
    """~10% of examples target a random shorter length; long rows dominate the rest."""
    length = _all(pydoc_dataset)["input_mask"].sum(1)
    assert (length == SMALL["seq_len"]).mean() > 0.5
    assert 0.03 < (length < SMALL["seq_len"] // 2).mean() < 0.3
