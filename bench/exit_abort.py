"""A worker that aborts at exit: does a 2-node job whose work is done end succeeded, and soon?
(backends/local/completion.py)

    python bench/exit_abort.py [--trials 3] [--kinds at_exit,mid_run,rank0_at_end] [--steps 6]
                               [--rendezvous-timeout 600] [--baseline WORKTREE] [--out FILE]

The job: a small gloo script (custom entrypoint, 2 nodes x 1 worker, c10d, no preflight) whose
rank 1 calls os.abort() once, as torch 2.13 does to gloo workers at exit at times:

  at_exit  after its last step and destroy_process_group, once rank 0's process has exited (so
           that node's agent waits in torchrun's exit barrier): the supervisor must end the job
           succeeded with the warning, instead of the agents waiting out the exit barrier
           (300 s) and the join timeout (rendezvous.timeout) and the job failing
  mid_run  after step 2: torchrun must restart the workers as before (no warning)
  rank0_at_end  rank 0 instead, at the end of the script once rank 1's process has exited: no
           summary, and rank 1's agent does not exit (it waits in the exit barrier): the
           shim's RUN/finished markers must end the job, instead of the barrier's 300 s

Per kind: succeeded/N, warned/N (the at-exit warning in status), the median seconds from
torchrun's line for the aborted worker to the job's recorded end, and from launch to the end.
--baseline WORKTREE: each trial also with another checkout's trainmaster (its src/ first on
PYTHONPATH; e.g. `git worktree add /tmp/tm-before COMMIT`), alternating, under KIND_baseline;
with --rendezvous-timeout 60 a baseline at_exit trial ends in about 80 s instead of 300-600 s.
check_us: CPU microseconds of one EndWatch.check, which the supervisor calls at every look at
its agents (every 0.2 s): while a job runs (one stat) and at an end where the agents meet in
the exit barrier (the full look: state, /proc, timeline, node logs). Prints one JSON object;
no assertions (docs/architecture.md 4).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import emit, load, machine, wait_final
from trainmaster.backends.local import completion
from trainmaster.run import goodput, state
from trainmaster.storage import RunPaths, Storage

# kind -> (ABORT_AT (0: after the last step), ABORT_RANK)
KINDS = {"at_exit": (0, 1), "mid_run": (2, 1), "rank0_at_end": (0, 0)}
SCRIPT = Path(__file__).with_name("abort_script.py")


def trial(
    root: Path, kind: str, i: int, steps: int, rdzv_timeout: int, tree: Path | None = None
) -> dict[str, Any]:
    name = f"{kind.replace('_', '-')}-{i}" + ("-baseline" if tree else "")
    sets = ["train.preflight=false", f"rendezvous.timeout={rdzv_timeout}", "job.max_restarts=2"]
    args = [sys.executable, "-m", "trainmaster", "--storage", str(root / "store"), "launch",
            "abort.py", "--nnodes", "2", "--name", name]  # fmt: skip
    for s in sets:
        args += ["--set", s]
    at, rank = KINDS[kind]
    env = {**os.environ, "ABORT_AT": str(at), "ABORT_RANK": str(rank), "STEPS": str(steps)}
    if tree is not None:  # the CLI, and the supervisor it forks, import that tree's trainmaster
        env["PYTHONPATH"] = os.pathsep.join([str(tree / "src"), env.get("PYTHONPATH", "")])
    t0 = time.time()
    subprocess.run(args, cwd=root, env=env, check=True, capture_output=True, timeout=120)
    run = RunPaths(Storage(root / "store").run_dir(name))
    phase = wait_final(run.state, timeout_s=rdzv_timeout + 400.0)
    st = state.read(run.state)
    end = st.finished_at or time.time()
    failures = [completion.worker_failure(run.logs / f"node{n}.log", 0) for n in range(2)]
    aborted = min((f[0] for f in failures if f is not None), default=None)
    summary = json.loads(run.summary.read_text()) if run.summary.exists() else {}
    return {
        "phase": phase,
        "warned": "at exit" in st.message,
        "end_after_abort_s": round(end - aborted, 2) if aborted is not None else None,
        "wall_s": round(end - t0, 2),
        "restarts": summary.get("restarts"),
    }


def check_us(root: Path, end_state: bool, calls: int = 2000) -> float:
    """CPU microseconds per EndWatch.check on a 2-node run folder (no live processes)."""
    run = RunPaths(root / ("end" if end_state else "running"))
    run.logs.mkdir(parents=True)
    launched = time.time() - 60
    nodes = [state.NodeState(index=n) for n in range(2)]
    state.write(run.state, state.RunState(job="j", started_at=launched, nodes=nodes))
    goodput.record(run.timeline, "start", t=time.time(), compiles=False)
    for n in range(2):  # a failure before the last start: a restart, then the end
        (run.logs / f"node{n}.log").write_text(
            time.strftime("E%m%d %H:%M:%S.000000 1 api.py:1] ", time.localtime(launched + 1))
            + "failed (exitcode: 1) local_rank: 0 (pid: 2) of binary: python\n"
        )
    if end_state:
        run.summary.write_text(json.dumps({"status": "completed"}))
    watch = completion.EndWatch(run, True, [0, 0], launched)
    c0 = time.process_time()
    for _ in range(calls):
        watch.check([None, None], set())
    return round((time.process_time() - c0) / calls * 1e6, 1)


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def tally(trials: list[dict[str, Any]]) -> dict[str, Any]:
    ends = [t["end_after_abort_s"] for t in trials if t["end_after_abort_s"] is not None]
    return {
        "succeeded": f"{sum(t['phase'] == 'succeeded' for t in trials)}/{len(trials)}",
        "warned": f"{sum(t['warned'] for t in trials)}/{len(trials)}",
        "median_end_after_abort_s": _median(ends),
        "median_wall_s": _median([t["wall_s"] for t in trials]),
        "trials": trials,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"some of {','.join(KINDS)}")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rendezvous-timeout", type=int, default=600)
    ap.add_argument("--baseline", type=Path, help="another checkout to run side by side")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    latest = max(at for at, _ in KINDS.values())
    if set(kinds) - set(KINDS) or args.trials < 1 or args.steps <= latest:
        ap.error(f"--kinds from {','.join(KINDS)}, --trials >= 1, --steps > {latest}")
    report: dict[str, Any] = {"bench": "exit_abort", "machine": machine(), "load_before": load()}
    with tempfile.TemporaryDirectory(prefix="tm-exit-abort-") as tmp:
        root = Path(tmp)
        (root / "abort.py").write_text(SCRIPT.read_text())
        report["check_us"] = {"running": check_us(root, False), "end": check_us(root, True)}
        for kind in kinds:
            ours, base = [], []
            for i in range(args.trials):
                ours.append(trial(root, kind, i, args.steps, args.rendezvous_timeout))
                if args.baseline is not None:
                    base.append(
                        trial(root, kind, i, args.steps, args.rendezvous_timeout, args.baseline)
                    )
            report[kind] = tally(ours)
            if base:
                report[f"{kind}_baseline"] = tally(base)
    report["load_after"] = load()
    emit(report, args.out)


if __name__ == "__main__":
    main()
