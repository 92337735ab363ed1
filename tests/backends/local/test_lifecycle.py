"""The local run's lifecycle with real processes, without training: cancel during start-up,
reused pids, a stale summary, a supervisor that died (docs/architecture.md 5: 17.1, 17.5,
17.7 and 17.8)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainmaster.backends.local import ending, rendezvous
from trainmaster.backends.local import launcher as local
from trainmaster.config import jobfile
from trainmaster.errors import UserError
from trainmaster.run import pids, state
from trainmaster.storage import RunPaths, Storage


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process in a session (and process group) of its own, standing in for one that now
    owns a recorded pid; it ends when its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.communicate(b"", timeout=30)


def _state(path: Path, **kw: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state.write(path, state.RunState(job="j", **kw))  # type: ignore[arg-type]


def _dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


# --- 17.5: a pid is a process only with its start time ------------------------------------------


def test_start_time_names_one_process(sleeper: subprocess.Popen[bytes]) -> None:
    started = pids.start_time(sleeper.pid)
    assert started is not None and started > 0
    assert pids.pid_alive(sleeper.pid, started)
    assert not pids.pid_alive(sleeper.pid, started + 1)  # the same pid, another process
    assert pids.start_time(_dead_pid()) is None


def test_cancel_of_a_finished_job_signals_nothing(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """The job ended long ago; its agent's pid now belongs to an unrelated process."""
    run = RunPaths(tmp_path / "run")
    other = (pids.start_time(sleeper.pid) or 0) + 1
    _state(
        run.state,
        phase="succeeded",
        supervisor_pid=_dead_pid(),
        nodes=[state.NodeState(index=0, pid=sleeper.pid, start_time=other)],
    )
    st = local.cancel(run, grace_s=1.0)
    assert st.phase == "succeeded" and not st.cancel_requested
    assert sleeper.poll() is None  # not signalled


def test_cancel_skips_a_reused_pid_of_a_running_record(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """state.json says running (its supervisor died), the agent's pid was reused."""
    run = RunPaths(tmp_path / "run")
    other = (pids.start_time(sleeper.pid) or 0) + 1
    _state(
        run.state,
        phase="running",
        supervisor_pid=_dead_pid(),
        nodes=[state.NodeState(index=0, pid=sleeper.pid, start_time=other)],
    )
    local.cancel(run, grace_s=1.0)
    assert sleeper.poll() is None


# --- 17.1: cancel during start-up, and no second copy --------------------------------------------


def _run_folder(tmp_path: Path, **kw: object) -> RunPaths:
    cfg = jobfile.preset("local-cpu", ['job.name="early"', "job.nnodes=1"])
    run = RunPaths(tmp_path / "runs" / "early")
    run.logs.mkdir(parents=True)
    run.job_toml.write_text(jobfile.render(cfg, "test"))
    _state(
        run.state,
        nodes=[state.NodeState(index=0)],
        rendezvous={"backend": "c10d", "endpoint": "127.0.0.1:1"},
        storage=str(tmp_path),
        **kw,
    )
    return run


def test_supervisor_honours_a_cancel_recorded_before_it_started(tmp_path: Path) -> None:
    """`cancel` of a pending run only records the request: the supervisor must start nothing."""
    run = _run_folder(tmp_path, cancel_requested=True)
    done = subprocess.run(
        [sys.executable, "-m", "trainmaster.backends.local.supervisor", str(run.dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    st = state.read(run.state)
    assert st.phase == "cancelled", done.stderr
    assert st.nodes[0].pid is None  # no agent was started
    assert not (run.logs / "node0.log").exists()


def test_resume_is_refused_while_a_process_of_the_run_lives(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """A cancelled run whose supervisor still winds down: a second copy would share its folder."""
    store = Storage(tmp_path)
    cfg = jobfile.preset("local-cpu", ['job.name="early"', "job.nnodes=1"])
    run = RunPaths(store.run_dir("early"))
    _state(
        run.state,
        phase="cancelled",
        supervisor_pid=sleeper.pid,
        supervisor_start=pids.start_time(sleeper.pid),
    )
    with pytest.raises(UserError, match="still running"):
        local.plan(cfg, store, resume=True)


def test_checkpoints_of_other_settings_are_refused_before_anything_starts(
    pydoc_storage: Path,
) -> None:
    """Every worker would refuse them after its start-up (exit 2 on each); the launcher refuses
    them first. A longer max_steps keeps the hash: `launch --resume --set train.max_steps=N`."""
    store = Storage(pydoc_storage)
    cfg = jobfile.preset("local-cpu", ['job.name="refused-early"', "job.nnodes=1"])
    step = RunPaths(store.run_dir("refused-early")).checkpoints / "step_5"
    step.mkdir(parents=True)
    meta = {"step": 5, "job": "refused-early", "config_hash": "feedfacefeedface"}
    (step / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="config hash feedfacefeedface"):
        local.plan(cfg, store, resume=True)
    # written before max_steps left the hash: still this job's, with its max_steps
    (step / "meta.json").write_text(json.dumps({**meta, "config_hash": cfg.derived.legacy_config_hash}))  # fmt: skip
    assert local.plan(cfg, store, resume=True).run.dir == step.parents[1]
    (step / "meta.json").write_text(json.dumps({**meta, "config_hash": cfg.derived.config_hash}))
    longer = jobfile.preset(
        "local-cpu", ['job.name="refused-early"', "job.nnodes=1", "train.max_steps=999"]
    )
    assert local.plan(longer, store, resume=True).run.dir == step.parents[1]


# --- 17.8: only this attempt's summary counts -----------------------------------------------------


def test_stale_summary_does_not_make_an_elastic_run_succeed(tmp_path: Path) -> None:
    run = RunPaths(tmp_path / "run")
    run.dir.mkdir()
    run.summary.write_text(json.dumps({"status": "completed"}))
    old = time.time() - 3600
    os.utime(run.summary, (old, old))  # written by an earlier launch of the job
    _state(run.state, phase="running", started_at=time.time() - 60)
    st = state.read(run.state)
    assert not state.summary_of_attempt(run.state, st)
    assert (
        ending.phase(st, [0, 1], True, False, state.summary_of_attempt(run.state, st)) == "failed"
    )
    run.summary.write_text(json.dumps({"status": "completed"}))  # this attempt's
    assert state.summary_of_attempt(run.state, st)
    assert ending.phase(st, [0, 1], True, False, True) == "succeeded"


# --- 17.7: a supervisor that died ------------------------------------------------------------------


def test_dead_supervisor_run_that_completed_is_succeeded_and_its_etcd_stopped(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    run = RunPaths(tmp_path / "run")
    _state(
        run.state,
        phase="running",
        started_at=time.time() - 60,
        supervisor_pid=_dead_pid(),
        etcd_pid=sleeper.pid,
        etcd_start=pids.start_time(sleeper.pid),
        nodes=[state.NodeState(index=0, pid=_dead_pid())],
    )
    run.summary.write_text(json.dumps({"status": "completed"}))
    seen = state.observed(run.state)
    assert seen.phase == "succeeded"
    assert sleeper.wait(timeout=30) == -signal.SIGTERM  # the private etcd is stopped


def test_supervisor_cleanup_that_fails_does_not_raise() -> None:
    class Stuck:
        killed = False

        def terminate(self) -> None:
            pass

        def wait(self, timeout: float) -> int:
            if not self.killed:
                raise subprocess.TimeoutExpired("etcd", timeout)
            return -9

        def kill(self) -> None:
            self.killed = True

    stuck = Stuck()
    rendezvous.stop_private_etcd(stuck)  # type: ignore[arg-type]
    assert stuck.killed


def test_cancel_cli_says_a_finished_job_had_ended(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """`trainmaster cancel` of a job that ended long ago says so, and signals nothing."""
    run = RunPaths(Storage(tmp_path).run_dir("old"))
    other = (pids.start_time(sleeper.pid) or 0) + 1
    _state(
        run.state,
        phase="succeeded",
        supervisor_pid=_dead_pid(),
        finished_at=time.time() - 3600,
        nodes=[state.NodeState(index=0, pid=sleeper.pid, start_time=other)],
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainmaster",
            "cancel",
            "old",
            "--storage",
            str(tmp_path),
            "--grace",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "already succeeded; nothing to cancel" in done.stdout
    assert sleeper.poll() is None


def test_dry_run_shows_the_rendezvous_id_that_start_records(tmp_path: Path) -> None:
    """The plan picks the per-launch id (12.1): --dry-run prints the command that will run,
    and each plan of the same job name gets its own id."""
    store = Storage(tmp_path)
    shards = tmp_path / "datasets" / "pydoc"
    shards.mkdir(parents=True)
    for k in range(2):
        (shards / f"pydoc_training_{k}.hdf5").touch()  # plan() only counts them
    cfg = jobfile.preset("local-cpu", ['job.name="ids"'])
    first, second = local.plan(cfg, store), local.plan(cfg, store)
    assert first.rdzv.run_id and second.rdzv.run_id
    assert first.rdzv.run_id.startswith("ids-") and first.rdzv.run_id != second.rdzv.run_id
    assert all(f"--rdzv-id={first.rdzv.run_id}" in cmd for cmd in first.commands)
