"""Issue 26: your own script gets the built-in trainer's safety net, on real 2-node local jobs.

The script is tests/examples/net_script.py (DDP on gloo, trainmaster.worker's helpers), run
through the entry shim as any user's script: a node failing its preflight stops the job before
the script's first line, naming node and check; a rank stuck after step 15 is dumped by the
watchdog and the job restarts from its step-10 checkpoint; `cancel` stops every rank at one
step with a checkpoint of it (exit 143, counted as a preemption) and `launch --resume` goes on
from exactly there. Every wait is on a real condition, never a fixed sleep.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli, wait_for
from trainmaster.monitor import runinfo
from trainmaster.run import state
from trainmaster.storage import RunPaths, Storage
from trainmaster.train import faults, preempt, watchdog
from trainmaster.worker import latest_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "custom-gpt" / "job.toml"
SCRIPT = "tests/examples/net_script.py"
HANG_TIMEOUT = 10
FAULT_ENV = {"TRAINMASTER_DIST_TIMEOUT_S": "180"}


def launch(
    store: Path, name: str, args: list[str], *sets: str, env: dict[str, str] | None = None
) -> RunPaths:
    overrides = [
        f'job.name="{name}"',
        f'job.entrypoint="{SCRIPT}"',
        f"job.args={json.dumps(args)}",
        "job.max_restarts=3",
        "rendezvous.timeout=180",
        f"job.storage={json.dumps(str(store))}",
        *sets,
    ]
    cli = ["launch", str(JOB)]
    for s in overrides:
        cli += ["--set", s]
    result = run_cli(*cli, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    return RunPaths(Storage(store).run_dir(name))


def diagnosis(run: RunPaths) -> str:
    parts = [run.state.read_text() if run.state.exists() else "no state.json"]
    for log in sorted(run.logs.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-20:]
        parts.append(f"--- {log.name}\n" + "\n".join(tail))
    return "\n".join(parts)


def wait_final(run: RunPaths, timeout: float = 600) -> state.RunState:
    try:
        wait_for(lambda: state.observed(run.state).phase in state.FINAL, timeout, "the end")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnosis(run)}") from None
    return state.read(run.state)


def steps(run: RunPaths) -> list[int]:
    return [int(r["step"]) for r in runinfo.read_metrics(run.metrics)]


def status_text(store: Path, name: str) -> str:
    shown = run_cli("status", name, "--storage", str(store))
    assert shown.returncode == 0, shown.stderr
    return " ".join(shown.stdout.split())  # rich wraps long lines


def test_a_node_failing_preflight_stops_a_custom_script_naming_node_and_check(
    tmp_path: Path,
) -> None:
    store = tmp_path / "storage"
    env = FAULT_ENV | {faults.BAD_MATMUL_ENV: "1"}  # node 1's matmul comes out 1% off
    run = launch(store, "badnode", ["--steps", "5"], "job.max_restarts=0", env=env)
    final = wait_final(run)
    assert final.phase == "failed", diagnosis(run)
    assert final.message.startswith("node 1: preflight check matmul failed on "), final.message
    assert "relative error 1.0e-02" in final.message
    assert not list(run.dir.glob(".script-started-*"))  # the script's first line never ran
    assert "node 1: preflight check matmul failed" in status_text(store, "badnode")


def test_a_hung_custom_script_is_dumped_and_recovers_from_its_checkpoint(tmp_path: Path) -> None:
    store = tmp_path / "storage"
    args = ["--steps", "40", "--checkpoint-every", "10", "--hang-at", "1:15"]
    run = launch(store, "hung", args, f"train.hang_timeout={HANG_TIMEOUT}", env=FAULT_ENV)
    final = wait_final(run)
    assert final.phase == "succeeded", diagnosis(run)
    stuck = [h for h in watchdog.read_hangs(run.hangs) if h.rank == 1]
    assert stuck, diagnosis(run)
    h = stuck[0]  # rank 1's own watchdog: it logged step 15 and went no further
    assert h.step == 15 and h.where == "after step 15" and h.timeout_s == HANG_TIMEOUT
    assert HANG_TIMEOUT <= h.no_step_s < 180
    dump = (run.logs / h.dump).read_text()
    assert "net_script.py" in dump and "most recent call first" in dump  # the sleeping frame
    rows = runinfo.read_metrics(run.metrics)
    assert [int(r["resumed_from"]) for r in rows if "resumed_from" in r] == [10]
    assert steps(run) == list(range(1, 41))  # the rows of the redone steps were dropped
    assert "hang: rank 1 on node 1: no step for" in status_text(store, "hung")
    summary = json.loads(run.summary.read_text())
    assert summary["goodput"]["restarts"] == 1 and summary["goodput"]["steps_lost"] == 5


@pytest.mark.stacks  # a custom script's safety net, on every torch we ship
def test_cancel_of_a_custom_script_is_saved_at_one_step_and_resumed_from_there(
    tmp_path: Path,
) -> None:
    store = tmp_path / "storage"
    args = ["--steps", "2000", "--checkpoint-every", "500", "--step-sleep", "0.05"]
    run = launch(store, "preempted", args)
    try:
        wait_for(lambda: max(steps(run), default=0) >= 13, 300, "step 13")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnosis(run)}") from None
    cancelled = run_cli("cancel", "preempted", "--storage", str(store), "--grace", "120")
    assert cancelled.returncode == 0, cancelled.stderr
    assert wait_final(run).phase == "cancelled"
    [p] = preempt.read(run.preemptions)
    assert 13 <= p["step"] < 500 and p["checkpoint_s"] >= 0 and p["signal_at"]
    ckpt = latest_checkpoint({"TRAINMASTER_CHECKPOINT_DIR": str(run.checkpoints)})
    assert ckpt is not None and ckpt.name == f"step_{p['step']}", diagnosis(run)
    for rank in (0, 1):  # both ranks stopped at that step on purpose, not killed
        log = (run.logs / f"rank{rank}.log").read_text()
        assert f"stopped after step {p['step']} with a checkpoint of it" in log, log[-2000:]
    assert "preemptions 1 (SIGTERM, checkpointed)" in status_text(store, "preempted")

    more = ["--steps", str(p["step"] + 5), "--checkpoint-every", "500"]
    overrides = ["--set", f"job.args={json.dumps(more)}", "--set", f'job.entrypoint="{SCRIPT}"']
    resumed = run_cli(
        "launch",
        str(JOB),
        "--storage",
        str(store),
        "--resume",
        *overrides,
        "--set",
        'job.name="preempted"',
        cwd=ROOT,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert wait_final(run).phase == "succeeded", diagnosis(run)
    rows = runinfo.read_metrics(run.metrics)
    assert [int(r["resumed_from"]) for r in rows if "resumed_from" in r] == [p["step"]]
    assert steps(run) == list(range(1, p["step"] + 6))
    assert json.loads(run.summary.read_text())["preemptions"] == 1
