"""The pod's first process (publish.py): the command's fate is untouched, rank 0's pod alone publishes.

Real subprocesses and signals; the API server side is on the control plane
(tests/controlplane/test_progress.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trainmaster.backends.kubernetes import publish
from trainmaster.backends.kubernetes.client import Cluster
from trainmaster.backends.kubernetes.pod_script import PUBLISH
from trainmaster.cluster import progressguard
from trainmaster.monitor.progress import RunProgress
from trainmaster.storage import RunPaths


def run_publisher(tmp_path: Path, *command: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", PUBLISH, "--run", str(tmp_path), "--job", "demo"]
        + ["--namespace", "default", "--", *command],
        env={**os.environ, "KUBECONFIG": str(tmp_path / "none"), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("code", [0, 3])
def test_the_commands_exit_code_is_the_pods(tmp_path: Path, code: int) -> None:
    proc = run_publisher(tmp_path, sys.executable, "-c", f"raise SystemExit({code})")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err


def test_a_refused_publish_is_said_once_and_changes_nothing(tmp_path: Path) -> None:
    proc = run_publisher(
        tmp_path,
        sys.executable,
        "-c",
        "import time; time.sleep(1.0)",
        POD_NAME="demo-worker-0",  # no rank0.json yet: pod 0 publishes
        TRAINMASTER_PUBLISH_S="0.05",
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.count("progress not published, and no more tries") == 1, out
    assert "no kubeconfig" in out


def test_sigterm_goes_to_the_command_and_its_end_is_the_pods(tmp_path: Path) -> None:
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(0.05)\n"
    )
    proc = run_publisher(tmp_path, sys.executable, "-c", script)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"  # its handler is set
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err


def test_only_the_pod_rank0_json_names_publishes(tmp_path: Path) -> None:
    run = RunPaths(tmp_path)
    pods = [publish.Publisher(run, "demo", f"demo-worker-{i}", no_cluster) for i in (0, 1)]
    assert [p.holds_rank0() for p in pods] == [True, False]  # before rank 0 said where it is
    run.rank0.write_text(json.dumps({"pod": "demo-worker-1", "node_rank": 1}))
    assert [p.holds_rank0() for p in pods] == [False, True]


def no_cluster() -> Cluster:
    raise AssertionError("not asked to publish")


def test_the_record_round_trips_and_anything_else_reads_as_none() -> None:
    record = RunProgress(step=3, loss=4.5, hangs=("rank 1 hung",), notes=("step 3",), at=1.0)
    assert RunProgress.from_json(record.to_json()) == record
    for text in ("", "{", "[]", json.dumps({"version": 99, "step": 1})):
        assert RunProgress.from_json(text) is None, text


def test_a_huge_metrics_row_keeps_the_record_small() -> None:
    record = RunProgress(
        step=1, metrics={"step": 1, "loss": 2.0, **{f"k{i}": i for i in range(5000)}}
    )
    text = record.to_json()
    assert len(text) < 4096 and json.loads(text)["metrics"] == {"step": 1, "loss": 2.0}


def test_the_policy_knows_the_names_the_builders_use() -> None:
    from trainmaster.backends.kubernetes import names, pod_script

    pod = names.pod_name("demo", pod_script.TASK, 7)
    assert pod == f"demo{progressguard.WORKER}7"


# A stand-in for torchrun: starts a "worker" that sleeps, writes its pid, and exits 7 once that
# worker is gone (torchrun would restart it into a new rendezvous round).
AGENT = """
import subprocess, sys
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write(str(worker.pid))
worker.wait()
raise SystemExit(7)
"""


@pytest.mark.parametrize("elastic", [False, True], ids=["fixed", "elastic"])
def test_a_peer_whose_heartbeat_stopped_ends_the_pod_or_its_workers(
    tmp_path: Path, elastic: bool
) -> None:
    """The peer watch (podpeers.py) in a real publisher: node 0 beat once long ago and the job
    makes no progress. A fixed-size job's pod ends (torchrun killed, exit EXIT_PEER_LOST) so
    that Volcano restarts the gang; an elastic job's workers alone are killed, and the command
    goes on (its own exit code is the pod's)."""
    from trainmaster.run import peers

    folder = tmp_path / "heartbeats" / "demo-0123-v0"
    folder.mkdir(parents=True)
    (folder / "node-0").write_text("5\n")
    pid_file = tmp_path / "worker.pid"
    proc = subprocess.Popen(
        [sys.executable, "-m", PUBLISH, "--run", str(tmp_path), "--job", "demo"]
        + ["--namespace", "default", "--nodes", "2", "--peer-lost-after-s", "1"]
        + (["--elastic"] if elastic else [])
        + ["--", sys.executable, "-c", AGENT, str(pid_file)],
        env={**os.environ, "KUBECONFIG": str(tmp_path / "none"), "POD_NAME": "demo-worker-1",
             "TRAINMASTER_PODGROUP": "demo-0123", "TRAINMASTER_JOB_VERSION": "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == (7 if elastic else peers.EXIT_PEER_LOST), out + err
    worker = int(pid_file.read_text())
    stat = Path(f"/proc/{worker}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"  # killed
    (hang,) = [json.loads(x) for x in (tmp_path / "hangs.jsonl").read_text().splitlines()]
    assert hang["node"] == 1 and "node 0 silent for" in hang["where"]
    from trainmaster.train.watchdog import read_hangs

    (said,) = [h.describe() for h in read_hangs(tmp_path / "hangs.jsonl")]  # as `status` says it
    assert said.startswith("node 1: no step for ") and said.endswith("(its heartbeat stopped)")
    assert (folder / "node-1").read_text().strip() == "done"  # ended: no lost node to its peers
