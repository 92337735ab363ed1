"""trainmaster/files.py: a reader sees the old file or the new one; a failure leaves the old one
and no temporary; and no other module hand-writes an atomic file again."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trainmaster import files

SRC = Path(files.__file__).parent
# Modules that rename by hand, and why it is not a small file's atomic write.
RENAMES = {
    "files.py": "the one atomic write",
    "run/checkpoints.py": "checkpoint folders: .tmp-step_N -> step_N",
    "data/output.py": "shards written in place under their temporary names, dataset folders",
    "run/export.py": "an exported checkpoint folder",
    "compile/lock.py": "a stale lock moved aside (its grave), not written",
}


def test_the_new_content_replaces_the_old_and_no_temporary_is_left(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("old")
    files.write_json(path, {"phase": "running"})
    assert json.loads(path.read_text()) == {"phase": "running"}
    assert path.read_text().endswith("}\n")
    files.write_atomic(path, b"\x00bytes")
    assert path.read_bytes() == b"\x00bytes"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_a_failure_while_writing_keeps_the_old_file_and_removes_the_temporary(
    tmp_path: Path,
) -> None:
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\n")
    with pytest.raises(RuntimeError, match="disk full"), files.replacing(path) as tmp:
        tmp.write_text("[PAD]\n[UN")
        raise RuntimeError("disk full")
    assert path.read_text() == "[PAD]\n"
    assert [p.name for p in tmp_path.iterdir()] == ["vocab.txt"]
    with pytest.raises(TypeError):
        files.write_json(path, {"not json": object()})
    assert path.read_text() == "[PAD]\n" and len(list(tmp_path.iterdir())) == 1


def test_the_temporary_is_hidden_beside_the_file_and_ends_in_tmp(tmp_path: Path) -> None:
    """data verify flags hidden *.tmp files as stray temporaries; readers skip dot files."""
    tmp = files.temp_path(tmp_path / "dataset.json")
    assert tmp.parent == tmp_path and tmp.name.startswith(".dataset.json.")
    assert tmp.name.endswith(".tmp")


def test_no_module_renames_files_by_hand_but_those_that_move_folders_or_large_files() -> None:
    found = {
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if re.search(r"\bos\.(replace|rename)\(", p.read_text(encoding="utf-8"))
    }
    assert found == set(RENAMES), "write small files with trainmaster.files.write_atomic"
