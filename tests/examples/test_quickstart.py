"""`trainmaster launch train.py --nnodes 2 -- ARGS`: a script without a job file, as TorchX's
`dist.ddp --script` runs one: local, c10d, defaults; the job file it used is printed or saved."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT, assert_user_error, run_cli

SCRIPT = """
import sys
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} of {dist.get_world_size()} args {sys.argv[1:]}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_script_runs_on_two_nodes_without_a_job_file(tmp_path: Path) -> None:
    (tmp_path / "hello_ddp.py").write_text(SCRIPT)
    storage = tmp_path / "data"
    args = ["--storage", str(storage), "--follow", "--", "--lr", "3e-4"]
    done = run_cli("launch", "hello_ddp.py", "--nnodes", "2", *args, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    handle = done.stdout.split()[0]
    assert handle.startswith("local://hello-ddp-")
    text = done.stderr.split("(--save-job FILE writes it):\n", 1)[1]
    printed = tomllib.loads(text[: text.index("[rendezvous]")] + '[rendezvous]\nbackend = "c10d"\n')
    assert '[rendezvous]\nbackend = "c10d"' in text
    assert printed["job"]["nnodes"] == 2 and printed["job"]["args"] == ["--lr", "3e-4"]
    job = handle.removeprefix("local://")
    logs = {r: (storage / "runs" / job / "logs" / f"rank{r}.log").read_text() for r in (0, 1)}
    assert all(f"rank {r} of 2 args ['--lr', '3e-4']" in logs[r] for r in (0, 1))

    again = run_cli("launch", "hello_ddp.py", "--nnodes", "2", "--save-job", "job.toml", *args, cwd=tmp_path, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert again.stdout.split()[0] != handle  # the same command again is a new job
    saved = tmp_path / "job.toml"
    rerun = run_cli("launch", str(saved), "--storage", str(storage), "--dry-run",
                    "--set", 'job.name="hello-rerun"', cwd=tmp_path)  # fmt: skip
    assert rerun.returncode == 0 and "hello_ddp.py --lr 3e-4" in rerun.stdout, rerun.stderr


def test_script_options_with_a_job_file_are_refused() -> None:
    job = str(ROOT / "examples" / "local-cpu.toml")
    bad = run_cli("launch", job, "--nnodes", "2", "--dry-run")
    assert_user_error(bad, where="--nnodes")
    assert "--set" in bad.stderr
    extra = run_cli("launch", job, "--dry-run", "--", "x")
    assert_user_error(extra, "ARGS")


def test_a_bad_script_name_is_one_line(tmp_path: Path) -> None:
    shown = run_cli("launch", "train.py", "--name", "Bad_Name", "--dry-run", cwd=tmp_path)
    assert_user_error(shown)
    assert "job.name" in shown.stderr
