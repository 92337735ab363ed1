"""The custom-entrypoint shim (launch/entry.py) and log_metrics (run/metrics.py), run for real: a
worker process as torchrun would start it, without torch, and the metrics file it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainmaster import api
from trainmaster import worker as helpers
from trainmaster.launch import entry, torchrun
from trainmaster.monitor import runinfo
from trainmaster.run import divergence
from trainmaster.run import metrics as runlog
from trainmaster.storage import RunPaths

SCRIPT = """\
import json, os, sys
from trainmaster.api import log_metrics
keys = ["TRAINMASTER_RUN_DIR", "TRAINMASTER_CHECKPOINT_DIR", "TRAINMASTER_TENSORBOARD_DIR",
        "TRAINMASTER_STORAGE", "TRAINMASTER_JOB"]
print(json.dumps({"name": __name__, "argv": sys.argv, "cwd": os.getcwd(),
                  "env": {k: os.environ.get(k) for k in keys}}))
log_metrics(step=1, loss=2.5, note="hello", bad=float("nan"))
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


def worker(
    run: RunPaths,
    target: list[str],
    *,
    rank: int,
    workdir: Path,
    cwd: Path,
    extra: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "RANK": str(rank),
        "LOCAL_RANK": "0",
        "GROUP_RANK": "0",
        "TORCHELASTIC_RUN_ID": "job-1",
        **(extra or {}),
    }
    env.pop("TRAINMASTER_RUN_DIR", None)
    cmd = [
        sys.executable,
        "-m",
        entry.MODULE,
        "--job",
        str(run.job_toml),
        "--storage",
        "/store",
        "--workdir",
        str(workdir),
        "--",
        *target,
    ]
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.fixture
def run(tmp_path: Path) -> RunPaths:
    paths = RunPaths(tmp_path / "store" / "runs" / "mine")
    paths.dir.mkdir(parents=True)
    return paths


def test_script_runs_as_main_with_the_run_folder(run: RunPaths, tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "sub").mkdir(parents=True)
    (code / "sub" / "train.py").write_text(SCRIPT)
    result = worker(run, ["sub/train.py", "--lr", "1"], rank=0, workdir=code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["name"] == "__main__" and out["argv"] == [
        str(code / "sub" / "train.py"),
        "--lr",
        "1",
    ]
    assert out["env"] == {
        "TRAINMASTER_RUN_DIR": str(run.dir),
        "TRAINMASTER_STORAGE": "/store",
        "TRAINMASTER_CHECKPOINT_DIR": str(run.checkpoints),
        "TRAINMASTER_TENSORBOARD_DIR": str(run.tensorboard),
        "TRAINMASTER_JOB": "mine",
    }
    assert run.checkpoints.is_dir() and run.tensorboard.is_dir()
    # Rank 0: its log file, the line the Kubernetes backend looks for, rank0.json, summary.json.
    assert "trainmaster: rank 0 on pod " in (run.logs / "rank0.log").read_text()
    assert json.loads(run.rank0.read_text())["restarts"] == 0
    assert json.loads(run.summary.read_text())["status"] == "completed"
    rows = runinfo.read_metrics(run.metrics)
    assert rows[0]["step"] == 1 and rows[0]["loss"] == 2.5 and rows[0]["bad"] is None
    assert rows[0]["note"] == "hello" and isinstance(rows[0]["elapsed_s"], float)


def test_every_start_of_rank_0_in_one_launch_is_a_restart(run: RunPaths, tmp_path: Path) -> None:
    """torchrun counts restarts per agent (rank 0's may say 0); rank 0's starts under one
    rendezvous id count them for the job. A new launch (new id) starts again from 0."""
    (tmp_path / "t.py").write_text(SCRIPT)
    for expected, run_id in ((0, "a"), (1, "a"), (2, "a"), (0, "b")):
        result = worker(
            run,
            ["t.py"],
            rank=0,
            workdir=tmp_path,
            cwd=tmp_path,
            extra={"TORCHELASTIC_RUN_ID": run_id},
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(run.summary.read_text())["restarts"] == expected


def test_other_ranks_write_no_metrics_and_a_failure_no_summary(
    run: RunPaths, tmp_path: Path
) -> None:
    (tmp_path / "t.py").write_text(SCRIPT)
    result = worker(run, ["t.py"], rank=1, workdir=tmp_path, cwd=tmp_path)
    assert result.returncode == 0 and not run.metrics.exists() and not run.summary.exists()
    assert (run.logs / "rank1.log").exists() and not run.rank0.exists()
    result = worker(run, ["t.py"], rank=0, workdir=tmp_path, cwd=tmp_path, extra={"EXIT_WITH": "3"})
    assert (
        result.returncode == 3 and not run.summary.exists()
    )  # the script's exit code, no "completed"


def test_module_entrypoint_is_found_in_the_workdir(run: RunPaths, tmp_path: Path) -> None:
    pkg = tmp_path / "code" / "mypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(SCRIPT)
    result = worker(
        run, ["-m", "mypkg.train", "x"], rank=0, workdir=tmp_path / "code", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["name"] == "__main__" and out["argv"][1:] == ["x"] and out["cwd"] == str(tmp_path)


def test_builtin_trainer_command_is_unchanged_and_custom_goes_through_the_shim() -> None:
    rdzv = torchrun.Rendezvous("c10d", "127.0.0.1:29400", run_id="r")
    builtin = torchrun.command(
        api.preset_job("local-cpu"), rdzv, job_file="J", storage="S", workdir="/w"
    )
    assert builtin[-6:] == ["-m", "trainmaster.train", "--job", "J", "--storage", "S"]
    cfg = api.preset_job("local-cpu", ['job.entrypoint="-m pkg.train"', 'job.args=["--lr", "1"]'])
    cmd = torchrun.command(cfg, rdzv, job_file="J", storage="S", workdir="/w")
    assert cmd[cmd.index("--monitor-interval=1") + 1 :] == [
        "-m",
        "trainmaster.launch.entry",
        "--job",
        "J",
        "--storage",
        "S",
        "--workdir",
        "/w",
        "--",
        "-m",
        "pkg.train",
        "--lr",
        "1",
    ]


def test_log_metrics_outside_rank_0_and_drop_after(tmp_path: Path) -> None:
    env = {"TRAINMASTER_RUN_DIR": str(tmp_path), "RANK": "0"}
    for step in (1, 2, 3):
        assert runlog.log_metrics(step, environ=env, loss=1.0 / step) is not None
    assert runlog.log_metrics(4, environ={**env, "RANK": "1"}, loss=0.1) is None
    with (tmp_path / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 4, "loss"')  # torn by a kill
    assert [r["step"] for r in runinfo.read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    assert runlog.drop_after(1, environ=env) == 3  # steps 2, 3 and the torn line
    assert [r["step"] for r in runinfo.read_metrics(tmp_path / "metrics.jsonl")] == [1]
    with pytest.raises(TypeError, match="loss=.* is not a number or a string"):
        runlog.log_metrics(5, environ=env, loss=[1.0])


def test_checkpoint_folders_are_published_whole_and_the_newest_is_found(tmp_path: Path) -> None:
    """trainmaster.worker's convention: a save goes into .tmp-step_N (every rank the same path),
    rank 0 renames it to step_N; only step_N folders are checkpoints; keep prunes the oldest and
    a killed attempt's unfinished folder goes at the next save."""
    env = {"TRAINMASTER_CHECKPOINT_DIR": str(tmp_path), "RANK": "0"}
    assert helpers.latest_checkpoint(env) is None
    (helpers.checkpoint_dir(7, env) / "w.pt").write_text("killed half-way")
    for step in (10, 20, 30):
        (helpers.checkpoint_dir(step, env) / "w.pt").write_text(str(step))
        assert helpers.latest_checkpoint(env) == (
            tmp_path / f"step_{step - 10}" if step > 10 else None
        )
        assert helpers.checkpoint_saved(step, keep=2, environ=env) == tmp_path / f"step_{step}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_20", "step_30"]
    assert helpers.latest_checkpoint(env) == tmp_path / "step_30"
    assert (tmp_path / "step_30" / "w.pt").read_text() == "30"
    # Other ranks only say they are done; without the shim preempted() is False, as by hand.
    (helpers.checkpoint_dir(40, env) / "w.pt").write_text("40")
    helpers.checkpoint_saved(40, environ={**env, "RANK": "1"})
    assert helpers.latest_checkpoint(env) == tmp_path / "step_30" and helpers.preempted() is False


def test_a_scripts_non_finite_loss_stops_the_job_in_one_line(run: RunPaths, tmp_path: Path) -> None:
    """run/divergence.py for a custom script: detection and the stop (no rollback of ours)."""
    (tmp_path / "t.py").write_text(
        "from trainmaster.worker import log_metrics\n"
        "for step in range(1, 6):\n"
        "    log_metrics(step=step, loss=float('nan') if step == 3 else 1.0 / step)\n"
        "print('after the loop')\n"
    )
    result = worker(run, ["t.py"], rank=0, workdir=tmp_path, cwd=tmp_path)
    assert result.returncode == divergence.EXIT_DIVERGED, result.stderr
    said = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(said) == 1 and said[0].startswith("trainmaster: training diverged: non-finite loss")
    assert "at step 3" in said[0] and "after the loop" not in result.stdout
    [line] = divergence.read(run.rollbacks)
    assert (line["step"], line["action"], line["to"]) == (3, "stop", None)
    assert [r["step"] for r in runinfo.read_metrics(run.metrics)] == [1, 2, 3]
    assert not run.summary.exists()  # not "completed"
