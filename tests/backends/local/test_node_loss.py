"""A lost node (its agent and workers SIGKILLed at once, as when an instance dies) does not
fail a local job: the supervisor stops the other nodes and starts the whole gang again under a
new rendezvous, resuming from the last checkpoint (job.max_retries), whichever node is lost,
including the one whose agent held the c10d store."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.backends.local.test_local import (
    FAULT_ENV,
    JOB_STEPS,
    diagnosis,
    job_file,
    summary,
    wait_final,
    wait_step,
)
from tests.conftest import run_cli, wait_for
from trainmaster.monitor import runinfo
from trainmaster.run import state
from trainmaster.storage import RunPaths, Storage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def lose_node(store: Path, job: str, node: int) -> state.RunState:
    """SIGKILL a node's torchrun agent (its process group) and its workers (own sessions)."""
    st = state.read(Storage(store).run_dir(job) / "state.json")
    workers = [w.pid for w in runinfo.workers(st) if w.node == node]
    assert workers, f"node {node} has a worker"
    os.killpg(st.nodes[node].pid or 0, signal.SIGKILL)
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    return st


@pytest.mark.parametrize("node", [0, 1])
def test_a_lost_node_is_a_job_retry_not_a_failure(
    pydoc_storage: Path, tmp_path: Path, node: int
) -> None:
    job = f"lost-node{node}"
    path = job_file(tmp_path, job)
    assert (
        run_cli("launch", str(path), "--storage", str(pydoc_storage), env=FAULT_ENV).returncode == 0
    )
    wait_step(pydoc_storage, job, 13, 300)
    before = lose_node(pydoc_storage, job, node)
    final = wait_final(pydoc_storage, job)
    assert final.phase == "succeeded", diagnosis(pydoc_storage, job)
    assert final.job_retries == 1
    assert (
        f"node {node} lost at step " in final.message
        and "(SIGKILL); job retry 1/3" in final.message
    )
    assert final.rendezvous["run_id"] != before.rendezvous["run_id"]  # a new rendezvous
    s = summary(pydoc_storage, job)
    assert s["status"] == "completed" and s["steps"] == JOB_STEPS and s["job_retries"] == 1
    assert s["resumed_from"] in (10, 20, 30)  # the last complete checkpoint, not step 0
    steps = [
        int(r["step"])
        for r in runinfo.read_metrics(RunPaths(Storage(pydoc_storage).run_dir(job)).metrics)
    ]
    assert steps == list(range(1, JOB_STEPS + 1))  # every step logged once
    assert s["goodput"]["restarts"] >= 1 and s["goodput"]["restart"] > 0
    shown = run_cli("status", job, "--json", "--storage", str(pydoc_storage))
    assert '"job_retries": 1' in shown.stdout


def test_no_retry_left_fails_the_job_saying_why(pydoc_storage: Path, tmp_path: Path) -> None:
    job = "lost-no-retry"
    path = job_file(tmp_path, job, "job.max_retries=0")
    assert (
        run_cli("launch", str(path), "--storage", str(pydoc_storage), env=FAULT_ENV).returncode == 0
    )
    wait_step(pydoc_storage, job, 3, 300)
    lose_node(pydoc_storage, job, 1)
    final = wait_final(pydoc_storage, job, timeout=300)
    assert final.phase == "failed" and final.job_retries == 0
    assert "node 1 lost at step" in final.message and "no job retry left" in final.message
    run = RunPaths(Storage(pydoc_storage).run_dir(job))
    wait_for(lambda: not state.live_processes(state.read(run.state)), 60, "every process to exit")


@pytest.mark.parametrize("node", [0, 1])
def test_an_elastic_job_completes_whichever_node_is_lost(
    pydoc_storage: Path, tmp_path: Path, node: int
) -> None:
    """min_nnodes = 1: a lost node leaves the other going on alone, the global batch kept by
    twice the accumulation, unless the lost agent held the c10d store (whichever agent bound
    the port first): then the rendezvous went with it and the supervisor starts the gang again
    (a job retry). Either way the job completes with every step logged once."""
    job = f"elastic-c10d-{node}"
    run = RunPaths(Storage(pydoc_storage).run_dir(job))
    path = job_file(tmp_path, job, "job.min_nnodes=1")
    assert (
        run_cli("launch", str(path), "--storage", str(pydoc_storage), env=FAULT_ENV).returncode == 0
    )
    wait_step(pydoc_storage, job, 13, 300)
    lose_node(pydoc_storage, job, node)
    said: list[str] = []

    def on_one_node_or_retried() -> bool:
        st = state.read(run.state)
        said.append(run_cli("status", job, "--storage", str(pydoc_storage)).stdout)
        return "runs on 1 of 2 nodes" in said[-1] or st.job_retries > 0 or st.phase in state.FINAL

    wait_for(on_one_node_or_retried, 180, "the job to go on with one node or to retry")
    final = wait_final(pydoc_storage, job)
    assert final.phase == "succeeded", diagnosis(pydoc_storage, job)
    s = summary(pydoc_storage, job)
    assert s["steps"] == JOB_STEPS and s["global_batch_size"] == 32  # what the job file says
    if final.job_retries == 0:  # went on alone
        assert (s["world_size"], s["grad_accum"]) == (1, 2)
        assert any(f"runs on 1 of 2 nodes (node {node} gone)" in t for t in said)
    else:  # the store went with the lost node
        assert (s["world_size"], s["grad_accum"], final.job_retries) == (2, 1, 1)
    steps = [int(r["step"]) for r in runinfo.read_metrics(run.metrics)]
    assert steps == list(range(1, JOB_STEPS + 1))  # every step logged once
