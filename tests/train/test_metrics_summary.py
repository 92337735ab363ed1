"""summary.json's rates: over every trainer process of this launch, each one's first step left
out, as `report` averages them; an earlier launch's rows (perhaps on other nodes) are not in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainmaster.run import goodput
from trainmaster.storage import RunPaths
from trainmaster.train import metrics


def test_the_summary_averages_this_launchs_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = RunPaths(tmp_path / "runs" / "job")
    run.dir.mkdir(parents=True)
    goodput.record(run.timeline, "start", t=100.0, step=0)  # the launch before: 100 seq/s
    goodput.record(run.timeline, "start", t=201.0, step=10)  # this launch (at 200)
    goodput.record(run.timeline, "start", t=250.0, step=15)  # ... restarted after step 15
    earlier = [{"step": s, "seq_per_s": 100.0, "elapsed_s": float(s)} for s in range(1, 11)]
    first = [{"step": s, "seq_per_s": 40.0, "elapsed_s": float(s)} for s in range(11, 16)]
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in earlier + first))
    monkeypatch.setenv(goodput.LAUNCHED_AT_ENV, "200")
    log = metrics.MetricsLog(run, start_step=15, started=250.0, flops_per_seq=1.0,
                             peak_tflops=0.0, world=1, global_batch=100, seq_len=8).open()  # fmt: skip
    for step, step_s in ((16, 10.0), (17, 2.0), (18, 2.0), (19, 2.0), (20, 2.0)):
        log.step(step=step, loss=1.0, mlm_loss=1.0, nsp_loss=0.0, lr=1e-4, grad_norm=1.0,
                 step_s=step_s)  # fmt: skip
    log.close()
    out = log.summary(steps=20)
    # steady: 12-15 at 40 and 17-20 at 50 (11 and 16 start their processes)
    assert out["avg_seq_per_s"] == pytest.approx(45.0)
    assert out["peak_seq_per_s"] == 50.0  # not the earlier launch's 100
    assert json.loads(run.summary.read_text())["avg_seq_per_s"] == pytest.approx(45.0)
