"""The supervisor's rule for a run whose work is done while an agent waits (completion.py), on
real run folders: which picture ends a job as succeeded, and which leaves it to the retry path.
test_exit_abort.py runs the same with real processes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from trainmaster.backends.local import completion
from trainmaster.run import goodput, state
from trainmaster.storage import RunPaths

LAUNCHED = time.time() - 60


def torch_line(t: float, code: int) -> str:
    """torchrun's line for a failed worker, in torch's log format (local time, microseconds)."""
    stamp = time.strftime("%m%d %H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1e6):06d}"
    return (f"E{stamp} 4242 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
            f"(exitcode: {code}) local_rank: 0 (pid: 4243) of binary: /usr/bin/python\n")  # fmt: skip


def folder(tmp_path: Path, *, started: float, failed: float | None, summary: bool = True,
           cancel: bool = False) -> RunPaths:  # fmt: skip
    """A 2-node run: rank 0 started at `started`; node 1's agent logged a SIGABRT at `failed`."""
    run = RunPaths(tmp_path / "run")
    run.logs.mkdir(parents=True)
    nodes = [state.NodeState(index=i) for i in range(2)]  # no pids: no live worker
    state.write(run.state, state.RunState(job="j", started_at=LAUNCHED, nodes=nodes,
                                          cancel_requested=cancel))  # fmt: skip
    goodput.record(run.timeline, "start", t=started, compiles=False)
    (run.logs / "node0.log").write_text("[default0]:trainmaster: rank 0 on pod vm\n")
    (run.logs / "node1.log").write_text(torch_line(failed, -6) if failed is not None else "")
    if summary:
        run.summary.write_text(json.dumps({"status": "completed"}))
    return run


def watch(run: RunPaths, builtin: bool = True) -> completion.EndWatch:
    return completion.EndWatch(run, builtin, [0, 0], LAUNCHED)


def test_a_worker_failed_after_the_last_start_is_done(tmp_path: Path) -> None:
    run = folder(tmp_path, started=LAUNCHED + 1, failed=LAUNCHED + 30)
    end = watch(run)
    assert end.check([None, None], set()) == [completion.Stuck(1, -6)]
    assert end.barrier == [0]  # node 0's agent waits in its exit barrier: stopped too
    assert end.stuck[0].warning() == (
        "node 1: a worker aborted at exit (SIGABRT) after the run completed; "
        "job counted as succeeded"
    )


def test_a_failure_before_the_last_start_was_restarted(tmp_path: Path) -> None:
    """A mid-run failure made every node restart; the run then finished: its agents meet in the
    exit barrier, and that is no stuck node."""
    run = folder(tmp_path, started=LAUNCHED + 30, failed=LAUNCHED + 20)
    assert watch(run).check([None, None], set()) == []


def test_no_summary_and_no_agent_at_zero_is_not_done(tmp_path: Path) -> None:
    run = folder(tmp_path, started=LAUNCHED + 1, failed=LAUNCHED + 30, summary=False)
    assert watch(run, builtin=False).check([None, None], set()) == []
    # A custom script: an agent that exited 0 says its workers finished the script.
    assert watch(run, builtin=False).check([0, None], set()) == [completion.Stuck(1, -6)]
    # The trainer: rank 0 may have died writing the final checkpoint; no summary, no verdict.
    assert watch(run, builtin=True).check([0, None], set()) == []


def test_an_older_summary_does_not_count(tmp_path: Path) -> None:
    run = folder(tmp_path, started=LAUNCHED + 1, failed=LAUNCHED + 30)
    os.utime(run.summary, (LAUNCHED - 3600, LAUNCHED - 3600))  # an earlier launch's
    assert watch(run).check([None, None], set()) == []


def test_a_node_lost_otherwise_is_left_to_the_retry_path(tmp_path: Path) -> None:
    """Node 0 ended by a signal with no worker failure of its own: not this rule's to judge."""
    run = folder(tmp_path, started=LAUNCHED + 1, failed=LAUNCHED + 30)
    assert watch(run).check([-9, None], set()) == []
    assert watch(run).check([-9, None], {0}) == [completion.Stuck(1, -6)]  # left out: skipped


def test_a_cancel_or_no_failure_is_not_done(tmp_path: Path) -> None:
    run = folder(tmp_path, started=LAUNCHED + 1, failed=LAUNCHED + 30, cancel=True)
    assert watch(run).check([None, None], set()) == []
    run = folder(tmp_path / "b", started=LAUNCHED + 1, failed=None)
    assert watch(run).check([None, None], set()) == []  # a normal end: both in the barrier


def test_worker_failure_reads_the_time_and_code_after_the_offset(tmp_path: Path) -> None:
    log = tmp_path / "node1.log"
    t = time.time() - 5
    log.write_text(torch_line(t - 100, 1) + "[default0]:step 3\n" + torch_line(t, -11))
    at, code = completion.worker_failure(log, 0) or (0.0, 0)
    assert abs(at - t) < 1e-3 and code == -11
    assert completion.Stuck(1, -11).why == "SIGSEGV"
    assert completion.worker_failure(log, log.stat().st_size) is None  # none since the offset


def test_a_node_whose_workers_all_said_their_script_returned_counts_as_finished(
    tmp_path: Path,
) -> None:
    """A custom script: node 0's agent still waits in its exit barrier (no exit code yet),
    but the shim said for each of its workers that the script returned (RUN/finished)."""
    run = folder(tmp_path, started=LAUNCHED + 1, failed=LAUNCHED + 30, summary=False)
    assert watch(run, builtin=False).check([None, None], set()) == []  # nobody said so yet
    run.finished.mkdir()
    (run.finished / "node0.0").write_text("")
    assert watch(run, builtin=False).check([None, None], set()) == [completion.Stuck(1, -6)]
    two = completion.EndWatch(run, False, [0, 0], LAUNCHED, nproc=2)
    assert two.check([None, None], set()) == []  # one of node 0's two workers said so
    (run.finished / "node0.1").write_text("")
    assert two.check([None, None], set()) == [completion.Stuck(1, -6)]
    assert watch(run, builtin=True).check([None, None], set()) == []  # the trainer: summary only
    for marker in run.finished.iterdir():  # said before this attempt's last start: stale
        os.utime(marker, (LAUNCHED, LAUNCHED))
    assert (
        completion.EndWatch(run, False, [0, 0], LAUNCHED, nproc=2).check([None, None], set()) == []
    )
