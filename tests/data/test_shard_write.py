"""write_shard compresses chunks itself (ISA-L deflate, written with write_direct_chunk): any
HDF5 reader must get the arrays back through the standard shuffle + gzip filters, for any
number of rows (edge chunks, a single row)."""

from __future__ import annotations

import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest

from trainmaster.data import shards as fmt


def _arrays(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 30522, (n, 128)).astype(np.int64)
    ids[:, 100:] = 0
    return {
        "input_ids": ids,
        "input_mask": (ids != 0).astype(np.int8),
        "segment_ids": rng.integers(0, 2, (n, 128)).astype(np.int8),
        "masked_lm_positions": np.sort(rng.integers(1, 100, (n, 20)), axis=1),
        "masked_lm_ids": rng.integers(5, 30522, (n, 20)),
        "next_sentence_labels": rng.integers(0, 2, n).astype(np.int8),
    }


# 1025 rows of int32 input_ids are two full chunks of 1024 rows (512 KiB) and one partial.
@pytest.mark.parametrize("n", [1, 7, 1024, 1025, 3000])
def test_round_trip_through_the_standard_filters(tmp_path: Path, n: int) -> None:
    want = _arrays(n)
    path = tmp_path / "x.hdf5"
    fmt.write_shard(path, want)
    with h5py.File(path, "r") as f:
        for key in fmt.KEYS:
            ds = f[key]
            assert ds.dtype == np.dtype(fmt.DTYPES[key])
            assert ds.compression == "gzip" and ds.compression_opts == fmt.GZIP_LEVEL
            assert ds.shuffle
            np.testing.assert_array_equal(ds[:], want[key].astype(fmt.DTYPES[key]))
            if n:  # a partial read decompresses the right chunk
                np.testing.assert_array_equal(ds[n - 1], want[key][n - 1])


def test_stored_chunk_is_a_zlib_stream_of_the_shuffled_bytes(tmp_path: Path) -> None:
    """What NVIDIA's/any reader relies on: each stored chunk inflates with plain zlib to the
    byte-shuffled chunk (edge chunk zero-padded to full size)."""
    want = _arrays(5)
    path = tmp_path / "x.hdf5"
    fmt.write_shard(path, want)
    with h5py.File(path, "r") as f:
        ds = f["input_ids"]
        mask, raw = ds.id.read_direct_chunk((0, 0))
        rows = ds.chunks[0]
    assert mask == 0  # every declared filter was applied
    padded = np.zeros((rows, 128), np.int32)
    padded[:5] = want["input_ids"]
    shuffled = padded.view(np.uint8).reshape(-1, 4).T.tobytes()
    assert zlib.decompress(raw) == shuffled


def test_same_arrays_same_bytes(tmp_path: Path) -> None:
    want = _arrays(300, seed=3)
    fmt.write_shard(tmp_path / "a.hdf5", want)
    fmt.write_shard(tmp_path / "b.hdf5", want)
    assert (tmp_path / "a.hdf5").read_bytes() == (tmp_path / "b.hdf5").read_bytes()
