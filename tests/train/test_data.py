"""Shards in the trainer: NVIDIA's and the tutorial's dtypes, labels, order, resumable batches."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from trainmaster.errors import ConfigError, DataError
from trainmaster.train import dataset
from trainmaster.train.data import ShardLoader
from trainmaster.train.dataset import IGNORE, Position

NVIDIA = {
    "input_ids": np.int32,
    "input_mask": np.int8,
    "segment_ids": np.int8,
    "masked_lm_positions": np.int32,
    "masked_lm_ids": np.int32,
    "next_sentence_labels": np.int8,
}
TUTORIAL = dict.fromkeys(NVIDIA, np.int64)  # the AWS tutorial's shards: int64 everywhere


def rows(n: int, seq: int = 16, pred: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    positions = np.zeros((n, pred), dtype=np.int64)
    ids = np.zeros((n, pred), dtype=np.int64)
    for i in range(n):
        k = 1 + i % pred
        positions[i, :k] = np.sort(rng.choice(np.arange(1, seq - 1), size=k, replace=False))
        ids[i, :k] = rng.integers(5, 100, size=k)
    return {
        "input_ids": rng.integers(5, 100, size=(n, seq)),
        "input_mask": np.ones((n, seq), dtype=np.int64),
        "segment_ids": np.repeat([[0] * (seq // 2) + [1] * (seq - seq // 2)], n, axis=0),
        "masked_lm_positions": positions,
        "masked_lm_ids": ids,
        "next_sentence_labels": rng.integers(0, 2, size=n),
    }


def write(path: Path, arrays: dict[str, np.ndarray], dtypes: dict[str, type]) -> Path:
    with h5py.File(path, "w") as f:
        for key, value in arrays.items():
            f.create_dataset(key, data=value.astype(dtypes[key]), compression="gzip")
    return path


@pytest.mark.parametrize("dtypes", [NVIDIA, TUTORIAL], ids=["nvidia-int32-int8", "int64"])
def test_any_integer_dtype_reads_the_same(tmp_path: Path, dtypes: dict) -> None:
    arrays = rows(10)
    path = write(tmp_path / "x_training_0.hdf5", arrays, dtypes)
    assert dataset.check_header(path, 16, 4) == 10
    got = dataset.load_shard(path, 100)
    assert all(v.dtype == np.int64 for v in got.values())
    np.testing.assert_array_equal(got["input_ids"], arrays["input_ids"])
    np.testing.assert_array_equal(got["token_type_ids"], arrays["segment_ids"])
    np.testing.assert_array_equal(got["nsp_labels"], arrays["next_sentence_labels"])
    valid = arrays["masked_lm_positions"] != 0
    np.testing.assert_array_equal(
        got["mlm_labels"], np.where(valid, arrays["masked_lm_ids"], IGNORE)
    )


def test_slots_count_up_to_the_first_zero_position(tmp_path: Path) -> None:
    """As NVIDIA's loader: a slot after the first 0 in masked_lm_positions is not a prediction."""
    arrays = rows(2)
    arrays["masked_lm_positions"][0] = [3, 0, 7, 0]
    arrays["masked_lm_ids"][0] = [11, 0, 12, 0]
    got = dataset.load_shard(write(tmp_path / "x_training_0.hdf5", arrays, NVIDIA), 100)
    assert got["mlm_labels"][0].tolist() == [11, IGNORE, IGNORE, IGNORE]
    assert got["mlm_positions"][0].tolist() == [3, 0, 0, 0]
    full = dataset.full_labels(got["mlm_positions"], got["mlm_labels"], 16)
    assert full[0, 3] == 11 and (full[0] != IGNORE).sum() == 1


def test_bad_shards_are_named(tmp_path: Path) -> None:
    arrays = rows(8)
    arrays["input_ids"][5, 2] = 100
    path = write(tmp_path / "x_training_0.hdf5", arrays, NVIDIA)
    with pytest.raises(
        DataError, match=r"x_training_0\.hdf5.*token id 100 \(row 5\).*vocabulary of 100"
    ):
        dataset.load_shard(path, 100)
    with pytest.raises(ConfigError, match=r"data\.seq_len: 32.*sequences of 16 tokens"):
        dataset.check_header(path, 32, 4)
    with pytest.raises(ConfigError, match=r"data\.max_pred: 20.*4 prediction slots"):
        dataset.check_header(path, 16, 20)
    truncated = tmp_path / "y_training_0.hdf5"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(DataError, match=r"y_training_0\.hdf5.*truncated or corrupt"):
        dataset.check_header(truncated, 16, 4)
    with h5py.File(tmp_path / "z_training_0.hdf5", "w") as f:
        f.create_dataset("input_ids", data=arrays["input_ids"])
    with pytest.raises(DataError, match="lacks input_mask"):
        dataset.check_header(tmp_path / "z_training_0.hdf5", 16, 4)


def test_every_shard_once_per_epoch_and_ranks_never_share() -> None:
    files = [Path(f"s_training_{k}.hdf5") for k in range(6)]
    for epoch in range(3):
        seen = [
            dataset.file_for(files, seed=1, epoch=epoch, rnd=r, rank=k, world=3)
            for r in range(dataset.rounds_per_epoch(6, 3))
            for k in range(3)
        ]
        assert sorted(seen) == sorted(files)
    orders = [[dataset.file_for(files, seed=1, epoch=e, rnd=0, rank=0, world=3)] for e in range(4)]
    assert len({str(o) for o in orders}) > 1  # reshuffled every epoch


def loader_for(files: list[Path], start: Position, batch: int = 4) -> ShardLoader:
    return ShardLoader(
        files, rank=1, world=2, batch_size=batch, seed=7, vocab_size=100, start=start
    )


def test_a_loader_started_at_a_saved_position_continues_exactly(tmp_path: Path) -> None:
    files = [
        write(tmp_path / f"d_training_{k}.hdf5", rows(10 + k, seed=k), NVIDIA) for k in range(4)
    ]
    straight = loader_for(files, Position())
    it = iter(straight)
    batches, positions = [], []
    for _ in range(12):  # crosses shard boundaries (10-13 rows: 2-3 batches of 4 per shard)
        batches.append(next(it))
        straight.consumed()
        positions.append(straight.position)
    assert len({(p.epoch, p.round) for p in positions}) >= 4  # two epochs' worth of rounds
    for k in (1, 3, 7):
        resumed = loader_for(files, positions[k - 1])
        again = iter(resumed)
        for expected in batches[k:]:
            got = next(again)
            assert all(torch.equal(got[key], expected[key]) for key in expected)
        resumed.close()
    straight.close()


def test_batches_are_the_same_samples_whatever_the_micro_batch(tmp_path: Path) -> None:
    files = [write(tmp_path / f"d_training_{k}.hdf5", rows(16, seed=k), NVIDIA) for k in range(2)]
    small, big = iter(loader_for(files, Position(), 4)), iter(loader_for(files, Position(), 8))
    for _ in range(3):
        pair = [next(small), next(small)]
        whole = next(big)
        assert torch.equal(torch.cat([b["input_ids"] for b in pair]), whole["input_ids"])
