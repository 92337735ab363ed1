"""`data prepare` never loses a dataset and never shows a loader a partial shard.

- A failure at any rename/link/replace of a run (ENOSPC injected at the k-th call, for every k
  until the run gets through) leaves the folder with the complete old dataset or the complete
  new one, with and without an atomic folder exchange.
- A run killed (SIGKILL, no cleanup) while writing or committing leaves no file whose name
  contains `training` (what NVIDIA's loader picks; the tutorial's glob is narrower) other than
  complete shards, and the next run tidies up after it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import pytest

from trainmaster.data import output
from trainmaster.data.prepare import prepare
from trainmaster.data.verify import verify
from trainmaster.errors import DataError

SMALLSET: dict[str, Any] = {
    "builtin": "pydoc",
    "seq_len": 32,
    "max_pred": 5,
    "dupe_factor": 1,
    "workers": 1,
}
FINAL_SHARD = re.compile(r"^[^.].*_training_\d+\.hdf5$")


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.is_dir() else {}


def restore(folder: Path, files: dict[str, bytes]) -> None:
    if snapshot(folder) != files:
        for p in folder.iterdir():
            p.unlink()
        for name, data in files.items():
            (folder / name).write_bytes(data)


def is_complete_new(folder: Path, shards: int, seed: int) -> bool:
    if not (folder / "dataset.json").is_file():
        return False
    manifest = json.loads((folder / "dataset.json").read_text())
    return verify(folder) == [] and manifest["seed"] == seed and len(manifest["shards"]) == shards


class Injector:
    """Counts os.replace / os.rename / os.link / output.exchange calls; the k-th raises ENOSPC."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_at: int, exchange_works: bool) -> None:
        self.calls = 0
        self.fail_at = fail_at
        for name in ("replace", "rename", "link"):
            monkeypatch.setattr(os, name, self.wrap(getattr(os, name)))
        real_exchange = getattr(output, "exchange", None)

        def no_exchange(a: Path, b: Path) -> None:
            raise OSError(errno.EINVAL, "RENAME_EXCHANGE not supported here")

        monkeypatch.setattr(
            output,
            "exchange",
            self.wrap(real_exchange if exchange_works else no_exchange),
            raising=False,
        )

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.fail_at:
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
            return fn(*args, **kwargs)

        return call


@pytest.mark.parametrize("exchange_works", [True, False], ids=["exchange", "two-renames"])
def test_a_failure_at_any_step_keeps_old_or_new(
    tmp_path: Path, pydoc_vocab: Path, monkeypatch: pytest.MonkeyPatch, exchange_works: bool
) -> None:
    out = tmp_path / "datasets" / "set"
    prepare(output=out, vocab=pydoc_vocab, shards=4, **SMALLSET)
    (out / "README").write_text("the user's notes")
    old = snapshot(out)
    failures = 0
    for k in range(1, 100):
        restore(out, old)  # every attempt replaces the same old dataset
        with monkeypatch.context() as m:
            injector = Injector(m, k, exchange_works)
            try:
                prepare(output=out, vocab=pydoc_vocab, shards=2, seed=1, overwrite=True, **SMALLSET)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                failures += 1
            else:
                assert is_complete_new(out, 2, 1)  # e.g. a failed hard link became a copy
                if injector.calls < k:
                    break  # nothing left to inject into: every step has failed once
        # Complete old or complete new, the user's file in either, and nothing else beside it.
        assert snapshot(out) == old or is_complete_new(out, 2, 1), f"failure at call {k}"
        assert (out / "README").read_text() == "the user's notes"
        assert sorted(p.name for p in out.parent.iterdir()) == ["set"], f"failure at call {k}"
    # 2 shard names, vocab, manifest, the swap (1 exchange or 2 renames); a failed hard link of
    # the README is absorbed (copied instead).
    assert failures == (5 if exchange_works else 7)
    assert is_complete_new(out, 2, 1)
    assert sorted(p.name for p in out.iterdir()) == [
        "README",
        "dataset.json",
        "set_training_0.hdf5",
        "set_training_1.hdf5",
        "vocab.txt",
    ]


def test_vocab_write_failing_keeps_the_old_dataset(
    tmp_path: Path, pydoc_vocab: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reported case: ENOSPC while writing vocab.txt left the folder empty."""
    out = tmp_path / "set"
    prepare(output=out, vocab=pydoc_vocab, shards=2, **SMALLSET)
    old = snapshot(out)

    def full(self: Any, path: Path) -> None:
        path.write_bytes(b"[PAD]\n")  # a part of it, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    monkeypatch.setattr("trainmaster.data.vocab.Vocab.write", full)
    with pytest.raises(OSError, match="No space left"):
        prepare(output=out, vocab=pydoc_vocab, shards=3, seed=7, overwrite=True, **SMALLSET)
    assert snapshot(out) == old and verify(out) == []


def test_killed_between_the_two_renames_is_repaired(tmp_path: Path, pydoc_vocab: Path) -> None:
    """Where there is no atomic exchange, a kill between `folder -> .old` and `new -> folder`
    leaves no folder: the next run puts the old dataset back before deciding anything."""
    out = tmp_path / "set"
    prepare(output=out, vocab=pydoc_vocab, shards=2, **SMALLSET)
    old = snapshot(out)
    os.rename(out, tmp_path / f".set.old-{output.HOST}-999999999")
    with pytest.raises(DataError, match="holds a dataset already"):
        prepare(output=out, vocab=pydoc_vocab, shards=2, **SMALLSET)
    assert snapshot(out) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]


KILLER = """
import os, signal, sys
from trainmaster.data import shards
from trainmaster.data.prepare import prepare

real_write, real_replace, point = shards.write_blocks, os.replace, sys.argv[3]
count = {"write": 0, "replace": 0}

def write(*args, **kw):
    real_write(*args, **kw)
    count["write"] += 1
    if point == "writing" and count["write"] == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # shard 0 done, 1 and 2 to come: no cleanup

def replace(src, dst):
    real_replace(src, dst)
    count["replace"] += "training" in str(dst)  # a shard's final name (not vocab, manifest)
    if point == "committing" and count["replace"] == 2:
        os.kill(os.getpid(), signal.SIGKILL)  # two shards have their final names

shards.write_blocks, os.replace = write, replace
prepare(builtin="pydoc", output=sys.argv[1], vocab=sys.argv[2], shards=3, seq_len=32,
        max_pred=5, dupe_factor=1, workers=1, overwrite=True)
"""


def training_files(root: Path) -> list[Path]:
    return [Path(d) / f for d, _, files in os.walk(root) for f in files if "training" in f]


def nvidia_loader_picks(folder: Path) -> list[str]:
    """NVIDIA DeepLearningExamples BERT run_pretraining.py: every file of the input folder
    whose name contains `training` (the widest of the loaders' patterns)."""
    if not folder.is_dir():
        return []
    return sorted(f for f in os.listdir(folder) if os.path.isfile(folder / f) and "training" in f)


@pytest.mark.parametrize("point", ["writing", "committing"])
@pytest.mark.parametrize("existing", [False, True], ids=["new", "overwrite"])
def test_killed_run_shows_loaders_no_partial_shard(
    tmp_path: Path, pydoc_vocab: Path, point: str, existing: bool
) -> None:
    out = tmp_path / "datasets" / "set"
    if existing:
        prepare(output=out, vocab=pydoc_vocab, shards=2, **SMALLSET)
    old = snapshot(out)
    proc = subprocess.run(
        [sys.executable, "-c", KILLER, str(out), str(pydoc_vocab), point],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr
    assert snapshot(out) == old  # the old dataset (or none) as it was
    assert nvidia_loader_picks(out) == (
        ["set_training_0.hdf5", "set_training_1.hdf5"] if existing else []
    )
    for path in training_files(tmp_path):  # the output folder and everything beside it
        assert FINAL_SHARD.match(path.name), f"{path}: a loader would take this partial file"
        with h5py.File(path, "r") as f:  # complete: it opens, with every array
            assert len(f["input_ids"]) > 0
    # The next run removes what the killed one left (its process is gone) and goes through.
    prepare(output=out, vocab=pydoc_vocab, shards=3, overwrite=True, **SMALLSET)
    assert verify(out) == [] and sorted(p.name for p in out.parent.iterdir()) == ["set"]
