"""examples/custom-gpt: your own DDP script, launched by trainmaster on 2 local nodes, killed and resumed.

The script (a small GPT, not trainmaster's trainer) checkpoints every 20 steps and resumes from
its checkpoint. One worker is SIGKILLed once a checkpoint exists and a later step was logged;
torchrun restarts the workers, the script loads the checkpoint and the job completes: once with
the c10d rendezvous, once with the private etcd 3.4 that trainmaster starts for a local job.
`report` then splits the wall time as it does the built-in trainer's (issue 26.4): startup,
useful steps, the steps redone after the kill, checkpoint stalls and the restart, summing to
the wall time. Every wait is on a real condition (a file, a metrics row, state.json), never a
fixed sleep.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.conftest import etcd_available, run_cli, wait_for
from trainmaster.monitor import report, runinfo
from trainmaster.run import goodput, state
from trainmaster.storage import RunPaths, Storage
from trainmaster.worker import latest_checkpoint

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "custom-gpt" / "job.toml"
STEPS, EVERY = 300, 20
# Tiny and quick on 2 shared cores; the launch runs from the repository root, so the job's
# relative entrypoint (examples/custom-gpt/train_gpt.py) is found as a user's would be.
ARGS = [
    "--steps",
    str(STEPS),
    "--checkpoint-every",
    str(EVERY),
    "--layers",
    "1",
    "--d-model",
    "32",
    "--heads",
    "2",
    "--seq-len",
    "32",
    "--batch-size",
    "4",
    "--warmup",
    "5",
]


def launch(store: Path, name: str, *sets: str) -> None:
    overrides = [
        f'job.name="{name}"',
        f"job.args={json.dumps(ARGS)}",
        "job.max_restarts=4",
        "rendezvous.timeout=180",
        f"job.storage={json.dumps(str(store))}",
        *sets,
    ]
    args = ["launch", str(JOB)]
    for s in overrides:
        args += ["--set", s]
    result = run_cli(*args, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def diagnosis(run: RunPaths) -> str:
    parts = [run.state.read_text() if run.state.exists() else "no state.json"]
    for log in sorted(run.logs.glob("*.log")):
        parts.append(
            f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        )
    return "\n".join(parts)


def wait(run: RunPaths, cond, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    try:
        wait_for(cond, timeout, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnosis(run)}") from None


def steps(run: RunPaths) -> list[int]:
    return [int(r["step"]) for r in runinfo.read_metrics(run.metrics)]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "rdzv",
    [
        "c10d",
        pytest.param(
            "etcd",
            marks=pytest.mark.skipif(
                not etcd_available(), reason="etcd not installed (apt-get install etcd-server)"
            ),
        ),
    ],
)
def test_custom_script_is_killed_and_resumes_from_its_checkpoint(tmp_path: Path, rdzv: str) -> None:
    store, name = tmp_path / "storage", f"gpt-{rdzv}"
    run = RunPaths(Storage(store).run_dir(name))
    env = {"TRAINMASTER_CHECKPOINT_DIR": str(run.checkpoints)}
    launch(store, name, f'rendezvous.backend="{rdzv}"')
    # A checkpoint on disk and a step after it logged: killing now loses work since the checkpoint.
    wait(
        run,
        lambda: latest_checkpoint(env) is not None and max(steps(run), default=0) > EVERY,
        300,
        "a checkpoint",
    )
    st = state.read(run.state)
    assert st.phase == "running", "the job ended before a worker could be killed"
    victims = [w for w in runinfo.workers(st) if w.rank == 1]
    assert victims, f"rank 1 is running\n{diagnosis(run)}"
    os.kill(victims[0].pid, signal.SIGKILL)
    wait(run, lambda: state.observed(run.state).phase in state.FINAL, 400, "the end")

    final = state.read(run.state)
    assert final.phase == "succeeded", diagnosis(run)
    assert final.private_etcd is (rdzv == "etcd") and final.workdir == str(ROOT)
    rows = runinfo.read_metrics(run.metrics)
    resumed = [int(r["resumed_from"]) for r in rows if "resumed_from" in r]
    assert len(resumed) == 1 and resumed[0] >= EVERY and resumed[0] % EVERY == 0, rows
    # Rows logged after the checkpoint by the killed attempt were dropped on resume: no step twice.
    assert steps(run) == list(range(1, STEPS + 1))
    assert f"train_gpt: resumed from step {resumed[0]}" in (run.logs / "rank0.log").read_text()
    s = runinfo.status(Storage(store), name)
    assert (
        s.restarts == 1
        and s.max_steps == STEPS
        and s.summary
        and s.summary["status"] == "completed"
    )
    assert runinfo.progress_text(s).startswith(f"step {STEPS}/{STEPS}  loss ")
    assert any(run.tensorboard.iterdir())  # `trainmaster tensorboard` has something to show
    g = report.make_report(Storage(store), name).goodput  # the shim's timeline.jsonl
    # Steps take ~6 ms here, so the kill may land right after a checkpoint: the steps lost are
    # those the killed attempt logged after the step it resumed from (often >= 1, may be 0).
    events = [json.loads(line) for line in run.timeline.read_text().splitlines()]
    second = [i for i, e in enumerate(events) if e["event"] == "start"][1]
    killed_at = max(e["last"] for e in events[:second] if e["event"] == "steps")
    assert g is not None and g["restarts"] == 1, g
    assert g["steps_lost"] == killed_at - resumed[0], (g, killed_at)
    assert (g["lost"] > 0) is (killed_at > resumed[0]), g
    assert g["startup"] > 0 and g["productive"] > 0 and g["restart"] > 0
    assert g["checkpoint"] > 0 and 0 < g["ratio"] < 1
    assert sum(g[k] for k in goodput.KINDS) == pytest.approx(g["wall"], abs=0.01)
    shown = run_cli("report", name, "--storage", str(store))
    assert shown.returncode == 0 and "steps lost" in shown.stdout, shown.stderr
    pids = [p for p in [final.supervisor_pid, final.etcd_pid, *(n.pid for n in final.nodes)] if p]
    # The supervisor records the end, then stops the private etcd and exits.
    wait(run, lambda: not any(state.pid_alive(p) for p in pids), 60, "every process to exit")
