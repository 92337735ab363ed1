"""A worker that aborts at exit after the run completed (torch 2.13 does so to gloo workers at
times) does not fail the job: the supervisor sees the work is done, stops the agent that waits
in a restart rendezvous for nodes that have finished, and ends the job succeeded with a warning
(backends/local/completion.py). A worker that aborts mid-run still takes the restart path.

Real processes: a custom 2-node gloo script launched with `trainmaster launch`, rank 1 calling
os.abort() once, at the end or mid-run. Without the supervisor's check, the job of the first
test would wait out torchrun's exit barrier (300 s) and the join timeout: the CLI's timeout
below, well under both, makes that a failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.backends.local.test_local import diagnosis, no_processes_left, summary, wait_final
from tests.conftest import run_cli
from trainmaster.backends.local import completion
from trainmaster.monitor import runinfo
from trainmaster.run import timeline
from trainmaster.storage import RunPaths, Storage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
STEPS = 6
# Rank 1 aborts once, after step ABORT_AT or at the end (0): the script's docstring says how.
SCRIPT = Path(__file__).parents[3] / "bench" / "abort_script.py"


def launch(
    tmp_path: Path, name: str, abort_at: int, *sets: str, rank: int = 1
) -> tuple[int, RunPaths]:
    """Launch the script on 2 nodes, RANK aborting, and follow it to its end; (CLI exit code,
    run folder)."""
    (tmp_path / "abort.py").write_text(SCRIPT.read_text())
    store = tmp_path / "store"
    args = ["--storage", str(store), "launch", "abort.py", "--nnodes", "2", "--name", name,
            "--follow", "--set", "train.preflight=false", "--set", "rendezvous.timeout=240"]  # fmt: skip
    for s in sets:
        args += ["--set", s]
    env = {"ABORT_AT": str(abort_at), "STEPS": str(STEPS), "ABORT_RANK": str(rank)}
    result = run_cli(*args, cwd=tmp_path, env=env, timeout=200)
    return result.returncode, RunPaths(Storage(store).run_dir(name))


def steps(run: RunPaths) -> list[int]:
    return [int(r["step"]) for r in runinfo.read_metrics(run.metrics)]


@pytest.mark.stacks  # reads torchrun's failure line: its format on every torch we ship
def test_a_worker_aborted_at_exit_after_the_last_step_ends_the_job_succeeded(
    tmp_path: Path,
) -> None:
    code, run = launch(tmp_path, "abort-at-exit", 0)
    final = wait_final(run.dir.parents[1], "abort-at-exit", timeout=30)
    assert final.phase == "succeeded" and code == 0, diagnosis(run.dir.parents[1], run.dir.name)
    # The node of rank 1 (whichever index the rendezvous gave it) and the other, whose agent
    # waited in torchrun's exit barrier for it.
    stuck = [n for n in final.nodes if n.note.startswith("a worker aborted at exit")]
    assert len(stuck) == 1
    node = stuck[0].index
    assert final.nodes[1 - node].note == completion.BARRIER_NOTE
    warning = (
        f"node {node}: a worker aborted at exit (SIGABRT) after the run completed; "
        "job counted as succeeded"
    )
    assert final.message == warning
    assert "failed (exitcode: -6)" in Path(stuck[0].log).read_text()
    events = [e for e in timeline.read(run.timeline) if isinstance(e, timeline.WorkerDiedAtExit)]
    assert [(e.node, e.why) for e in events] == [(node, "SIGABRT")]
    assert summary(run.dir.parents[1], run.dir.name)["status"] == "completed"
    assert steps(run) == list(range(1, STEPS + 1))  # ran once: no restart, no job retry
    assert final.job_retries == 0 and no_processes_left(final)
    shown = run_cli("status", "abort-at-exit", "--json", "--storage", str(run.dir.parents[1]))
    assert json.loads(shown.stdout)["message"] == warning


@pytest.mark.stacks  # torchrun's failure line and exit barrier on every torch we ship
def test_rank_0_dying_at_the_end_of_a_script_after_the_others_finished_ends_the_job_at_once(
    tmp_path: Path,
) -> None:
    """Rank 0 writes no summary, and the other node's agent does not exit: it waits in
    torchrun's exit barrier (300 s), which only the shim's word that its workers' script
    returned (RUN/finished) can cut short. The CLI's timeout is well under 300 s."""
    code, run = launch(tmp_path, "abort0-at-end", 0, rank=0)
    final = wait_final(run.dir.parents[1], "abort0-at-end", timeout=30)
    assert final.phase == "succeeded" and code == 0, diagnosis(run.dir.parents[1], run.dir.name)
    assert not run.summary.exists()  # rank 0 never got there
    stuck = [n for n in final.nodes if n.note.startswith("a worker aborted at exit")]
    assert len(stuck) == 1 and final.nodes[1 - stuck[0].index].note == completion.BARRIER_NOTE
    assert final.message.startswith(f"node {stuck[0].index}: a worker aborted at exit (SIGABRT)")
    assert sorted(p.name for p in run.finished.iterdir()) == [f"node{1 - stuck[0].index}.0"]
    assert steps(run) == list(range(1, STEPS + 1)) and final.job_retries == 0
    assert no_processes_left(final)


def test_a_worker_aborted_mid_run_is_restarted_as_before(tmp_path: Path) -> None:
    code, run = launch(tmp_path, "abort-mid-run", 3, "job.max_restarts=2")
    final = wait_final(run.dir.parents[1], "abort-mid-run", timeout=30)
    assert final.phase == "succeeded" and code == 0, diagnosis(run.dir.parents[1], run.dir.name)
    assert "at exit" not in final.message and not any(n.note for n in final.nodes)
    s = summary(run.dir.parents[1], run.dir.name)
    assert s["status"] == "completed" and s["restarts"] >= 1  # torchrun restarted the workers
    assert not [e for e in timeline.read(run.timeline) if isinstance(e, timeline.WorkerDiedAtExit)]


def test_a_worker_aborted_mid_run_with_no_restart_left_fails_the_job(tmp_path: Path) -> None:
    code, run = launch(tmp_path, "abort-no-restart", 3, "job.max_restarts=0", "job.max_retries=0")
    final = wait_final(run.dir.parents[1], "abort-no-restart", timeout=30)
    assert final.phase == "failed" and code != 0, diagnosis(run.dir.parents[1], run.dir.name)
    assert "at exit" not in final.message and not any(n.note for n in final.nodes)
    assert not run.summary.exists()
