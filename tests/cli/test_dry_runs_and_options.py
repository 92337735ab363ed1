"""A dry run creates nothing, and an option's range is checked before the command acts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT, assert_user_error, run_cli
from trainmaster.backends.local import backend
from trainmaster.errors import UserError
from trainmaster.storage import Storage

CUSTOM = "examples/custom-gpt/job.toml"  # its entrypoint is relative to the repository


def test_a_dry_run_leaves_a_new_storage_folder_uncreated(tmp_path: Path) -> None:
    storage = tmp_path / "x" / "e3"
    result = run_cli("launch", CUSTOM, "--dry-run", "--storage", str(storage), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert sorted(tmp_path.iterdir()) == []


def test_a_dry_run_still_refuses_storage_it_could_not_create(tmp_path: Path) -> None:
    """...and the check it does instead can fail: a storage root below a plain file."""
    (tmp_path / "plain").write_text("")
    storage = tmp_path / "plain" / "e3"
    result = run_cli("launch", CUSTOM, "--dry-run", "--storage", str(storage), cwd=ROOT)
    assert_user_error(result, "storage is not writable", "--storage", where=str(storage))


def test_a_negative_cancel_grace_is_refused(tmp_path: Path) -> None:
    result = run_cli("--storage", str(tmp_path), "cancel", "some-job", "--grace", "-1")
    assert_user_error(result, "'--grace'", "greater than or equal to 0")


def test_a_folder_above_the_storage_that_may_not_be_searched_is_a_user_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Path.exists raises PermissionError below a folder without x for this user (root may
    search any, so the system's refusal is stood in for)."""

    def refused(self: Path, **_: object) -> bool:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "exists", refused)
    with pytest.raises(UserError, match="storage is not writable"):
        backend._could_create(Storage(tmp_path / "locked" / "store"))


def test_a_script_option_given_twice_is_refused(tmp_path: Path) -> None:
    """--nnodes 2 with --set job.nnodes=3 took 3 without a word."""
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    result = run_cli("--storage", str(tmp_path / "s"), "launch", str(script), "--nnodes", "2",
                     "--set", "job.nnodes=3", "--dry-run", cwd=tmp_path)  # fmt: skip
    assert_user_error(result, "also set by --set job.nnodes=", where="--nnodes")
