"""The hang watchdog end to end (issue 14.1): a real 2-node local job in which one rank stops
making progress after step 15 (fault hook: it sleeps). Its watchdog dumps the stacks and ends
it; torchrun restarts the group from the step-10 checkpoint and the job completes, long before
the process group's own timeout (180 s here, 30 min by default)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.launch.test_local import FAULT_ENV, JOB_STEPS, diagnosis, job_file, summary, wait_final
from trainmaster.storage import RunPaths, Storage
from trainmaster.train import faults, watchdog

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
HANG_TIMEOUT = 15  # a bert-tiny step takes well under a second here, even on a loaded machine


def test_hung_rank_is_dumped_and_the_job_restarts_from_its_checkpoint(
        pydoc_storage: Path, tmp_path: Path) -> None:
    job = "hung"
    path = job_file(tmp_path, job, f"train.hang_timeout={HANG_TIMEOUT}")
    env = FAULT_ENV | {faults.HANG_AT_STEP_ENV: "1:15"}
    assert run_cli("launch", str(path), "--storage", str(pydoc_storage), env=env).returncode == 0
    final = wait_final(pydoc_storage, job)
    assert final.phase == "succeeded", diagnosis(pydoc_storage, job)
    s = summary(pydoc_storage, job)
    assert s["restarts"] == 1 and s["resumed_from"] == 10 and s["steps"] == JOB_STEPS

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
        assert f"after step {h.step}, last in {h.where} (stacks in logs/{h.dump})" in text
