"""The local backend end to end: real torchrun agents, real rendezvous, real signals.

Each test launches `trainmaster launch` as a user would and waits on conditions (state.json,
metrics.jsonl), never on fixed sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import assert_user_error, etcd_available, run_cli, wait_for
from trainmaster.backends.local import rendezvous
from trainmaster.monitor import runinfo
from trainmaster.run import export, state
from trainmaster.storage import RunPaths, Storage

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
needs_etcd = pytest.mark.skipif(
    not etcd_available(), reason="etcd not installed (apt-get install etcd-server)"
)

JOB_STEPS = 40
# Fault tests: a collective left waiting on a dead peer fails after 180 s (default 1800) and
# torchrun restarts it, instead of outlasting the test's wait.
FAULT_ENV = {"TRAINMASTER_DIST_TIMEOUT_S": "180"}


def job_file(tmp_path: Path, name: str, *extra: str) -> Path:
    """The demo's shape (bert-tiny, 2 nodes x 1 worker), short, checkpointing every 10 steps."""
    path = tmp_path / f"{name}.toml"
    # max_restarts 6: room for a slow machine; the fault tests below expect exactly one.
    # rendezvous.timeout 180 (default 600): a stuck rendezvous fails well within the test's wait.
    sets = [
        f'job.name="{name}"',
        f"train.max_steps={JOB_STEPS}",
        "train.warmup_steps=5",
        "job.max_restarts=6",
        "rendezvous.timeout=180",
        "train.checkpoint_every=10",
        "train.keep_checkpoints=3",
        *extra,
    ]
    args = ["init", "--preset", "local-cpu", "--out", str(path)]
    for s in sets:
        args += ["--set", s]
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    return path


def diagnosis(store: Path, job: str, lines: int = 25) -> str:
    """state.json and the tail of every log of a run: what CI prints when a job does not end."""
    run = Storage(store).run_dir(job)
    parts = [(run / "state.json").read_text() if (run / "state.json").exists() else "no state.json"]
    for log in sorted((run / "logs").glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {log.name}\n" + "\n".join(tail))
    return "\n".join(parts)


def wait_job(store: Path, job: str, cond: Callable[[], bool], timeout: float, what: str) -> None:
    try:
        wait_for(cond, timeout, f"{job}: {what}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnosis(store, job)}") from None


def wait_final(store: Path, job: str, timeout: float = 600) -> state.RunState:
    path = Storage(store).run_dir(job) / "state.json"
    wait_job(store, job, lambda: state.observed(path).phase in state.FINAL, timeout, "the end")
    return state.read(path)


def wait_step(store: Path, job: str, step: int, timeout: float) -> None:
    wait_job(store, job, lambda: last_step(store, job) >= step, timeout, f"step {step}")


def last_step(store: Path, job: str) -> int:
    rows = runinfo.read_metrics(Storage(store).run_dir(job) / "metrics.jsonl")
    return int(rows[-1]["step"]) if rows else 0


def summary(store: Path, job: str) -> dict:
    return json.loads((Storage(store).run_dir(job) / "summary.json").read_text())


def recovered_once(store: Path, path: Path, job: str, env: dict[str, str]) -> dict:
    """Launch a job whose fault hook (env) strikes once between checkpoints 10 and 20; it must
    end succeeded after exactly one restart from step 10. Returns its summary."""
    assert run_cli("launch", str(path), "--storage", str(store), env=env).returncode == 0
    final = wait_final(store, job)
    assert final.phase == "succeeded", diagnosis(store, job)
    s = summary(store, job)
    assert s["restarts"] == 1 and s["resumed_from"] == 10 and s["steps"] == JOB_STEPS
    return s


def no_processes_left(st: state.RunState) -> bool:
    pids = [n.pid for n in st.nodes] + [st.supervisor_pid, st.etcd_pid]
    return not any(state.pid_alive(p) for p in pids if p)


@pytest.fixture(scope="module")
def straight(pydoc_storage: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One uninterrupted 2-node c10d job; other tests compare against it."""
    tmp = tmp_path_factory.mktemp("straight")
    path = job_file(tmp, "straight")
    result = run_cli("launch", str(path), "--storage", str(pydoc_storage), "--follow", timeout=600)
    assert result.returncode == 0, result.stderr
    st = wait_final(pydoc_storage, "straight")
    assert st.phase == "succeeded" and no_processes_left(st)
    return summary(pydoc_storage, "straight")


def test_two_node_c10d_job_completes(straight: dict) -> None:
    assert straight["status"] == "completed" and straight["steps"] == JOB_STEPS
    assert straight["world_size"] == 2 and straight["restarts"] == 0


@needs_etcd
def test_two_node_job_with_private_etcd(
    pydoc_storage: Path, tmp_path: Path, straight: dict
) -> None:
    path = job_file(tmp_path, "with-etcd", 'rendezvous.backend="etcd"')
    result = run_cli("launch", str(path), "--storage", str(pydoc_storage), "--follow", timeout=600)
    assert result.returncode == 0, result.stderr
    st = wait_final(pydoc_storage, "with-etcd")
    assert st.phase == "succeeded" and st.private_etcd
    assert no_processes_left(st)  # the private etcd is stopped too
    # Same config, same data, same seed: rendezvous does not change the result.
    assert summary(pydoc_storage, "with-etcd")["final_loss"] == pytest.approx(
        straight["final_loss"], rel=1e-4
    )


@needs_etcd
def test_two_node_job_with_external_etcd(pydoc_storage: Path, tmp_path: Path) -> None:
    proc, endpoint = rendezvous.start_private_etcd(tmp_path / "etcd", tmp_path / "etcd.log", 30)
    try:
        path = job_file(
            tmp_path,
            "ext-etcd",
            'rendezvous.backend="etcd"',
            f'rendezvous.endpoint="{endpoint}"',
            "train.max_steps=12",
        )
        result = run_cli(
            "launch", str(path), "--storage", str(pydoc_storage), "--follow", timeout=600
        )
        assert result.returncode == 0, result.stderr
        assert wait_final(pydoc_storage, "ext-etcd").rendezvous["endpoint"] == endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_status_logs_cancel_from_other_processes(pydoc_storage: Path, tmp_path: Path) -> None:
    path = job_file(tmp_path, "long", "train.max_steps=100000", "train.warmup_steps=5")
    result = run_cli("launch", str(path), "--storage", str(pydoc_storage))
    assert result.returncode == 0, result.stderr  # returns at once with the job id
    assert result.stdout.startswith("local://long  ")  # the job's handle
    wait_step(pydoc_storage, "long", 11, 300)  # a checkpoint exists
    status = run_cli("status", "long", "--storage", str(pydoc_storage))
    assert status.returncode == 0, status.stderr
    assert "phase running" in status.stdout and "ETA" in status.stdout
    assert all(f"\n {r} " in status.stdout or f"│ {r} " in status.stdout for r in ("0", "1"))
    as_json = run_cli("status", "local://long", "--json", "--storage", str(pydoc_storage))
    data = json.loads(as_json.stdout)
    assert (data["job"], data["backend"], data["handle"], data["phase"]) == (
        "long",
        "local",
        "local://long",
        "running",
    )
    assert [n["index"] for n in data["nodes"]] == [0, 1] and all(n["pid"] for n in data["nodes"])
    assert sorted(w["rank"] for w in data["workers"]) == [0, 1]
    assert [n["rank0"] for n in data["nodes"]].count(True) == 1  # rank0.json names its node
    assert (
        data["step"] >= 11
        and data["max_steps"] > data["step"]
        and data["metrics"]["step"] == data["step"]
    )
    assert data["loss"] is not None and data["eta_s"] is not None
    workers_before = [
        w.pid
        for w in runinfo.workers(state.read(Storage(pydoc_storage).run_dir("long") / "state.json"))
    ]
    assert len(workers_before) == 2
    logs = run_cli("logs", "long", "--storage", str(pydoc_storage))
    assert logs.returncode == 0 and "rank 0" in logs.stdout
    cancel = run_cli("cancel", "long", "--grace", "20", "--storage", str(pydoc_storage))
    assert cancel.returncode == 0 and "cancelled" in cancel.stdout, cancel.stderr
    st = state.read(Storage(pydoc_storage).run_dir("long") / "state.json")
    assert st.phase == "cancelled" and no_processes_left(st)
    assert not any(state.pid_alive(w) for w in workers_before)  # workers too, not only agents
    ckpts = sorted((Storage(pydoc_storage).run_dir("long") / "checkpoints").glob("step_*"))
    assert ckpts, "the last checkpoint is kept"
    again = run_cli("status", "long", "--storage", str(pydoc_storage))
    assert "phase cancelled" in again.stdout


def test_killed_worker_is_restarted_and_resumes(
    pydoc_storage: Path, tmp_path: Path, straight: dict
) -> None:
    path = job_file(tmp_path, "killed")
    assert (
        run_cli("launch", str(path), "--storage", str(pydoc_storage), env=FAULT_ENV).returncode == 0
    )
    wait_step(pydoc_storage, "killed", 13, 600)
    # The step-10 checkpoint is written by a separate process while training goes on: the
    # kill must come after it is published, or there is nothing to resume from (by design).
    run = RunPaths(Storage(pydoc_storage).run_dir("killed"))
    wait_for(lambda: max(export.checkpoints(run), default=0) >= 10, 600, "checkpoint 10")
    st = state.read(Storage(pydoc_storage).run_dir("killed") / "state.json")
    victims = [w for w in runinfo.workers(st) if w.rank == 1]
    assert victims, "rank 1 is running"
    os.kill(victims[0].pid, signal.SIGKILL)
    final = wait_final(pydoc_storage, "killed")
    assert final.phase == "succeeded"
    s = summary(pydoc_storage, "killed")
    # Exactly one restart: the restarted workers meet in a fresh store (torchrun.AGENT_ENV).
    assert s["restarts"] == 1 and s["steps"] == JOB_STEPS
    assert s["resumed_from"] is not None and s["resumed_from"] >= 10  # not step 0
    assert s["final_loss"] == pytest.approx(straight["final_loss"], abs=0.05)


@pytest.mark.stacks  # the atomic-checkpoint guarantee, on every torch we ship
def test_kill_during_checkpoint_keeps_the_previous_one(pydoc_storage: Path, tmp_path: Path) -> None:
    """Rank 0 is SIGKILLed half-way through writing the step-20 checkpoint (fault injection)."""
    path = job_file(tmp_path, "ckptkill")
    env = FAULT_ENV | {"TRAINMASTER_FAULT_KILL_IN_CHECKPOINT": "20"}
    assert run_cli("launch", str(path), "--storage", str(pydoc_storage), env=env).returncode == 0
    final = wait_final(pydoc_storage, "ckptkill")
    assert final.phase == "succeeded"
    s = summary(pydoc_storage, "ckptkill")
    assert s["restarts"] == 1 and s["resumed_from"] == 10


@needs_etcd
def test_elastic_job_survives_losing_a_node(pydoc_storage: Path, tmp_path: Path) -> None:
    path = job_file(
        tmp_path, "elastic", "job.min_nnodes=1", 'rendezvous.backend="etcd"', "train.max_steps=60"
    )
    assert run_cli("launch", str(path), "--storage", str(pydoc_storage)).returncode == 0
    wait_step(pydoc_storage, "elastic", 12, 300)
    st = state.read(Storage(pydoc_storage).run_dir("elastic") / "state.json")
    node1 = [w.pid for w in runinfo.workers(st) if w.node == 1]
    assert node1, "node 1 has a worker"
    os.killpg(st.nodes[1].pid, signal.SIGKILL)  # the whole node: its agent...
    for pid in node1:  # ...and its worker, which torchrun started in a session of its own
        os.kill(pid, signal.SIGKILL)
    final = wait_final(pydoc_storage, "elastic")
    assert final.phase == "succeeded", final.message
    assert [n.exit_code for n in final.nodes][0] == 0
    # it went on and took node 1 back (backends/local/rejoin.py): it ended on both nodes
    assert summary(pydoc_storage, "elastic")["world_size"] == 2 and final.nodes[1].rejoins == 1
    assert "node 1 lost at step" in final.message and "back at step" in final.message


# --- bad input: exit 2, one line, nothing left running ------------------------------------------


def _assert_refused(
    result: subprocess.CompletedProcess[str], text: str, store: Path, job: str
) -> None:
    assert_user_error(result, text)
    assert not (Storage(store).run_dir(job) / "state.json").exists()  # nothing launched


def test_rendezvous_port_in_use(pydoc_storage: Path, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        path = job_file(tmp_path, "busy", f'rendezvous.endpoint="127.0.0.1:{port}"')
        result = run_cli("launch", str(path), "--storage", str(pydoc_storage))
    _assert_refused(result, f"port {port} on 127.0.0.1 is in use", pydoc_storage, "busy")


def test_unreachable_etcd_fails_within_the_timeout(pydoc_storage: Path, tmp_path: Path) -> None:
    port = rendezvous.free_port()
    path = job_file(
        tmp_path,
        "noetcd",
        'rendezvous.backend="etcd"',
        f'rendezvous.endpoint="127.0.0.1:{port}"',
        "rendezvous.timeout=3",
    )
    t0 = time.monotonic()
    result = run_cli("launch", str(path), "--storage", str(pydoc_storage))
    assert time.monotonic() - t0 < 60
    _assert_refused(
        result, f"no etcd with the v2 API answers at 127.0.0.1:{port}", pydoc_storage, "noetcd"
    )


def test_storage_not_writable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    path = job_file(tmp_path, "nowrite")
    result = run_cli("launch", str(path), "--storage", str(blocker / "storage"))
    assert_user_error(result, "storage is not writable")


def test_existing_job_name_is_refused_unless_resume(
    pydoc_storage: Path, tmp_path: Path, straight: dict
) -> None:
    path = job_file(tmp_path, "straight")
    result = run_cli("launch", str(path), "--storage", str(pydoc_storage))
    assert_user_error(result, "job straight exists", "--resume")


def test_etcd_requested_but_not_installed(pydoc_storage: Path, tmp_path: Path) -> None:
    path = job_file(tmp_path, "needetcd", 'rendezvous.backend="etcd"')
    bindir = str(Path(os.sys.executable).parent)
    result = run_cli("launch", str(path), "--storage", str(pydoc_storage), env={"PATH": bindir})
    _assert_refused(result, "apt-get install -y etcd-server", pydoc_storage, "needetcd")


# --- docs/architecture.md 5: 12.1: a fresh rendezvous id per launch ------------------------------


@pytest.fixture
def external_etcd(tmp_path: Path) -> Iterator[str]:
    """A long-lived etcd as on a cluster: it outlives each launch, so a closed rendezvous stays."""
    proc, endpoint = rendezvous.start_private_etcd(tmp_path / "etcd", tmp_path / "etcd.log", 30)
    try:
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _launch(path: Path, store: Path, *extra: str, env: dict[str, str] | None = None) -> None:
    result = run_cli("launch", str(path), "--storage", str(store), *extra, env=env)
    assert result.returncode == 0, result.stderr


@needs_etcd
def test_relaunch_of_the_same_job_name_meets_in_a_fresh_rendezvous(
    pydoc_storage: Path, tmp_path: Path, external_etcd: str
) -> None:
    """torch's etcd handler closes a rendezvous when its agent exits and keeps it for 2 h: a
    second launch under the job name as --rdzv-id failed at once with RendezvousClosedError."""
    path = job_file(
        tmp_path,
        "chunks",
        "job.nnodes=1",
        'rendezvous.backend="etcd"',
        f'rendezvous.endpoint="{external_etcd}"',
        "train.max_steps=20",
        "train.steps_this_run=10",
    )
    _launch(path, pydoc_storage)
    first = wait_final(pydoc_storage, "chunks")
    assert first.phase == "succeeded", diagnosis(pydoc_storage, "chunks")
    _launch(path, pydoc_storage, "--resume")
    second = wait_final(pydoc_storage, "chunks")
    assert second.phase == "succeeded", diagnosis(pydoc_storage, "chunks")
    assert second.rendezvous["run_id"] != first.rendezvous["run_id"]
    assert second.rendezvous["run_id"].startswith("chunks-")
    assert summary(pydoc_storage, "chunks")["resumed_from"] == 10


@needs_etcd
def test_relaunch_after_torchrun_gave_up_succeeds(
    pydoc_storage: Path, tmp_path: Path, external_etcd: str
) -> None:
    path = job_file(
        tmp_path,
        "gaveup",
        "job.nnodes=1",
        'rendezvous.backend="etcd"',
        f'rendezvous.endpoint="{external_etcd}"',
        "train.max_steps=20",
        "job.max_restarts=0",
    )
    _launch(path, pydoc_storage, env=FAULT_ENV | {"TRAINMASTER_FAULT_KILL_IN_CHECKPOINT": "20"})
    assert wait_final(pydoc_storage, "gaveup").phase == "failed"  # no restarts left
    _launch(path, pydoc_storage, "--resume")
    final = wait_final(pydoc_storage, "gaveup")
    assert final.phase == "succeeded", diagnosis(pydoc_storage, "gaveup")
    assert summary(pydoc_storage, "gaveup")["resumed_from"] == 10


def test_cancel_right_after_launch_stops_the_job(pydoc_storage: Path, tmp_path: Path) -> None:
    """docs/architecture.md 5: 17.1. A cancel while the job is pending used to be recorded but not
    honoured: the supervisor started the agents anyway and training ran under a `cancelled`
    status."""
    path = job_file(tmp_path, "early", "train.max_steps=100000")
    _launch(path, pydoc_storage)
    cancel = run_cli("cancel", "early", "--grace", "20", "--storage", str(pydoc_storage))
    assert cancel.returncode == 0 and "cancelled" in cancel.stdout, cancel.stderr
    run = Storage(pydoc_storage).run_dir("early")
    st = wait_final(pydoc_storage, "early")
    assert st.phase == "cancelled"
    # Whatever the supervisor had started by then, nothing of the run is left running.
    wait_job(
        pydoc_storage,
        "early",
        lambda: not state.live_processes(state.read(run / "state.json")),
        60,
        "every process of the run to exit",
    )
    assert not runinfo.workers(state.read(run / "state.json"))


@needs_etcd
def test_killed_supervisor_run_still_ends_right(pydoc_storage: Path, tmp_path: Path) -> None:
    """docs/architecture.md 5: 17.7. The agents outlive a SIGKILLed supervisor and finish the run;
    whoever sees the end then records it from the workers' summary (not `failed`) and stops
    the private etcd."""
    path = job_file(
        tmp_path, "orphan", "job.nnodes=1", 'rendezvous.backend="etcd"', "train.max_steps=20"
    )
    _launch(path, pydoc_storage)
    wait_step(pydoc_storage, "orphan", 2, 300)
    run = Storage(pydoc_storage).run_dir("orphan")
    before = state.read(run / "state.json")
    assert before.etcd_pid and state.pid_alive(before.etcd_pid, before.etcd_start)
    os.kill(before.supervisor_pid or 0, signal.SIGKILL)
    final = wait_final(pydoc_storage, "orphan")
    assert final.phase == "succeeded", diagnosis(pydoc_storage, "orphan")
    wait_job(
        pydoc_storage,
        "orphan",
        lambda: not state.pid_alive(before.etcd_pid, before.etcd_start),
        60,
        "the private etcd to stop",
    )
    assert no_processes_left(final)
