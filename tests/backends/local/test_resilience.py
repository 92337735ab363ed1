"""The hang watchdog and node preflight (docs/architecture.md 5: 14.1, 14.2), end to end on a real
2-node local job.

The watchdog: one rank stops making progress after step 15 (fault hook: it sleeps). Its
watchdog dumps the stacks and ends it; torchrun restarts the group from the step-10 checkpoint
and the job completes, long before the process group's own timeout (180 s here, 30 min by
default). Preflight: a node whose device computes wrong numbers stops the job before step 1.
Preemption: `cancel` (SIGTERM) is saved at the current step and resumed from there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.backends.local.test_local import (
    FAULT_ENV,
    diagnosis,
    job_file,
    recovered_once,
    summary,
    wait_final,
    wait_step,
)
from tests.conftest import run_cli
from trainmaster.run import checkpoints
from trainmaster.storage import RunPaths, Storage
from trainmaster.train import faults, preempt, watchdog

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
HANG_TIMEOUT = 15  # a bert-tiny step takes well under a second here, even on a loaded machine


def test_hung_rank_is_dumped_and_the_job_restarts_from_its_checkpoint(
    pydoc_storage: Path, tmp_path: Path
) -> None:
    job = "hung"
    path = job_file(tmp_path, job, f"train.hang_timeout={HANG_TIMEOUT}")
    env = FAULT_ENV | {faults.HANG_AT_STEP_ENV: "1:15"}
    recovered_once(pydoc_storage, path, job, env)

    run = RunPaths(Storage(pydoc_storage).run_dir(job))
    hangs = watchdog.read_hangs(run.hangs)
    stuck = [h for h in hangs if h.rank == 1]
    assert stuck, f"no hang of rank 1 recorded: {hangs}\n" + diagnosis(pydoc_storage, job)
    h = stuck[0]
    # The stuck rank's own watchdog: it finished step 15 and went no further.
    assert h.step == 15 and h.where == "after step 15"
    assert HANG_TIMEOUT <= h.no_step_s < 180 and h.timeout_s == HANG_TIMEOUT
    dump = (run.logs / h.dump).read_text()
    assert "hang_at_step" in dump and "faults.py" in dump  # the sleeping frame, with its file
    assert "most recent call first" in dump  # faulthandler's format: every thread's stack
    assert "hang: rank 1 on node" in (run.logs / "rank1.log").read_text()

    shown = run_cli("status", job, "--storage", str(pydoc_storage))
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())  # rich wraps long lines
    for h in hangs:  # each hung rank's own line: the stuck one, and any peer that waited for it
        assert f"hang: rank {h.rank} on node {h.node}: no step for {h.no_step_s:.0f} s" in text
        # Between steps the label says where it stood; inside one, after which step it was.
        at = h.where if h.where.startswith("after ") else f"after step {h.step}, last in {h.where}"
        assert f"(timeout {h.timeout_s:.0f} s) {at} (stacks in logs/{h.dump})" in text


def test_a_node_failing_preflight_stops_the_job_naming_node_and_check(
    pydoc_storage: Path, tmp_path: Path
) -> None:
    """docs/architecture.md 5: 14.2. Node 1's device computes its check matmul 1% off (fault hook);
    the job stops before its first step with one line naming node 1 and the check, in
    `status`."""
    job = "badnode"
    path = job_file(tmp_path, job, "job.max_restarts=0")
    env = FAULT_ENV | {faults.BAD_MATMUL_ENV: "1"}
    assert run_cli("launch", str(path), "--storage", str(pydoc_storage), env=env).returncode == 0
    final = wait_final(pydoc_storage, job)
    assert final.phase == "failed", diagnosis(pydoc_storage, job)
    assert final.message.startswith("node 1: preflight check matmul failed on "), final.message
    assert "relative error 1.0e-02" in final.message
    run = RunPaths(Storage(pydoc_storage).run_dir(job))
    assert not run.metrics.exists() or run.metrics.read_text() == ""  # not one step was trained
    shown = run_cli("status", job, "--storage", str(pydoc_storage))
    assert "node 1: preflight check matmul failed" in " ".join(shown.stdout.split())


def test_cancel_is_a_preemption_saved_at_the_current_step_and_resumed_from_there(
    pydoc_storage: Path, tmp_path: Path
) -> None:
    """docs/architecture.md 5: 14.3. SIGTERM (here `cancel`, as a spot interruption or an
    eviction would send it) makes every rank stop at the same step with a checkpoint of it, not
    lose the steps since the last periodic checkpoint; the next launch resumes exactly there."""
    job = "preempted"
    path = job_file(tmp_path, job, "train.max_steps=400", "train.checkpoint_every=100")
    assert (
        run_cli("launch", str(path), "--storage", str(pydoc_storage), env=FAULT_ENV).returncode == 0
    )
    wait_step(pydoc_storage, job, 13, timeout=600)
    cancelled = run_cli("cancel", job, "--storage", str(pydoc_storage), "--grace", "120")
    assert cancelled.returncode == 0, cancelled.stderr
    final = wait_final(pydoc_storage, job)
    assert final.phase == "cancelled"
    run = RunPaths(Storage(pydoc_storage).run_dir(job))
    [p] = preempt.read(run.preemptions)
    assert 13 <= p["step"] < 400 and p["checkpoint_s"] >= 0
    assert checkpoints.latest(run.checkpoints).step == p["step"], diagnosis(pydoc_storage, job)
    for rank in (0, 1):  # both ranks stopped at that step, on purpose, not killed
        assert (
            f"stopped after step {p['step']} with a checkpoint"
            in (run.logs / f"rank{rank}.log").read_text()
        )
    shown = run_cli("status", job, "--storage", str(pydoc_storage))
    assert "preemptions 1 (SIGTERM, checkpointed)" in shown.stdout

    resumed = run_cli(
        "launch",
        str(path),
        "--storage",
        str(pydoc_storage),
        "--resume",
        "--set",
        "train.steps_this_run=5",
        env=FAULT_ENV,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert wait_final(pydoc_storage, job).phase == "succeeded", diagnosis(pydoc_storage, job)
    s = summary(pydoc_storage, job)
    assert s["resumed_from"] == p["step"] and s["steps"] == p["step"] + 5 and s["preemptions"] == 1
