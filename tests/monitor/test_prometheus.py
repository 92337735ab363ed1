"""A real Prometheus (Debian's 2.42) scrapes a real local job and PromQL sees its steps advance.

The job is the demo's shape (bert-tiny, 2 nodes x 1 worker on CPU); its supervisor serves
/metrics on a free port named in RUN/prometheus-targets.json (monitor/exporter.py), which the
Prometheus configuration reads through file_sd_configs, as a user would point theirs at it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.backends.local.test_local import job_file, wait_final, wait_step
from tests.conftest import run_cli, wait_for
from trainmaster.backends.local.rendezvous import free_port
from trainmaster.monitor import exporter
from trainmaster.storage import Storage

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        shutil.which("prometheus") is None,
        reason="needs prometheus (make system-deps: apt-get install prometheus)",
    ),
]


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(its URL, the targets file it watches): a Prometheus scraping every second."""
    targets = tmp_path / "targets.json"
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(  # YAML is a superset of JSON
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "trainmaster",
                        "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
                    }
                ],
            }
        )
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url), 60, "Prometheus to answer")
        yield url, targets
    finally:
        proc.terminate()
        proc.wait(30)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def query(url: str, promql: str) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10) as resp:
        answer = json.loads(resp.read())
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def test_prometheus_scrapes_a_running_job_and_promql_sees_the_steps_advance(
    pydoc_storage: Path, tmp_path: Path, prometheus: tuple[str, Path]
) -> None:
    url, targets = prometheus
    job = "scraped"
    path = job_file(tmp_path, job, "train.max_steps=100000")
    assert run_cli("launch", str(path), "--storage", str(pydoc_storage)).returncode == 0
    run = Storage(pydoc_storage).run_dir(job)
    try:
        wait_step(pydoc_storage, job, 2, 300)
        shutil.copy(run / exporter.TARGETS, targets)  # where a user's file_sd would look
        rate = f'deriv(trainmaster_step{{job_name="{job}"}}[20s])'
        wait_for(
            lambda: any(float(r["value"][1]) > 0 for r in query(url, rate)),
            120,
            "Prometheus to see the step advance",
        )
        steps = query(url, f'trainmaster_step{{job_name="{job}",rank="0"}}')
        assert len(steps) == 1 and float(steps[0]["value"][1]) >= 2
        names = {r["metric"]["__name__"] for r in query(url, f'{{job_name="{job}"}}')}
        expected = {"trainmaster_step", "trainmaster_loss", "trainmaster_seq_per_second"}
        expected |= {"trainmaster_goodput_ratio", "trainmaster_checkpoint_saves_total"}
        assert expected <= names, names
        assert names <= set(exporter.SERIES), names - set(exporter.SERIES)
    finally:
        run_cli("cancel", job, "--grace", "20", "--storage", str(pydoc_storage))
    wait_final(pydoc_storage, job)
    assert not (run / exporter.TARGETS).exists()  # an ended job is no target any more
