"""`data verify`: every rule of the shard format, checked on every row, all violations listed.

Works on our shards and on NVIDIA's (no dataset.json, Google's vocab ids, int32/int8) and the
AWS tutorial's (int64 everywhere). Rows are read in blocks, so a shard of any size fits in
memory; checks are whole-block numpy expressions, with one Violation per bad row and rule.
A row that breaks a basic rule (its mask, its [SEP]s) is not also blamed for what follows
from it (its segment ids), so each problem is reported once, where it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from trainmaster.data import shards as fmt
from trainmaster.data.rows import BLOCK_ROWS, Expect, check_block, expectations
from trainmaster.errors import DataError

# What h5py raises for a damaged file, depending on which bytes are missing.
_DAMAGE = (OSError, KeyError, RuntimeError, ValueError)


@dataclass(frozen=True)
class Violation:
    file: str  # a file name in the folder; "" for the folder itself
    row: int | None
    kind: str  # a short name of the rule, to group and cap what is printed
    message: str

    def __str__(self) -> str:
        where = self.file or "(folder)"
        return (
            f"{where} row {self.row}: {self.message}"
            if self.row is not None
            else f"{where}: {self.message}"
        )


def verify(folder: str | Path) -> list[Violation]:
    """All violations in a folder of shards; [] means it is fine."""
    root = Path(folder)
    if not root.is_dir():
        raise DataError("not a folder of shards; give the dataset's folder", where=str(root))
    out: list[Violation] = []
    manifest: dict[str, Any] | None = None
    try:
        manifest = fmt.read_manifest(root)
    except (ValueError, UnicodeDecodeError) as exc:
        out.append(Violation(fmt.MANIFEST, None, "manifest", f"unreadable ({exc})"))
    expect, problem = expectations(root, manifest)
    if problem:
        out.append(Violation(fmt.VOCAB, None, "vocab", problem))
    files = fmt.list_shards(root)
    if not files:
        out.append(Violation("", None, "no-shards", "no shards (files matching *_training_*.hdf5)"))
    for tmp in fmt.stray_temps(root):
        out.append(
            Violation(
                tmp.name,
                None,
                "temp-file",
                "stray temporary file (left by an interrupted write); delete it",
            )
        )
    sizes: dict[str, int] = {}
    for path in files:
        n = _verify_shard(path, expect, out)
        if n is not None:
            sizes[path.name] = n
    if manifest is not None:
        _against_manifest(manifest, files, sizes, out)
    return out


def _verify_shard(path: Path, expect: Expect, out: list[Violation]) -> int | None:
    """Checks one shard; returns its number of rows when its layout could be read."""
    name = path.name
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        out.append(
            Violation(
                name,
                None,
                "unreadable",
                f"cannot open as HDF5 ({exc}); the file is damaged or truncated: make it again",
            )
        )
        return None
    with f:
        try:
            shapes = _layout(f, name, out)
        except _DAMAGE as exc:
            out.append(
                Violation(
                    name,
                    None,
                    "unreadable",
                    f"cannot read its layout ({exc}); the "
                    "file is damaged or truncated: make it again",
                )
            )
            return None
        if shapes is None:
            return None
        n = shapes["input_ids"][0]
        for start in range(0, n, BLOCK_ROWS):
            sel = slice(start, min(n, start + BLOCK_ROWS))
            try:
                block = {k: np.asarray(f[k][sel]).astype(np.int64) for k in fmt.KEYS}
            except _DAMAGE as exc:
                out.append(
                    Violation(
                        name,
                        None,
                        "unreadable",
                        f"cannot read rows {sel.start}-"
                        f"{sel.stop - 1} ({exc}); the file is damaged or truncated",
                    )
                )
                return n
            for row, kind, message in check_block(block, expect):
                out.append(Violation(name, start + row, kind, message))
        return n


def _layout(f: h5py.File, name: str, out: list[Violation]) -> dict[str, tuple[int, ...]] | None:
    """Keys, dtypes and shapes; None when rows cannot be checked."""
    before = len(out)
    for key in fmt.KEYS:
        if key not in f or not isinstance(f[key], h5py.Dataset):
            out.append(Violation(name, None, "missing-key", f"missing dataset '{key}'"))
        elif f[key].dtype.kind not in "iu":
            out.append(
                Violation(
                    name,
                    None,
                    "dtype",
                    f"'{key}' has dtype {f[key].dtype}; ids, masks and labels must be integers",
                )
            )
    if len(out) > before:
        return None
    shapes = {k: tuple(f[k].shape) for k in fmt.KEYS}
    n = shapes["input_ids"][0] if len(shapes["input_ids"]) == 2 else -1
    want = {
        "input_ids": 2,
        "input_mask": 2,
        "segment_ids": 2,
        "masked_lm_positions": 2,
        "masked_lm_ids": 2,
        "next_sentence_labels": 1,
    }
    for key, dims in want.items():
        if len(shapes[key]) != dims or shapes[key][0] != n:
            out.append(
                Violation(
                    name,
                    None,
                    "shape",
                    f"'{key}' has shape {shapes[key]}; expected "
                    f"{dims} dimension(s) and {n} rows like input_ids",
                )
            )
    for a, b in (
        ("input_mask", "input_ids"),
        ("segment_ids", "input_ids"),
        ("masked_lm_ids", "masked_lm_positions"),
    ):
        if shapes[a] != shapes[b] and len(out) == before:
            out.append(
                Violation(
                    name,
                    None,
                    "shape",
                    f"'{a}' has shape {shapes[a]}, '{b}' has {shapes[b]}; they must match",
                )
            )
    return shapes if len(out) == before else None


def _against_manifest(
    manifest: dict[str, Any], files: list[Path], sizes: dict[str, int], out: list[Violation]
) -> None:
    listed = manifest.get("shards")
    if not isinstance(listed, list):
        out.append(Violation(fmt.MANIFEST, None, "manifest", "has no 'shards' list"))
        return
    names = [str(s.get("file")) for s in listed if isinstance(s, dict)]
    if len(listed) != len(files):
        out.append(
            Violation(
                fmt.MANIFEST,
                None,
                "shard-count",
                f"lists {len(listed)} shards, the folder has {len(files)}",
            )
        )
    present = {p.name for p in files}
    for entry in listed:
        if not isinstance(entry, dict):
            continue
        file, count = str(entry.get("file")), entry.get("examples")
        if file not in present:
            out.append(
                Violation(
                    fmt.MANIFEST, None, "shard-missing", f"lists {file}, which is not in the folder"
                )
            )
        elif file in sizes and sizes[file] != count:
            out.append(
                Violation(
                    file,
                    None,
                    "shard-size",
                    f"has {sizes[file]} examples, dataset.json says {count}",
                )
            )
    for extra in sorted(present - set(names)):
        out.append(Violation(extra, None, "shard-extra", "is not listed in dataset.json"))
