"""status and report read a custom script's metrics.jsonl (any keys beside `step`), and still
show phase, restarts and cost when it writes none (docs/architecture.md 3.8). Run folders are
written here as launch and the shim (launch/entry.py) write them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import assert_user_error, run_cli
from trainmaster import api
from trainmaster.config import jobfile
from trainmaster.monitor import progress, report, runinfo
from trainmaster.run import goodput, state
from trainmaster.storage import RunPaths, Storage


def custom_run(
    store: Path,
    job: str,
    rows: list[dict] | None,
    *,
    phase: str = "succeeded",
    entrypoint: str = "train.py",
) -> RunPaths:
    run = RunPaths(Storage(store).run_dir(job))
    run.logs.mkdir(parents=True)
    cfg = api.preset_job("local-cpu", [f'job.name="{job}"', f'job.entrypoint="{entrypoint}"'])
    run.job_toml.write_text(jobfile.render(cfg, "test"))
    run.state.write_text(
        state.RunState(
            job=job, phase=phase, started_at=1000.0, finished_at=1600.0, nnodes=2
        ).model_dump_json()
    )
    run.rank0.write_text(json.dumps({"pid": 1, "restarts": 2, "run_id": "x", "starts": 3}))
    if rows is not None:
        run.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 99, "lo')
    return run


ROWS = [
    {
        "step": s,
        "loss": 5.0 - s / 10,
        "tokens_per_s": 800.0 + s,
        "accuracy": s / 40,
        "note": "text",
        "max_steps": 40,
        "elapsed_s": float(s),
    }
    for s in range(1, 31)
]


def test_status_shows_what_the_rows_have(tmp_path: Path) -> None:
    custom_run(tmp_path, "gpt", ROWS, phase="running")
    s = runinfo.status(Storage(tmp_path), "gpt")
    assert (
        s.max_steps == 40 and s.last is not None and s.last["step"] == 30
    )  # the torn line skipped
    assert runinfo.progress_text(s) == (
        "step 30/40  loss 2  tokens_per_s 830  accuracy 0.75  note text  restarts 2"
    )


def test_status_without_metrics_still_has_phase_and_restarts(tmp_path: Path) -> None:
    custom_run(tmp_path, "quiet", None)
    s = runinfo.status(Storage(tmp_path), "quiet")
    assert s.last is None and s.max_steps is None and s.state.phase == "succeeded"
    assert runinfo.progress_text(s) == "restarts 2"


def test_builtin_rows_keep_their_order_and_max_steps(tmp_path: Path) -> None:
    rows = [
        {
            "step": 3,
            "loss": 1.5,
            "mlm_loss": 1.0,
            "nsp_loss": 0.5,
            "lr": 1e-3,
            "grad_norm": 0.7,
            "seq_per_s": 51.25,
            "tokens_per_s": 6560.0,
            "mfu": None,
            "elapsed_s": 3.0,
        }
    ]
    custom_run(tmp_path, "bert", rows, entrypoint="-m trainmaster.train")
    s = runinfo.status(Storage(tmp_path), "bert")
    assert (
        runinfo.progress_text(s)
        == "step 3/200  loss 1.5  seq_per_s 51.25  lr 0.001  grad_norm 0.7  restarts 2"
    )


def test_report_plots_a_custom_scripts_values(tmp_path: Path) -> None:
    run = custom_run(tmp_path, "gpt", ROWS)
    assert report.panels_for(ROWS) == (
        ("loss", "loss"),
        ("tokens_per_s", "throughput (tokens/s)"),
        ("accuracy", "accuracy"),
    )
    rep = report.make_report(Storage(tmp_path), "gpt")
    assert (rep.steps, rep.max_steps, rep.restarts, rep.final_loss) == (
        30,
        40,
        2,
        pytest.approx(2.0),
    )
    assert rep.avg_seq_per_s is None and rep.wall_s == 600.0
    img = np.asarray(Image.open(run.report_png).convert("RGB")).astype(int)
    for x0, y0, x1, y1 in rep.panels:  # every panel has a curve (C0 blue) in it
        blue = (np.abs(img[y0:y1, x0:x1] - [31, 119, 180]).max(axis=2) < 40).sum()
        assert blue > 50


def test_report_without_metrics(tmp_path: Path) -> None:
    """A custom script need not log: the table still says phase, restarts, wall time, cost."""
    run = custom_run(tmp_path, "quiet", None)
    result = run_cli("report", "quiet", "--storage", str(tmp_path))
    assert result.returncode == 0, result.stderr
    for text in ("succeeded", "restarts", "10m00s", "none: no metrics.jsonl rows"):
        assert text in result.stdout
    assert not run.report_png.exists()
    # The built-in trainer before its first step is still "no metrics yet".
    custom_run(tmp_path, "bert", None, phase="pending", entrypoint="-m trainmaster.train")
    assert_user_error(
        run_cli("report", "bert", "--storage", str(tmp_path)), "job bert has no metrics yet"
    )


def test_a_scripts_checkpoints_show_in_status_and_report(tmp_path: Path) -> None:
    """A script's step_N folders carry no meta file (worker.checkpoint_saved publishes them by
    a rename): status names the newest; its saves are its checkpoint_saved calls, which write
    no background-write events, and report counts them."""
    run = custom_run(tmp_path, "gpt", ROWS, phase="running")
    for step in (20, 40):
        (run.checkpoints / f"step_{step}").mkdir(parents=True)
    (run.checkpoints / ".tmp-step_60").mkdir()  # being written
    for step, t in ((20, 1020.0), (40, 1040.0)):
        goodput.record(run.timeline, "checkpoint", t=t, end=t + 0.5, step=step, saved=True)
    record = progress.of_status(runinfo.status(Storage(tmp_path), "gpt"), run)
    assert record.last_checkpoint == 40
    assert any(n.endswith("last checkpoint: step 40") for n in record.notes)
    rep = report.summarize(run, "gpt", ROWS)
    assert rep.saves is not None and rep.saves["count"] == 2
    row = dict(rep.goodput_rows())["checkpoint saves"]
    assert row == "2; training stood still 0.50 s per save (at most 0.50 s)"
