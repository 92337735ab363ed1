"""The progress record (monitor/progress.py): what `status` shows of a run, on either backend.

Built from a run folder written by the writers the trainer and scripts use (log_metrics,
goodput.record, a checkpoint folder as checkpoints publishes it).
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.monitor.test_exporter import a_run
from trainmaster import files
from trainmaster.monitor import progress
from trainmaster.run import checkpoints


def test_the_record_of_a_running_job_holds_step_rate_goodput_and_the_last_checkpoint(
    tmp_path: Path,
) -> None:
    run = a_run(tmp_path, time.time() - 10)  # 4 steps: loss 4.0, 50 seq/s, mfu 0.25; a save
    for step in (2, 4):
        folder = run.checkpoints / checkpoints.step_name(step)
        folder.mkdir(parents=True)
        files.write_json(folder / checkpoints.META, {"step": step})
    (run.checkpoints / checkpoints.temp_dir(run.checkpoints, 6).name).mkdir()  # being written
    record = progress.of_folder(run, "demo", "running")
    assert (record.step, record.loss, record.seq_per_s) == (4, 4.0, 50.0)
    assert record.last_checkpoint == 4  # not the temporary step 6
    assert record.goodput is not None and 0 < record.goodput < 1
    assert record.notes[0].startswith("step 4  loss 4  seq_per_s 50  mfu 25%")
    assert any(n.startswith(f"goodput {record.goodput:.0%} of ") for n in record.notes)
    assert any(n.endswith("last checkpoint: step 4") for n in record.notes)
    assert progress.RunProgress.from_json(record.to_json()) == record


def test_a_folder_with_nothing_yet_gives_an_empty_record(tmp_path: Path) -> None:
    run = a_run(tmp_path / "x")
    for path in (run.metrics, run.timeline, run.hangs):
        path.unlink()
    record = progress.of_folder(run, "demo", "pending")
    assert (record.step, record.goodput, record.last_checkpoint) == (None, None, None)
