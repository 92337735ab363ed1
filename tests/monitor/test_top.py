"""`trainmaster top`: a real running local job (psutil), and pods of the fake Kubernetes API
whose exec runs the real probe against stand-ins for neuron-monitor and nvidia-smi."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backends.kubernetes.fake_api import FakeCluster
from tests.conftest import assert_user_error, run_cli, wait_for
from tests.monitor.conftest import job_file, last_step
from trainmaster.backends.kubernetes import top as top_k8s
from trainmaster.backends.kubernetes.volcano import LABEL_JOB
from trainmaster.monitor import runinfo
from trainmaster.run import state
from trainmaster.storage import Storage

DATA = Path(__file__).parent / "data"
GIB = 1 << 30


def table_rows(text: str) -> list[dict[str, str]]:
    """The data rows of a rich table printed with box characters, keyed by header."""
    lines = text.splitlines()
    header = next(line for line in lines if "┃" in line and "rank" in line)
    keys = [c.strip() for c in header.strip().strip("┃").split("┃")]
    rows = []
    for line in lines:
        if line.startswith("│"):
            cells = [c.strip() for c in line.strip().strip("│").split("│")]
            rows.append(dict(zip(keys, cells, strict=True)))
    return rows


@pytest.mark.slow
def test_top_once_lists_one_row_per_rank(pydoc_storage: Path, tmp_path: Path) -> None:
    store, job = pydoc_storage, "watched"
    path = job_file(tmp_path, job, "train.max_steps=100000")
    assert run_cli("launch", str(path), "--storage", str(store)).returncode == 0
    state_path = Storage(store).run_dir(job) / "state.json"
    try:
        wait_for(lambda: last_step(store, job) >= 1, 300, "the first step")
        pids = {w.rank: w.pid for w in runinfo.workers(state.read(state_path))}
        result = run_cli("top", job, "--once", "--storage", str(store))
        assert result.returncode == 0, result.stderr
    finally:
        cancel = run_cli("cancel", job, "--grace", "20", "--storage", str(store))
    assert cancel.returncode == 0, cancel.stderr
    rows = table_rows(result.stdout)
    assert sorted(r["rank"] for r in rows) == ["0", "1"], result.stdout
    assert {r["node"] for r in rows} == {"0", "1"}  # 2 nodes x 1 worker
    for r in rows:
        assert r["pid"] == str(pids[int(r["rank"])])
        assert float(r["CPU %"]) >= 0 and float(r["memory GiB"]) > 0.05  # a torch process
    assert "host: CPU" in result.stdout
    # Once the job has ended there is nothing to watch: a clear error, not an empty table.
    assert_user_error(
        run_cli("top", job, "--once", "--storage", str(store)), f"job {job} is cancelled"
    )


def test_top_unknown_job(tmp_path: Path) -> None:
    assert_user_error(run_cli("top", "nope", "--once", "--storage", str(tmp_path)), "no job 'nope'")
    assert_user_error(
        run_cli("top", "nope", "--interval", "0", "--storage", str(tmp_path)), "--interval"
    )


# --- parsers, on captured documents --------------------------------------------------------------


def test_parse_neuron_monitor_matches_runtimes_to_ranks() -> None:
    doc = json.loads((DATA / "neuron-monitor-trn1.json").read_text())
    workers = [
        {"pid": 101, "rank": 32, "local_rank": 0, "cpu_pct": 99.0, "rss": 7 * GIB},
        {"pid": 555, "rank": 33, "local_rank": 1, "cpu_pct": None, "rss": None},
    ]
    rows = {r.device: r for r in top_k8s.parse_neuron_monitor("job-worker-1", doc, workers)}
    assert set(rows) == {"nc0", "nc1"}
    nc0, nc1 = rows["nc0"], rows["nc1"]
    assert (nc0.rank, nc0.pid, nc0.cpu_pct, nc0.util_pct) == (32, 101, 99.0, 87.25)  # by pid
    assert nc0.dev_mem_used == 193986816 + 176285056 + 10737418240
    assert nc0.dev_mem_total == 16 * GIB  # 32 GiB per Trainium chip, 2 NeuronCores each
    # Runtime pid 102 is no worker the probe saw: matched by core index = local rank, and its
    # CPU and host memory come from neuron-monitor itself.
    assert (nc1.rank, nc1.local_rank, nc1.util_pct) == (33, 1, 85.5)
    assert nc1.cpu_pct == pytest.approx(50.0) and nc1.rss_bytes == 6897643264


def test_parse_nvidia_smi_rows_per_gpu() -> None:
    text = (DATA / "nvidia-smi-p5.csv").read_text()
    workers = [
        {"pid": 7, "rank": 0, "local_rank": 0, "cpu_pct": 100.0, "rss": GIB},
        {"pid": 8, "rank": 1, "local_rank": 1, "cpu_pct": 98.0, "rss": GIB},
        {"pid": 9, "rank": 3, "local_rank": 3, "cpu_pct": 1.0, "rss": GIB},
    ]
    rows = {r.device: r for r in top_k8s.parse_nvidia_smi("p", text, workers)}
    assert rows["cuda:0"].rank == 0 and rows["cuda:0"].util_pct == 97
    assert (
        rows["cuda:0"].dev_mem_used == 61234 << 20 and rows["cuda:0"].dev_mem_total == 81559 << 20
    )
    assert rows["cuda:2"].rank is None and rows["cuda:2"].util_pct is None  # [N/A], no worker
    assert rows[""].rank == 3  # a worker without a GPU row still shows


def test_parse_probe_failures_are_notes() -> None:
    out = {
        "workers": [],
        "tool": "neuron",
        "output": "",
        "error": "neuron-monitor cannot run in the pod (No such file or directory)",
    }
    (row,) = top_k8s.parse_probe("p", json.dumps(out))
    assert "cannot run" in row.note
    (row,) = top_k8s.parse_probe("p", "python: not found")
    assert "probe gave no JSON" in row.note


# --- kubernetes, through the real client against the fake API -------------------------------------


def _stub(folder: Path, name: str, body: str) -> None:
    (folder / name).write_text(f"#!/bin/sh\n{body}\n")
    (folder / name).chmod(0o755)


@pytest.fixture
def pods(fake: FakeCluster, tmp_path: Path) -> Iterator[dict[str, list[int]]]:
    """Job trn (a Neuron pod) and job gpu (a GPU pod), each with two live "worker" processes
    carrying the pod's POD_NAME, RANK and LOCAL_RANK; neuron-monitor and nvidia-smi are stubs
    that print the captured documents (neuron-monitor keeps running, like the real one)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(sys.executable, bin_dir / "python")
    procs, pids = [], {}
    for job, resource, ranks in (
        ("trn", "aws.amazon.com/neuron", (4, 5)),
        ("gpu", "nvidia.com/gpu", (0, 1)),
    ):
        pod = f"{job}-worker-1"
        fake.jobs[("default", job)] = {
            "metadata": {"name": job, "namespace": "default", "annotations": {}},
            "spec": {"tasks": [{"replicas": 2}]},
            "status": {"state": {"phase": "Running"}},
        }
        fake.add_pod("default", pod, {LABEL_JOB: job})
        fake.pods[("default", pod)]["spec"]["containers"][0]["resources"] = {
            "limits": {resource: "1"}
        }
        for local, rank in enumerate(ranks):
            env = {**os.environ, "POD_NAME": pod, "RANK": str(rank), "LOCAL_RANK": str(local)}
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", "import sys; sys.stdin.read()"],
                    stdin=subprocess.PIPE,
                    env=env,
                )
            )
        pids[job] = [p.pid for p in procs[-2:]]
    doc = json.loads((DATA / "neuron-monitor-trn1.json").read_text())
    for runtime, pid in zip(doc["neuron_runtime_data"], pids["trn"], strict=True):
        runtime["pid"] = pid
    (tmp_path / "nm.json").write_text(json.dumps(doc) + "\n")
    _stub(bin_dir, "neuron-monitor", f'cat "{tmp_path / "nm.json"}"\nexec sleep 60')
    _stub(bin_dir, "nvidia-smi", f'cat "{DATA / "nvidia-smi-p5.csv"}"')
    fake.env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    try:
        yield pids
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_top_kubernetes_neuron_pod(fake: FakeCluster, pods: dict[str, list[int]]) -> None:
    result = run_cli(
        "top", "trn", "--once", "--backend", "kubernetes", "--kubeconfig", str(fake.kubeconfig())
    )
    assert result.returncode == 0, result.stderr
    rows = {r["device"]: r for r in table_rows(result.stdout)}
    assert set(rows) == {"nc0", "nc1"}, result.stdout
    assert (rows["nc0"]["rank"], rows["nc0"]["pid"], rows["nc0"]["util %"]) == (
        "4",
        str(pods["trn"][0]),
        "87",
    )
    assert (rows["nc1"]["rank"], rows["nc1"]["pid"]) == ("5", str(pods["trn"][1]))
    assert rows["nc0"]["device memory GiB"] == "10.34 / 16.00"
    assert all(r["node"] == "trn-worker-1" and float(r["memory GiB"]) > 0 for r in rows.values())
    execs = [q for q in fake.requests if q[1].endswith("/exec")]
    assert len(execs) == 1 and execs[0][2]["command"][:2] == ["python", "-c"]


def test_top_kubernetes_gpu_pod(fake: FakeCluster, pods: dict[str, list[int]]) -> None:
    result = run_cli(
        "top", "gpu", "--once", "--backend", "kubernetes", "--kubeconfig", str(fake.kubeconfig())
    )
    assert result.returncode == 0, result.stderr
    rows = {r["device"]: r for r in table_rows(result.stdout)}
    assert [rows[f"cuda:{i}"]["rank"] for i in range(3)] == ["0", "1", "-"]
    assert rows["cuda:0"]["pid"] == str(pods["gpu"][0]) and rows["cuda:0"]["util %"] == "97"


def test_top_kubernetes_bad_input(fake: FakeCluster, pods: dict[str, list[int]]) -> None:
    kube = ["--backend", "kubernetes", "--kubeconfig", str(fake.kubeconfig())]
    assert_user_error(run_cli("top", "nope", "--once", *kube), "no job nope in namespace default")
    fake.finish("default", "trn-worker-1")
    assert_user_error(run_cli("top", "trn", "--once", *kube), "job trn has no running pods")
