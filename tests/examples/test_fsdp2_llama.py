"""examples/fsdp2-llama (issue 26.6): FSDP2 + torch.distributed.checkpoint on 2 local nodes, gloo.

One worker is SIGKILLed after a checkpoint and a later step; torchrun restarts the group, every
rank reads its own shards back from the newest complete step_N folder (DCP) and the job ends
with exactly the parameters of an uninterrupted run (no dropout, batches a function of the step).
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from tests.conftest import run_cli, wait_for
from trainmaster.monitor import runinfo
from trainmaster.run import state
from trainmaster.storage import RunPaths, Storage
from trainmaster.worker import latest_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "fsdp2-llama" / "job.toml"
STEPS, EVERY = 100, 10
ARGS = ["--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--layers", "1", "--dim", "32"]
ARGS += ["--heads", "2", "--seq-len", "32", "--batch-size", "4"]
DONE = re.compile(r"train_llama: done at step (\d+), parameters sha256 (\w+)")


def launch(store: Path, name: str) -> RunPaths:
    sets = [f'job.name="{name}"', f"job.args={json.dumps(ARGS)}", "rendezvous.timeout=180"]
    sets += [f"job.storage={json.dumps(str(store))}", "job.max_restarts=3"]
    cli = ["launch", str(JOB)]
    for s in sets:
        cli += ["--set", s]
    result = run_cli(*cli, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return RunPaths(Storage(store).run_dir(name))


def diagnosis(run: RunPaths) -> str:
    parts = [run.state.read_text() if run.state.exists() else "no state.json"]
    for log in sorted(run.logs.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-20:]
        parts.append(f"--- {log.name}\n" + "\n".join(tail))
    return "\n".join(parts)


def wait(run: RunPaths, cond, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    try:
        wait_for(cond, timeout, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnosis(run)}") from None


def finished(run: RunPaths) -> tuple[int, str]:
    wait(run, lambda: state.observed(run.state).phase in state.FINAL, 600, "the end")
    assert state.read(run.state).phase == "succeeded", diagnosis(run)
    m = DONE.search((run.logs / "rank0.log").read_text())
    assert m, diagnosis(run)
    return int(m[1]), m[2]


def last_step(run: RunPaths) -> int:
    return max((int(r["step"]) for r in runinfo.read_metrics(run.metrics)), default=0)


def test_fsdp2_example_is_killed_and_resumes_exactly(tmp_path: Path) -> None:
    store = tmp_path / "storage"
    straight = launch(store, "llama-straight")
    assert finished(straight)[0] == STEPS

    run = launch(store, "llama-killed")
    env = {"TRAINMASTER_CHECKPOINT_DIR": str(run.checkpoints)}
    wait(run, lambda: latest_checkpoint(env) is not None and last_step(run) > EVERY, 300, "a save")
    assert state.read(run.state).phase == "running", "the job ended before a worker was killed"
    [victim] = [w for w in runinfo.workers(state.read(run.state)) if w.rank == 1]
    os.kill(victim.pid, signal.SIGKILL)
    step, checksum = finished(run)
    resumed = re.findall(
        r"train_llama: resumed from step (\d+)", (run.logs / "rank0.log").read_text()
    )
    assert len(resumed) == 1 and int(resumed[0]) % EVERY == 0, diagnosis(run)
    assert (step, checksum) == finished(straight)  # bit-equal parameters
    assert [int(r["step"]) for r in runinfo.read_metrics(run.metrics)] == list(range(1, STEPS + 1))
    kept = {p.name for p in run.checkpoints.iterdir()}
    assert kept == {f"step_{STEPS - EVERY}", f"step_{STEPS}"}  # keep=2, no temporary left
