"""`status` of a local run read from its folder alone (no processes of its own started)."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

from tests.conftest import run_cli
from trainmaster.run import pids, state
from trainmaster.storage import RunPaths, Storage


def fake_run(root: Path, job: str, *, summary: str | None) -> RunPaths:
    """A run whose supervisor is this test process (alive), as `launch` records it."""
    run = RunPaths(Storage(root).run_dir(job))
    run.dir.mkdir(parents=True)
    started = time.time() - 5
    st = state.RunState(job=job, phase="running", nnodes=1, storage=str(root),
                        supervisor_pid=os.getpid(), supervisor_start=pids.start_time(os.getpid()),
                        nodes=[state.NodeState(index=0)], created_at=started, started_at=started)  # fmt: skip
    state.write(run.state, st)
    if summary is not None:
        run.summary.write_text(json.dumps({"status": summary, "steps": 3, "restarts": 0}))
    return run


def test_a_finished_attempt_is_finishing_not_running(tmp_path: Path) -> None:
    """Scripts polling status never see a job whose workers wrote their final summary as
    running while the supervisor is still recording the end."""
    fake_run(tmp_path, "done", summary="completed")
    fake_run(tmp_path, "busy", summary=None)
    done = json.loads(run_cli("status", "done", "--json", "--storage", str(tmp_path)).stdout)
    busy = json.loads(run_cli("status", "busy", "--json", "--storage", str(tmp_path)).stdout)
    assert (done["phase"], busy["phase"]) == ("finishing", "running")
    st = state.observed(RunPaths(Storage(tmp_path).run_dir("done")).state)
    at = datetime.fromtimestamp(st.created_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert done["created"] == at  # UTC, as Kubernetes' creationTimestamp, whatever TZ says
    listed = json.loads(run_cli("list", "--json", "--storage", str(tmp_path)).stdout)
    assert {j["job"]: j["phase"] for j in listed} == {"done": "finishing", "busy": "running"}
    shown = run_cli("status", "done", "--storage", str(tmp_path))
    assert "phase finishing" in shown.stdout
