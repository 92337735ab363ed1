"""verify finds each kind of damage a test injects, names file and row, and nothing else."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.data.helpers import rewrite
from trainmaster.data.prepare import PrepareResult, prepare
from trainmaster.data.shards import KEYS, read_arrays
from trainmaster.data.verify import verify

Arrays = dict[str, np.ndarray]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, pydoc_vocab: Path) -> PrepareResult:
    out = tmp_path_factory.mktemp("verify") / "small"
    return prepare(
        builtin="pydoc",
        output=out,
        vocab=pydoc_vocab,
        seq_len=32,
        max_pred=6,
        dupe_factor=1,
        shards=2,
        workers=1,
    )


def _padded_row(a: Arrays) -> int:
    """A row with padding and at least two masked positions."""
    ok = (a["input_mask"].sum(1) < a["input_mask"].shape[1] - 1) & (
        (a["masked_lm_positions"] != 0).sum(1) >= 2
    )
    return int(np.flatnonzero(ok)[0])


def _edit(fn: Callable[[Arrays], None]) -> Callable[[Path], None]:
    """A corruption of shard 0's arrays, written back with h5py."""

    def apply(folder: Path) -> None:
        path = folder / "small_training_0.hdf5"
        a = read_arrays(path)
        fn(a)
        rewrite(path, dict(a))

    return apply


def _set(key: str, index: tuple[int, ...], value: int) -> Callable[[Arrays], None]:
    def fn(a: Arrays) -> None:
        a[key][index] = value

    return fn


def _first_sep_to_word(a: Arrays) -> None:
    row = a["input_ids"][9]
    row[np.flatnonzero(row == 3)[0]] = 10  # [SEP] is id 3 in a trained vocabulary


def _swap_positions(a: Arrays) -> None:
    for key in ("masked_lm_positions", "masked_lm_ids"):
        a[key][15, [0, 1]] = a[key][15, [1, 0]]


def _beyond(a: Arrays) -> None:
    r = _padded_row(a)
    last = int((a["masked_lm_positions"][r] != 0).sum()) - 1
    a["masked_lm_positions"][r, last] = a["input_ids"].shape[1] - 1


def _padding(a: Arrays) -> None:
    a["input_ids"][_padded_row(a), -1] = 5


def _float(a: Arrays) -> None:
    a["input_ids"] = a["input_ids"].astype(np.float32)


def _truncate(folder: Path) -> None:
    path = folder / "small_training_0.hdf5"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _drop_key(folder: Path) -> None:
    rewrite(folder / "small_training_0.hdf5", {"segment_ids": None})


def _drop_shard(folder: Path) -> None:
    (folder / "small_training_1.hdf5").unlink()


def _stray(folder: Path) -> None:
    (folder / ".small_training_0.hdf5.tmp").write_bytes(b"partial")


CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("float dtype", _edit(_float), "small_training_0.hdf5: 'input_ids' has dtype float32"),
    (
        "id >= vocab",
        _edit(_set("input_ids", (5, 1), 10**6)),
        "small_training_0.hdf5 row 5: input_ids holds id 1000000 outside [0, ",
    ),
    (
        "missing [CLS]",
        _edit(_set("input_ids", (7, 0), 10)),
        "small_training_0.hdf5 row 7: input_ids[0] is 10, not [CLS] (2)",
    ),
    ("[SEP] misplaced", _edit(_first_sep_to_word), "small_training_0.hdf5 row 9: [SEP] misplaced"),
    (
        "mask not contiguous",
        _edit(_set("input_mask", (11, 1), 0)),
        "small_training_0.hdf5 row 11: input_mask is not 1s followed by 0s",
    ),
    (
        "segment ids wrong",
        _edit(_set("segment_ids", (13, 1), 1)),
        "small_training_0.hdf5 row 13: segment_ids wrong at position 1",
    ),
    (
        "positions unsorted",
        _edit(_swap_positions),
        "small_training_0.hdf5 row 15: masked_lm_positions not sorted",
    ),
    ("position beyond length", _edit(_beyond), "masked_lm_positions: position 31 is beyond the"),
    ("nonzero padding", _edit(_padding), "padding slot 31 holds a nonzero id"),
    (
        "masked id 0 where used",
        _edit(_set("masked_lm_ids", (4, 0), 0)),
        "small_training_0.hdf5 row 4: masked_lm_ids is 0 for a used position",
    ),
    (
        "NSP label 2",
        _edit(_set("next_sentence_labels", (3,), 2)),
        "small_training_0.hdf5 row 3: next_sentence_labels is 2, must be 0 or 1",
    ),
    ("truncated file", _truncate, "small_training_0.hdf5: cannot "),
    ("missing key", _drop_key, "small_training_0.hdf5: missing dataset 'segment_ids'"),
    ("shard count", _drop_shard, "dataset.json: lists 2 shards, the folder has 1"),
    ("stray temporary", _stray, ".small_training_0.hdf5.tmp: stray temporary file"),
]


@pytest.mark.parametrize(
    ("damage", "expected"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES]
)
def test_verify_reports_the_damage(
    small: PrepareResult, tmp_path: Path, damage: Callable[[Path], None], expected: str
) -> None:
    folder = tmp_path / "small"
    shutil.copytree(small.output, folder)
    assert verify(folder) == []
    damage(folder)
    found = [str(v) for v in verify(folder)]
    assert any(line.startswith(expected) or expected in line for line in found), found
    row_level = " row " in expected
    if row_level:  # one problem, reported once, not also as its consequences
        assert len(found) == 1, found


def test_all_rows_are_reported(small: PrepareResult, tmp_path: Path) -> None:
    folder = tmp_path / "small"
    shutil.copytree(small.output, folder)
    path = folder / "small_training_1.hdf5"
    a = read_arrays(path)
    a["next_sentence_labels"][:] = 7
    rewrite(path, a)
    found = verify(folder)
    assert len(found) == len(a["next_sentence_labels"]) == small.counts[1]
    assert [v.row for v in found] == list(range(small.counts[1]))
    assert {v.kind for v in found} == {"nsp"}


def test_keys_are_the_format(small: PrepareResult) -> None:
    assert sorted(read_arrays(small.shards[0])) == sorted(KEYS)


def test_folder_without_shards(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    assert [str(v) for v in verify(tmp_path)] == [
        "(folder): no shards (files matching *_training_*.hdf5)"
    ]
