"""Files a command writes where the user says (`init --out`, `export torchx --out`,
`launch --save-job`): a path the system refuses is one line naming the option and the path,
exit 2; a job file is saved only for a launch that passed its checks, and what `launch` says
about it is true."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT, assert_user_error, run_cli

LOCAL_CPU = str(ROOT / "examples" / "local-cpu.toml")


def script(folder: Path) -> Path:
    """A script job that ends at once (its entrypoint must exist for the launch checks)."""
    path = folder / "train.py"
    path.write_text("print('done')\n")
    return path


@pytest.mark.parametrize(
    ("args", "option", "fix"),
    [
        (["init", "--out", "{missing}/x.toml"], "--out", "create it"),
        (["init", "--out", "{folder}", "--force"], "--out", "is a folder"),
        (["export", "torchx", LOCAL_CPU, "--out", "{missing}/x.py"], "--out", "create it"),
        (
            ["launch", "{script}", "--save-job", "{missing}/job.toml", "--dry-run"],
            "--save-job",
            "create it",
        ),
        (
            ["launch", "{script}", "--save-job", "{folder}", "--dry-run"],
            "--save-job",
            "is a folder",
        ),
    ],  # fmt: skip
    ids=[
        "init-missing-folder",
        "init-folder",
        "export-missing-folder",
        "save-job-missing-folder",
        "save-job-folder",
    ],  # fmt: skip
)
def test_an_output_path_the_system_refuses_is_one_line(
    args: list[str], option: str, fix: str, tmp_path: Path
) -> None:
    folder = tmp_path / "somedir"
    folder.mkdir()
    names = {"{missing}": str(tmp_path / "nonexistent"), "{folder}": str(folder),
             "{script}": str(script(tmp_path))}  # fmt: skip
    argv = [next((a.replace(k, v) for k, v in names.items() if k in a), a) for a in args]
    result = run_cli("--storage", str(tmp_path / "st"), *argv, cwd=tmp_path)
    target = next(a for a in argv if a.startswith(names["{missing}"]) or a == str(folder))
    assert_user_error(result, target, fix, where=option)
    assert sorted(p.name for p in folder.iterdir()) == []  # no temporary left beside it
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_refused_launch_saves_no_job_file(tmp_path: Path) -> None:
    result = run_cli("launch", "nosuch.py", "--save-job", "j2.toml", cwd=tmp_path)
    assert_user_error(result, "job.entrypoint", "no such file")
    assert not (tmp_path / "j2.toml").exists()
    assert "wrote" not in result.stderr


def test_a_dry_run_saves_the_job_file_it_would_launch(tmp_path: Path) -> None:
    storage = tmp_path / "st"
    train = script(tmp_path)
    result = run_cli("--storage", str(storage), "launch", str(train), "--name", "dry-one",
                     "--save-job", "job.toml", "--dry-run", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    saved = tomllib.loads((tmp_path / "job.toml").read_text())
    assert saved["job"]["name"] == "dry-one" and saved["job"]["entrypoint"] == str(train)
    assert "`trainmaster launch job.toml` runs this job" in result.stderr
    again = run_cli("--storage", str(storage), "launch", "job.toml", "--dry-run", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    shown = run_cli("launch", "--help")
    assert "--dry-run" in " ".join(shown.stdout.split()).rsplit("--save-job", 1)[1][:200]


@pytest.mark.slow
def test_after_a_launch_the_saved_job_file_continues_that_job(tmp_path: Path) -> None:
    """The saved file names the job just started: launching it again needs --resume, as the
    message says, and a new name makes a new job."""
    storage = str(tmp_path / "st")
    script(tmp_path)
    result = run_cli("--storage", storage, "launch", "train.py", "--name", "saved-once",
                     "--save-job", "job.toml", "--follow", cwd=tmp_path, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = "`trainmaster launch job.toml --resume` continues this job"
    assert said in result.stderr and "change job.name" in result.stderr
    plain = run_cli("--storage", storage, "launch", "job.toml", "--dry-run", cwd=tmp_path)
    assert_user_error(plain, "pass --resume", where="job.name")
    resumed = run_cli("--storage", storage, "launch", "job.toml", "--resume", "--dry-run",
                      cwd=tmp_path)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    renamed = run_cli("--storage", storage, "launch", "job.toml", "--dry-run",
                      "--set", 'job.name="saved-twice"', cwd=tmp_path)  # fmt: skip
    assert renamed.returncode == 0, renamed.stderr
