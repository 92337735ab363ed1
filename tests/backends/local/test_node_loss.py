"""A lost node (its agent and workers SIGKILLed at once, as when an instance dies) does not
fail a local job: the supervisor stops the other nodes and starts the whole gang again under a
new rendezvous, resuming from the last checkpoint (job.max_retries), whichever node is lost,
including the one whose agent held the c10d store. An elastic job goes on and takes the lost
node back (backends/local/rejoin.py)."""

from __future__ import annotations

import contextlib
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
from trainmaster.run import checkpoints, state
from trainmaster.storage import RunPaths, Storage
from trainmaster.train.model import DROPOUT_ENV

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
    # the evidence the resume needs, not a step count: on a busy machine step 13 can come
    # before the step-10 checkpoint's write is complete, and then the job rightly starts at 0
    folder = RunPaths(Storage(pydoc_storage).run_dir(job)).checkpoints
    wait_for(lambda: checkpoints.latest(folder) is not None, 300, "a complete checkpoint")
    saved = checkpoints.latest(folder)
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
    # the last complete checkpoint at the loss (or a later one the workers finished), not step 0
    assert saved is not None and s["resumed_from"] in (10, 20, 30)
    assert s["resumed_from"] >= saved.step
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


def store_holder(st: state.RunState) -> int:
    """The node whose agent hosts the c10d store: it owns the socket listening on the
    rendezvous port (whichever agent bound it first)."""
    port = int(st.rendezvous["endpoint"].rpartition(":")[2])
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] == "0A" and int(cols[1].rpartition(":")[2], 16) == port:
                inodes.add(f"socket:[{cols[9]}]")
    for n in st.nodes:
        for fd in Path(f"/proc/{n.pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) in inodes:
                    return n.index
    raise AssertionError(f"no agent listens on port {port}")


EXACT_ENV = FAULT_ENV | {DROPOUT_ENV: "0"}  # no dropout: equal parameters are decidable


@pytest.fixture(scope="module")
def uninterrupted(pydoc_storage: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The parameter checksum of the elastic job's shape run without a fault."""
    path = job_file(tmp_path_factory.mktemp("elastic-straight"), "elastic-straight",
                    "job.min_nnodes=1")  # fmt: skip
    args = ("launch", str(path), "--storage", str(pydoc_storage), "--follow")
    assert run_cli(*args, env=EXACT_ENV, timeout=600).returncode == 0
    assert wait_final(pydoc_storage, "elastic-straight").phase == "succeeded"
    return str(summary(pydoc_storage, "elastic-straight")["param_checksum"])


def ran_alone(run: RunPaths) -> bool:
    """Whether some trainer of the run started on one node (each says its accumulation)."""
    return any("x grad_accum 2 =" in log.read_text() for log in run.logs.glob("rank*.log"))


@pytest.mark.parametrize("lose", ["other", "store"])
def test_an_elastic_job_takes_a_lost_node_back(
    pydoc_storage: Path, tmp_path: Path, lose: str, uninterrupted: str
) -> None:
    """min_nnodes = 1: the survivor goes on (torchrun re-forms the group) and the supervisor
    starts the lost node's agent again with the same rendezvous; the next round admits it and
    the job ends on 2 of 2 nodes with the job file's global batch. When the lost agent held the
    c10d store the rendezvous went with it: the supervisor starts the gang again (a job retry).
    Either way the job completes with every step logged once, and with the parameters of the
    uninterrupted run unless a trainer ran on one node in between (here the node is usually
    back before: then two micro-batches on one rank replace an all-reduce over two, and the
    sums round differently)."""
    job = f"elastic-back-{lose}"
    run = RunPaths(Storage(pydoc_storage).run_dir(job))
    path = job_file(tmp_path, job, "job.min_nnodes=1")
    assert (
        run_cli("launch", str(path), "--storage", str(pydoc_storage), env=EXACT_ENV).returncode == 0
    )
    wait_step(pydoc_storage, job, 13, 300)
    holder = store_holder(state.read(run.state))
    node = holder if lose == "store" else 1 - holder
    before = lose_node(pydoc_storage, job, node)
    said: list[str] = []

    def back_or_retried() -> bool:
        st = state.read(run.state)
        said.append(run_cli("status", job, "--storage", str(pydoc_storage)).stdout)
        return "back at step" in st.message or st.job_retries > 0 or st.phase in state.FINAL

    wait_for(back_or_retried, 300, "the node back, or a job retry")
    final = wait_final(pydoc_storage, job)
    assert final.phase == "succeeded", diagnosis(pydoc_storage, job)
    s = summary(pydoc_storage, job)
    assert s["steps"] == JOB_STEPS and s["global_batch_size"] == 32  # what the job file says
    assert (s["world_size"], s["grad_accum"]) == (2, 1)  # it ended on both nodes
    if lose == "other":  # taken back into the running job, same rendezvous
        assert final.job_retries == 0 and final.nodes[node].rejoins == 1
        assert final.rendezvous["run_id"] == before.rendezvous["run_id"]
        assert f"node {node} lost at step " in final.message, final.message
        assert "(SIGKILL), back at step " in final.message
        assert final.message.endswith("completed on 2 of 2 nodes"), final.message
        assert any("(SIGKILL), back at step" in t and "runs on 2 of 2 nodes" in t for t in said)
    else:  # the store went with the lost node
        assert final.job_retries == 1 and final.nodes[node].rejoins == 0
        assert f"node {node} lost at step " in final.message and "job retry 1/3" in final.message
    steps = [int(r["step"]) for r in runinfo.read_metrics(run.metrics)]
    assert steps == list(range(1, JOB_STEPS + 1))  # every step logged once
    if not ran_alone(run):
        assert s["param_checksum"] == uninterrupted  # bit for bit


def test_an_elastic_job_without_rejoins_left_goes_on_alone(
    pydoc_storage: Path, tmp_path: Path
) -> None:
    """job.max_retries = 0: the lost node (not the store's) is not taken back; the survivor
    finishes alone with twice the accumulation, the global batch unchanged."""
    job = "elastic-alone"
    run = RunPaths(Storage(pydoc_storage).run_dir(job))
    path = job_file(tmp_path, job, "job.min_nnodes=1", "job.max_retries=0")
    assert (
        run_cli("launch", str(path), "--storage", str(pydoc_storage), env=FAULT_ENV).returncode == 0
    )
    wait_step(pydoc_storage, job, 13, 300)
    node = 1 - store_holder(state.read(run.state))
    lose_node(pydoc_storage, job, node)
    said: list[str] = []

    def on_one_node() -> bool:
        said.append(run_cli("status", job, "--storage", str(pydoc_storage)).stdout)
        return "runs on 1 of 2 nodes" in said[-1] or state.read(run.state).phase in state.FINAL

    wait_for(on_one_node, 180, "the job to go on with one node")
    final = wait_final(pydoc_storage, job)
    assert final.phase == "succeeded", diagnosis(pydoc_storage, job)
    assert any(f"runs on 1 of 2 nodes (node {node} gone)" in t for t in said)
    assert "not taken back: 0/0 used (job.max_retries)" in final.message, final.message
    s = summary(pydoc_storage, job)
    assert s["steps"] == JOB_STEPS and s["global_batch_size"] == 32
    assert (s["world_size"], s["grad_accum"], final.job_retries) == (1, 2, 0)
    steps = [int(r["step"]) for r in runinfo.read_metrics(run.metrics)]
    assert steps == list(range(1, JOB_STEPS + 1))  # every step logged once


def test_a_cancelled_elastic_job_takes_no_node_back(pydoc_storage: Path, tmp_path: Path) -> None:
    """Agents that `cancel` ends (SIGTERM, SIGKILL after the grace) are not lost nodes."""
    job = "elastic-cancel"
    run = RunPaths(Storage(pydoc_storage).run_dir(job))
    path = job_file(tmp_path, job, "job.min_nnodes=1")
    assert run_cli("launch", str(path), "--storage", str(pydoc_storage)).returncode == 0
    wait_step(pydoc_storage, job, 3, 300)
    assert run_cli("cancel", job, "--storage", str(pydoc_storage)).returncode == 0
    final = wait_final(pydoc_storage, job, timeout=120)
    assert final.phase == "cancelled" and final.job_retries == 0
    assert [n.rejoins for n in final.nodes] == [0, 0] and "lost" not in final.message
    wait_for(lambda: not state.live_processes(state.read(run.state)), 60, "every process to exit")


def test_a_cancel_that_ends_the_store_holder_first_loses_no_node(
    pydoc_storage: Path, tmp_path: Path
) -> None:
    """`cancel` records itself, then signals the agents one after another: the agent holding
    the c10d store may end first and the other then fails to reach the rendezvous (exit 1).
    Both ends are the cancel's, not lost nodes: no job retry, no node taken back."""
    job = "elastic-cancel-store"
    run = RunPaths(Storage(pydoc_storage).run_dir(job))
    path = job_file(tmp_path, job, "job.min_nnodes=1")
    assert run_cli("launch", str(path), "--storage", str(pydoc_storage)).returncode == 0
    wait_step(pydoc_storage, job, 3, 300)
    state.update(run.state, cancel_requested=True)  # what `cancel` writes before any signal
    lose_node(pydoc_storage, job, store_holder(state.read(run.state)))
    assert run_cli("cancel", job, "--storage", str(pydoc_storage)).returncode == 0
    final = wait_final(pydoc_storage, job, timeout=120)
    assert (final.phase, final.job_retries) == ("cancelled", 0), final.message
    assert [n.rejoins for n in final.nodes] == [0, 0] and "lost" not in final.message
