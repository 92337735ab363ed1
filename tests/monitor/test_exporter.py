"""/metrics read from a run folder (monitor/exporter.py): what rank 0 recorded, as Prometheus reads it.

The folder is written by the writers the trainer and scripts use (run/metrics.py's log_metrics,
run/goodput.py's record); the text is parsed by the official client's own parser.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trainmaster.monitor import exporter
from trainmaster.run import goodput
from trainmaster.run.metrics import RUN_DIR_ENV, log_metrics
from trainmaster.storage import RunPaths
from trainmaster.train import watchdog


def a_run(tmp_path: Path) -> RunPaths:
    run = RunPaths(tmp_path / "runs" / "demo")
    run.dir.mkdir(parents=True)
    env = {RUN_DIR_ENV: str(run.dir), "RANK": "0"}
    t = 1_000.0
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
