"""/metrics read from a run folder (monitor/exporter.py): what rank 0 recorded, as Prometheus reads it.

The folder is written by the writers the trainer and scripts use (run/metrics.py's log_metrics,
run/goodput.py's record); the text is parsed by the official client's own parser.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trainmaster.monitor import exporter, progress, report, runinfo
from trainmaster.run import goodput, state
from trainmaster.run.metrics import RUN_DIR_ENV, log_metrics
from trainmaster.storage import RunPaths
from trainmaster.train import watchdog


def a_run(tmp_path: Path, t: float = 1_000.0) -> RunPaths:
    """Started at t: a running job's goodput runs to now, so a recent t gives a live figure."""
    run = RunPaths(tmp_path / "runs" / "demo")
    run.dir.mkdir(parents=True)
    env = {RUN_DIR_ENV: str(run.dir), "RANK": "0"}
    goodput.record(run.timeline, "start", t=t, step=0, compiles=False)
    for step in (1, 2, 3, 4):
        log_metrics(step, environ=env, loss=8.0 - step, seq_per_s=50.0, mfu=0.25, elapsed_s=step)
        goodput.record(run.timeline, "steps", t=t + step - 1, end=t + step, first=step, last=step)
    goodput.record(run.timeline, "checkpoint", t=t + 4, end=t + 4.5, step=4)
    goodput.record(run.timeline, "save", t=t + 4.5, end=t + 6.5, step=4, bytes=3_000_000)
    hang = watchdog.Hang(
        t + 9, rank=1, node=0, step=4, no_step_s=5, where="step", timeout_s=5, dump="d"
    )
    run.hangs.write_text(json.dumps(dataclasses.asdict(hang)) + "\n")  # as the watchdog writes it
    return run


def scrape(
    collector: exporter.RunCollector,
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_series_say_what_the_run_folder_holds(tmp_path: Path) -> None:
    run = a_run(tmp_path)
    got = scrape(exporter.RunCollector(run, "demo", lambda: "running"))
    me = (("job_name", "demo"), ("rank", "0"))
    assert got[("trainmaster_step", me)] == 4
    assert got[("trainmaster_loss", me)] == 4.0
    assert got[("trainmaster_seq_per_second", me)] == 50.0
    assert got[("trainmaster_mfu", me)] == 0.25
    assert got[("trainmaster_last_step_timestamp_seconds", me)] == 1_004.0
    assert got[("trainmaster_checkpoint_saves_total", me)] == 1
    assert got[("trainmaster_checkpoint_bytes_total", me)] == 3_000_000
    assert got[("trainmaster_checkpoint_standstill_seconds_total", me)] == 0.5
    assert got[("trainmaster_checkpoint_write_seconds_total", me)] == 2.0
    assert got[("trainmaster_hangs_total", me)] == 1
    assert got[("trainmaster_finished", me)] == 0
    parts = {dict(k[1])["part"]: v for k, v in got.items() if k[0] == "trainmaster_time_seconds"}
    assert set(parts) == set(goodput.KINDS) and parts["checkpoint"] == 0.5
    assert 0 < got[("trainmaster_goodput_ratio", me)] < 1
    names = {name for name, _ in got}
    assert names <= {n for s in exporter.SERIES for n in (s, s.removesuffix("_total") + "_created")}


def test_a_pod_that_does_not_hold_rank_0_serves_no_series(tmp_path: Path) -> None:
    run = a_run(tmp_path)
    assert scrape(exporter.RunCollector(run, "demo", lambda: "running", lambda: False)) == {}


def test_an_empty_run_folder_serves_the_counters_at_zero(tmp_path: Path) -> None:
    run = RunPaths(tmp_path / "runs" / "new")
    run.dir.mkdir(parents=True)
    got = scrape(exporter.RunCollector(run, "new", lambda: "pending"))
    assert ("trainmaster_step", (("job_name", "new"), ("rank", "0"))) not in got
    assert got[("trainmaster_restarts_total", (("job_name", "new"), ("rank", "0")))] == 0


def test_a_local_job_announces_its_port_for_file_sd_and_withdraws_it(tmp_path: Path) -> None:
    run = a_run(tmp_path)
    served = exporter.serve_in_background(run, "demo", lambda: "running")
    try:
        [target] = json.loads((run.dir / exporter.TARGETS).read_text())
        assert target["targets"] == [f"127.0.0.1:{served.port}"]
        with urllib.request.urlopen(f"http://{target['targets'][0]}/metrics", timeout=10) as resp:
            assert 'trainmaster_step{job_name="demo",rank="0"} 4.0' in resp.read().decode()
    finally:
        served.stop()
    assert not (run.dir / exporter.TARGETS).exists()


def test_a_relaunched_job_reads_the_same_in_status_report_and_metrics(tmp_path: Path) -> None:
    """`launch --resume` 100 s after a first launch that ended with a summary: the old summary
    is not this run's end, the restarts come from this launch's timeline while it runs (rank 0
    restarted once), and status, report and /metrics measure goodput over one window."""
    run = RunPaths(tmp_path / "runs" / "demo")
    run.dir.mkdir(parents=True)
    first, now = 1_000.0, time.time()
    second = now - 100
    goodput.record(run.timeline, "start", t=first + 5, step=0, compiles=False)
    goodput.record(run.timeline, "steps", t=first + 6, end=first + 56, first=1, last=50)
    goodput.record(run.timeline, "start", t=second + 10, step=50, compiles=False)
    goodput.record(run.timeline, "steps", t=second + 12, end=second + 30, first=51, last=60)
    goodput.record(run.timeline, "start", t=second + 40, step=60, compiles=False)  # a restart
    goodput.record(run.timeline, "steps", t=second + 45, end=second + 90, first=61, last=100)
    rows = [{"step": s, "loss": 1.0, "elapsed_s": float(s % 50 + 1)} for s in range(1, 101)]
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run.summary.write_text(json.dumps({"status": "stopped", "steps": 50, "restarts": 3}))
    os.utime(run.summary, (first + 60, first + 60))  # written as the first launch ended
    st = state.RunState(job="demo", phase="running", started_at=second)
    state.write(run.state, st)

    s = runinfo.status_of(run, st)
    assert s.summary is None and s.restarts == 1
    record = progress.of_status(s, run)
    rep = report.summarize(run, "demo", rows)
    got = scrape(exporter.RunCollector(run, "demo", lambda: "running"))
    me = (("job_name", "demo"), ("rank", "0"))
    assert got[("trainmaster_finished", me)] == 0 and got[("trainmaster_restarts_total", me)] == 1
    assert rep.restarts == 1 and rep.goodput is not None
    # Productive: steps 51-60 and 61-100 (63 s) of about 100 s since this launch.
    assert rep.goodput["productive"] == pytest.approx(63)
    assert record.goodput == pytest.approx(rep.goodput["ratio"], abs=0.01)
    assert got[("trainmaster_goodput_ratio", me)] == pytest.approx(rep.goodput["ratio"], abs=0.01)


def test_a_relaunch_still_pending_shows_nothing_of_the_launch_before(tmp_path: Path) -> None:
    """Between `launch --resume` writing state.json and the agents starting (no started_at
    yet), the earlier launch's processes and summary are not this one's: restarts stay at 0
    (a counter never goes 2 -> 0), the job is not finished, and goodput waits for a step."""
    run = RunPaths(tmp_path / "runs" / "demo")
    run.dir.mkdir(parents=True)
    for t, step in ((1_000.0, 0), (1_050.0, 20), (1_100.0, 40)):
        goodput.record(run.timeline, "start", t=t, step=step, compiles=False)
        goodput.record(run.timeline, "steps", t=t + 1, end=t + 20, first=step + 1, last=step + 20)
    run.summary.write_text(json.dumps({"status": "completed", "steps": 60, "restarts": 2}))
    os.utime(run.summary, (1_121.0, 1_121.0))
    st = state.RunState(job="demo", phase="pending", created_at=time.time() - 1)
    state.write(run.state, st)
    s = runinfo.status_of(run, st)
    assert (s.restarts, s.summary) == (0, None)
    assert progress.of_status(s, run).goodput is None
    got = scrape(exporter.RunCollector(run, "demo", lambda: "pending"))
    me = (("job_name", "demo"), ("rank", "0"))
    assert got[("trainmaster_restarts_total", me)] == 0 and got[("trainmaster_finished", me)] == 0
    assert ("trainmaster_goodput_ratio", me) not in got
    # A whole-gang retry after a lost node is job_retries, not a restart of the worker group.
    run.summary.unlink()
    again = st.model_copy(update={"phase": "running", "started_at": 1_040.0})
    assert runinfo.status_of(run, again).restarts == 1  # 2 processes since 1040
    retried = again.model_copy(update={"job_retries": 1})
    assert runinfo.status_of(run, retried).restarts == 0  # the second one was the retry
