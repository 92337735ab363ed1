"""A real network between local nodes (job.network = "netns": each node in a network namespace
of its own on a bridge) and a partition: node 1's link is cut mid-run, both nodes live on. The
hang watchdog notices the stuck collective, the workers restart, and once the link is back the
job resumes from its last checkpoint and completes. Needs root and iproute2 (CI runs as root)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from tests.backends.local.test_local import diagnosis, job_file, wait_final, wait_step
from tests.conftest import run_cli, wait_for
from trainmaster.backends.local import netns
from trainmaster.run import timeline
from trainmaster.storage import RunPaths, Storage

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None,
        reason="network namespaces need root and iproute2",
    ),
]
STEPS = 50


def test_a_partitioned_node_is_noticed_and_the_job_completes_once_the_link_is_back(
    pydoc_storage: Path, tmp_path: Path
) -> None:
    job = "partition"
    path = job_file(tmp_path, job, 'job.network="netns"', "train.hang_timeout=15",
                    f"train.max_steps={STEPS}")  # fmt: skip
    run = RunPaths(Storage(pydoc_storage).run_dir(job))
    env = {"TRAINMASTER_DIST_TIMEOUT_S": "60"}
    dry = run_cli("launch", str(path), "--storage", str(pydoc_storage), "--dry-run")
    net = netns.plan(run.dir, 2)
    assert f"ip netns exec {net.namespace(1)} " in dry.stdout and "is_host=false" in dry.stdout
    assert run_cli("launch", str(path), "--storage", str(pydoc_storage), env=env).returncode == 0
    wait_step(pydoc_storage, job, 13, 300)
    netns.set_link(net, 1, "down")  # a partition: node 1 and its processes live on
    try:
        wait_for(lambda: run.hangs.exists() and run.hangs.read_text().strip() != "", 120,
                 "the hang watchdog to notice the cut")  # fmt: skip
    finally:
        netns.set_link(net, 1, "up")
    back = time.time()
    final = wait_final(pydoc_storage, job)
    assert final.phase == "succeeded", diagnosis(pydoc_storage, job)
    summary = json.loads(run.summary.read_text())
    assert summary["steps"] == STEPS and summary["restarts"] >= 1
    after = [
        e.t for e in timeline.read(run.timeline) if isinstance(e, timeline.Steps) and e.t > back
    ]
    print(f"time to recover: {min(after) - back:.1f} s from the link's return to the next step")
    assert not [
        ns for ns in (net.namespace(0), net.namespace(1)) if Path(f"/run/netns/{ns}").exists()
    ]
