"""state.json: atomic updates, final phases stick, and dead processes are noticed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from trainmaster.run import state


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
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(dead.stdout)
    _new(path, phase="running", supervisor_pid=pid, nodes=[state.NodeState(index=0, pid=pid)])
    seen = state.observed(path)
    assert seen.phase == "failed" and "gone" in seen.message
    assert state.read(path).phase == "failed"  # written back for every reader


def test_live_supervisor_keeps_running(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        _new(path, phase="running", supervisor_pid=proc.pid)
        assert state.observed(path).phase == "running"
        assert state.pid_alive(proc.pid)
    finally:
        proc.communicate(b"")
    assert not state.pid_alive(proc.pid)


def test_state_files_of_older_versions_still_load(tmp_path: Path) -> None:
    """Before the typed RunState fields (docs/architecture.md 5: 13.4), storage and private_etcd
    were strings inside the rendezvous dict."""
    path = tmp_path / "state.json"
    path.write_text(
        '{"job": "old", "phase": "succeeded", "rendezvous": {"backend": "etcd-v2", '
        '"endpoint": "127.0.0.1:2379", "run_id": "old-1", "private_etcd": "true", '
        f'"storage": "{tmp_path}"}}}}',
        encoding="utf-8",
    )
    st = state.read(path)
    assert st.storage == str(tmp_path) and st.private_etcd is True
    assert st.rendezvous == {"backend": "etcd-v2", "endpoint": "127.0.0.1:2379", "run_id": "old-1"}
    state.update(path, message="read again")  # written back in the new layout, still loads
    again = state.read(path)
    assert (
        again.storage == str(tmp_path) and again.private_etcd and "storage" not in again.rendezvous
    )


def test_new_state_files_keep_storage_out_of_the_rendezvous(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    _new(
        path,
        rendezvous={"backend": "c10d", "endpoint": "127.0.0.1:1"},
        storage="/data",
        private_etcd=False,
    )
    raw = path.read_text(encoding="utf-8")
    assert '"storage": "/data"' in raw and '"private_etcd": false' in raw
    assert state.read(path).rendezvous == {"backend": "c10d", "endpoint": "127.0.0.1:1"}


def test_the_supervisors_cancel_watch_parses_state_json_only_when_it_changed(
    tmp_path: Path,
) -> None:
    """Starting n agents looked for a cancel n times; parsing every time was O(n^2) in nodes."""
    import pytest

    from trainmaster.backends.local.gang import Cancelled, CancelWatch
    from trainmaster.storage import RunPaths

    run = RunPaths(tmp_path)
    _new(run.state, nodes=[state.NodeState(index=i) for i in range(64)])
    watch = CancelWatch(run)
    for _ in range(64):
        watch.check()
    assert watch.reads == 1
    state.update(run.state, message="starting")  # another writer: read again, no cancel
    watch.check()
    assert watch.reads == 2
    state.update(run.state, cancel_requested=True)
    with pytest.raises(Cancelled):
        watch.check()
