"""A dry run creates nothing, and an option's range is checked before the command acts."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT, assert_user_error, run_cli

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
