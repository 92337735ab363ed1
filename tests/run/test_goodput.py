"""Goodput end to end (docs/architecture.md 5: 14.4, 14.5): a real 2-node local job, one worker
SIGKILLed between checkpoints (fault injection), then `report` and summary.json account for the
time it cost."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.backends.local.test_local import FAULT_ENV, job_file, recovered_once
from tests.conftest import run_cli
from trainmaster.monitor import report
from trainmaster.run import goodput
from trainmaster.storage import Storage
from trainmaster.train import faults

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
PARTS = ("startup", "compile", "productive", "lost", "checkpoint", "restart")


def test_report_and_summary_account_for_a_killed_worker(
    pydoc_storage: Path, tmp_path: Path
) -> None:
    job = "goodput"
    path = job_file(tmp_path, job)  # 40 steps, a checkpoint every 10
    # Rank 1 dies right after step 15: steps 11-15 are redone from the step-10 checkpoint.
    env = FAULT_ENV | {faults.KILL_AT_STEP_ENV: "1:15"}
    s = recovered_once(pydoc_storage, path, job, env)
    # Node preflight (docs/architecture.md 5: 14.2) ran on both nodes, for real, and passed.
    assert [n["node"] for n in s["preflight"]] == [0, 1]
    assert all(c["ok"] for n in s["preflight"] for c in n["checks"])
    assert {"device", "matmul", "all_reduce", "disk", "shm"} <= {
        c["name"] for c in s["preflight"][1]["checks"]
    }

    g = s["goodput"]
    assert g["steps_lost"] == 5 and g["restarts"] == 1
    assert g["lost"] > 0 and g["restart"] > 0 and g["startup"] > 0 and g["checkpoint"] > 0
    assert 0 < g["ratio"] < 1 and g["ratio"] == pytest.approx(g["productive"] / g["wall"], abs=1e-3)
    assert sum(g[k] for k in goodput.KINDS) == pytest.approx(g["wall"], abs=0.01)
    saves = s["checkpoint_saves"]  # step 10 before the kill; 20, 30, 40 after it
    assert saves["count"] == 4 and saves["max_s"] > 0 and saves["mb_per_s"] > 0
    # 10, 20 and 30 while training; 40 is the end's (the trainer marks the wait for its write)
    assert saves["per_save_blocked_s"] > 0 and saves["final_wait_s"] > 0
    assert saves["blocked_s"] >= saves["final_wait_s"] + saves["per_save_blocked_s"] - 0.002

    result = run_cli("report", job, "--storage", str(pydoc_storage))
    assert result.returncode == 0, result.stderr
    rep = report.make_report(Storage(pydoc_storage), job)
    assert rep.goodput is not None
    assert rep.saves is not None and "s per save" in report.standstill(rep.saves)
    # The same function over the same events: the parts agree with the summary's; the report
    # runs on to the end state.json records (the trainers' exit), so its wall is longer.
    for part in PARTS:
        assert rep.goodput[part] == pytest.approx(g[part], abs=2e-3), part
    assert rep.goodput["steps_lost"] == 5 and rep.goodput["wall"] >= g["wall"]
    # The rates too: over both trainer processes, each one's first step left out, in both.
    assert rep.avg_seq_per_s == pytest.approx(s["avg_seq_per_s"], abs=1e-3)
    assert rep.restarts == s["restarts"] == 1
    assert rep.goodput["wall"] == pytest.approx(rep.wall_s, abs=1e-3)
    printed = re.search(r"goodput\s*│\s*([\d.]+)%", result.stdout)
    assert printed, result.stdout
    assert 0 < float(printed[1]) < 100
    assert float(printed[1]) == pytest.approx(100 * rep.goodput["ratio"], abs=0.11)
    assert re.search(r"steps lost\s*│\s*[\d.]+ s \([\d.]+%\), 5 steps redone", result.stdout)
    assert re.search(r"checkpoint saves\s*│\s*4, ", result.stdout)

    # report.png: below the metric panels, the timeline bar shows useful, lost and restart time.
    assert rep.png is not None and rep.timeline is not None
    x0, y0, x1, y1 = rep.timeline
    assert y0 > max(b[3] for b in rep.panels)
    bar = np.asarray(Image.open(rep.png).convert("RGB")).astype(int)[y0:y1, x0:x1]
    for kind in ("productive", "lost", "restart", "startup"):
        rgb = np.array([int(report.COLOURS[kind][i : i + 2], 16) for i in (1, 3, 5)])
        assert (np.abs(bar - rgb).sum(axis=2) < 12).sum() > 20, kind
