"""state.json: atomic updates, final phases stick, and dead processes are noticed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from trainmaster.launch import state


def _new(path: Path, **kw: object) -> None:
    state.write(path, state.RunState(job="j", **kw))  # type: ignore[arg-type]


def test_final_phase_is_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    _new(path)
    state.update(path, phase="cancelled")
    after = state.update(path, phase="failed", message="late writer")
    assert after.phase == "cancelled" and after.message == "late writer"


def test_dead_supervisor_and_agents_mean_failed(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    _new(path, phase="running", supervisor_pid=pid, nodes=[state.NodeState(index=0, pid=pid)])
    seen = state.observed(path)
    assert seen.phase == "failed" and "gone" in seen.message
    assert state.read(path).phase == "failed"  # written back for every reader


def test_live_supervisor_keeps_running(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        _new(path, phase="running", supervisor_pid=proc.pid)
        assert state.observed(path).phase == "running"
        assert state.pid_alive(proc.pid)
    finally:
        proc.communicate(b"")
    assert not state.pid_alive(proc.pid)
