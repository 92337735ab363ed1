"""Time from starting a job to its first training step: trainmaster launch vs torchrun vs TorchX.

    python bench/launch_overhead.py [--repeats 3] [--steps 2] [--cases builtin,script,agent]
                                    [--baseline SRC] [--torchx PATH] [--out FILE]

Three cases, each on 2 nodes x 1 worker with c10d on loopback:

  builtin   the demo's job (bert-tiny on the built-in corpus, prepared once in a temp folder),
            started by `trainmaster launch JOB.toml` and by the two torchrun commands that
            launch would run (backends/local/launcher.py's plan), started directly as plain
            torchrun (python -m torch.distributed.run, not launch/agent.py): the floor
  script    a user's script (bench/ddp_script.py: a small DDP model, one helper), started by
            `trainmaster launch bench/ddp_script.py --nnodes 2` (the entry shim and its safety
            net around the script), by plain torchrun running the script with the same torchrun
            options, and by TorchX 0.7.0 `torchx run -s local_cwd dist.ddp -j 2x1 --script ...`
            (its own venv, --torchx; it finds torchrun and python on PATH, so ours go first)
  agent     one agent's CPU seconds (user+sys) from its start to its rendezvous, read from
            /proc/AGENT/stat by its worker as it starts (a script that does nothing else):
            plain torchrun against the local backend's agent (launch/agent.py, torchrun with
            its imports done without the garbage collector), side by side

--baseline SRC adds `launch@baseline`: the same launch from another trainmaster source tree
(e.g. `git worktree add /tmp/before HEAD~3`), on PYTHONPATH for the CLI and everything it starts,
so that before and after are measured side by side in one run. Both trees are byte-compiled
first, as an installed package is.

Each run is timed from just before its first process starts to the moment rank 0 appended step 1
to metrics.jsonl (that file's modification time, read while it holds one row); the script logs
with trainmaster.worker.log_metrics, which writes to $TRAINMASTER_RUN_DIR, set by the shim under
launch and by this bench for the others. Every way gets the environment the local supervisor
gives its agents (benchlib.agent_env). The order of the ways rotates per repeat, and medians are
compared: the machine is shared and noisy. A launch run also reports where its time went, from
the run folder: the CLI's return and its CPU seconds (user+sys, steadier than wall time on a busy
machine), the supervisor starting the agents (state.json started_at), rank 0's shim or trainer
starting (timeline.jsonl start) and the preflight. Prints one JSON
object; no assertions (docs/architecture.md 4). Aims: builtin launch within 1.15 x torchrun;
script launch no slower than TorchX; the local agent cheaper than plain torchrun.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trainmaster
from benchlib import agent_env, cpu_s, emit, first_step_at, machine, prepare_corpus
from trainmaster.backends.local import launcher as local
from trainmaster.backends.local import rendezvous
from trainmaster.config import jobfile
from trainmaster.launch import agent
from trainmaster.launch.torchrun import TORCHRUN_MODULE, Rendezvous, torchrun_args
from trainmaster.run import state
from trainmaster.storage import RunPaths, Storage

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "bench/ddp_script.py"  # relative to REPO, where every way runs
TIMEOUT_S = 600.0
Way = Callable[[Path, str, int], dict[str, Any]]


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def builtin_job(root: Path, name: str, steps: int) -> Path:
    cfg = jobfile.preset(
        "local-cpu",
        [f'job.name="{name}"', f"train.max_steps={steps}", "train.warmup_steps=1",
         "job.max_restarts=0"],
    )  # fmt: skip
    path = root / "jobs" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(jobfile.render(cfg, f"bench job {name}"), encoding="utf-8")
    return path


def rank0_cpu(metrics: Path) -> dict[str, float]:
    """Rank 0's CPU seconds at step 1 (the script's cpu_s; the built-in trainer logs none):
    what its worker spent, shim and preflight included, whatever else ran on the machine."""
    row = json.loads(metrics.read_text().splitlines()[0])
    return {"rank0_cpu_s": row["cpu_s"]} if "cpu_s" in row else {}


def phases(run: RunPaths, t0: float) -> dict[str, float]:
    """Seconds from t0 to each start-up milestone the run folder records."""
    out: dict[str, float] = {}
    started = json.loads(run.state.read_text()).get("started_at")
    if started:
        out["agents_started_s"] = round(started - t0, 3)
    events = [json.loads(line) for line in run.timeline.read_text().splitlines() if line]
    for e in events:
        if e["event"] == "start" and "worker_started_s" not in out:
            out["worker_started_s"] = round(e["t"] - t0, 3)
        if e["event"] == "preflight" and "preflight_s" not in out:
            out["preflight_s"] = round(e["end"] - e["t"], 3)
    return out


def via_launch(src: Path | None, case: str) -> Way:
    """`trainmaster launch`, from this checkout or (src) another source tree."""

    def run(root: Path, name: str, steps: int) -> dict[str, Any]:
        env = agent_env(2)
        if src is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(src / "src"), env.get("PYTHONPATH", "")])
        if case == "builtin":
            target = [str(builtin_job(root, name, steps))]
        else:
            target = [SCRIPT, "--nnodes", "2", "--name", name, "--", "--steps", str(steps)]
        cmd = [sys.executable, "-m", "trainmaster", "--storage", str(root), "launch", *target]
        paths = RunPaths(Storage(root).run_dir(name))
        used = cpu_s(resource.RUSAGE_CHILDREN)
        t0 = time.time()
        result = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
        returned = time.time() - t0
        cli_cpu = cpu_s(resource.RUSAGE_CHILDREN) - used  # the CLI (the supervisor is not ours)
        if result.returncode != 0:
            raise SystemExit(f"launch {name} failed: {result.stderr.strip()}")
        first = first_step_at(paths.metrics, t0, TIMEOUT_S)
        cpu = rank0_cpu(paths.metrics)
        ended = _ended(paths)
        return {"first_step_s": round(first, 3), "cli_returned_s": round(returned, 3),
                "cli_cpu_s": round(cli_cpu, 3), **cpu, **phases(paths, t0), **({"ended": ended} if ended != "succeeded" else {})}  # fmt: skip

    return run


def _ended(paths: RunPaths, grace_s: float = 30.0) -> str:
    """How the job ended. A run whose script completed (rank 0 wrote summary.json) can still
    hang at exit: torch 2.13 sometimes aborts a gloo worker after the script has returned
    ("terminate called without an active exception"), and when its peer has already finished,
    the aborted node's agent waits for that peer in a restart rendezvous. What is timed here is
    the first step, so such a run is cancelled after grace_s and reported, not waited for."""
    deadline = time.monotonic() + TIMEOUT_S
    done_at: float | None = None
    while (phase := state.observed(paths.state).phase) not in state.FINAL:
        if done_at is None and paths.summary.exists():
            done_at = time.monotonic()
        if (done_at and time.monotonic() - done_at > grace_s) or time.monotonic() > deadline:
            local.cancel(paths, grace_s=5)
            return "script completed; cancelled while hanging at exit (see its logs)"
        time.sleep(0.2)  # another process tree's job
    if phase != "succeeded":
        raise SystemExit(f"launch {paths.dir.name} {phase}: see {paths.logs}")
    return phase


def _started(cmds: list[list[str]], env: dict[str, str], out: Path) -> dict[str, Any]:
    """Start the commands together (one process group each): seconds to step 1 in
    out/metrics.jsonl, and how they ended when not all with 0 (after step 1: see _ended)."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    files = [(logs / f"node{i}.log").open("wb") for i in range(len(cmds))]
    t0 = time.time()
    procs = [
        subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         env=env, cwd=REPO, start_new_session=True)
        for cmd, f in zip(cmds, files, strict=True)
    ]  # fmt: skip
    try:
        first = first_step_at(out / "metrics.jsonl", t0, TIMEOUT_S)
        first_end: float | None = None
        while any(p.poll() is None for p in procs):  # bounded: see _ended, plain torchrun too
            if first_end is None and any(p.poll() is not None for p in procs):
                first_end = time.monotonic()
            if first_end is not None and time.monotonic() - first_end > 30.0:
                for p in procs:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
                break
            time.sleep(0.2)  # other processes' end
        codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            p.kill() if p.poll() is None else None
        for f in files:
            f.close()
    result: dict[str, Any] = {"first_step_s": round(first, 3), **rank0_cpu(out / "metrics.jsonl")}
    if any(codes):
        text = "".join(f.read_text(errors="replace") for f in sorted(logs.rglob("*.log")))
        aborted = "terminate called without an active exception" in text
        result["ended"] = f"exit codes {codes} after step 1" + (
            " (a worker aborted at exit: terminate called without an active exception)"
            if aborted
            else ""
        )
    return result


def via_torchrun(case: str) -> Way:
    """The torchrun commands of the job, started directly; for the script without the shim."""

    def run(root: Path, name: str, steps: int) -> dict[str, Any]:
        if case == "builtin":
            cfg = jobfile.load(builtin_job(root, name, steps))
            plan = local.plan(cfg, Storage(root))
            plan.run.dir.mkdir(parents=True)
            plan.run.job_toml.write_text(jobfile.render(cfg, f"bench job {name}"))
            # plain torchrun: what a user would start by hand (launch runs launch/agent.py)
            cmds = [[TORCHRUN_MODULE if a == agent.MODULE else a for a in c] for c in plan.commands]
            out = plan.run.dir
        else:
            cfg = jobfile.validate(
                {"job": {"name": name, "nnodes": 2, "entrypoint": SCRIPT}}, "bench"
            )
            rdzv = Rendezvous("c10d", f"{rendezvous.LOOPBACK}:{rendezvous.free_port()}", name)
            node = [sys.executable, "-m", "torch.distributed.run", *torchrun_args(cfg, rdzv),
                    SCRIPT, "--steps", str(steps)]  # fmt: skip
            cmds, out = [node, node], root / "plain" / name
        env = agent_env(2) | {"TRAINMASTER_RUN_DIR": str(out)}
        return _started(cmds, env, out)

    return run


def via_torchx(torchx: Path) -> Way:
    """TorchX's local_cwd scheduler running its dist.ddp component on the same script."""

    def run(root: Path, name: str, steps: int) -> dict[str, Any]:
        out = root / "torchx" / name
        port = str(rendezvous.free_port())
        cmd = [str(torchx), "run", "-s", "local_cwd", "-cfg", f"log_dir={out / 'torchx'}",
               "dist.ddp", "-j", "2x1", "--rdzv_port", port, "--script", SCRIPT,
               "--", "--steps", str(steps)]  # fmt: skip
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        env = agent_env(2) | {"TRAINMASTER_RUN_DIR": str(out), "PATH": path}
        return _started([cmd], env, out)

    return run


# The agent case's worker: its parent is its node's agent, which has just passed the rendezvous.
AGENT_PROBE = """import json, os, sys, time
t = time.time()
fields = open(f"/proc/{os.getppid()}/stat").read().rsplit(")", 1)[1].split()
cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
out = {"agent_cpu_s": cpu, "t": t}
with open(os.path.join(sys.argv[1], f"agent{os.environ['GROUP_RANK']}.json"), "w") as f:
    json.dump(out, f)
"""


def agent_case(root: Path, repeats: int) -> dict[str, Any]:
    """CPU seconds of each agent from its start to its workers' start, plain torchrun and the
    local backend's agent, alternating: 2 agents per run, so 2 x repeats samples each. Also
    each agent's whole life (start to exit, its probe worker included: ~0.02 s), from the
    children's rusage: the collector's walks at the interpreter's exit are in it too."""
    probe = root / "agent_probe.py"
    probe.write_text(AGENT_PROBE)
    ways = {"torchrun": TORCHRUN_MODULE, "agent": agent.MODULE}
    cpu: dict[str, list[float]] = {w: [] for w in ways}
    wall: dict[str, list[float]] = {w: [] for w in ways}
    total: dict[str, list[float]] = {w: [] for w in ways}
    names = list(ways)
    for i in range(repeats):
        for way in names[i % 2 :] + names[: i % 2]:
            out = root / "agent" / f"{way}-{i}"
            out.mkdir(parents=True)
            cfg = jobfile.validate({"job": {"name": f"a{i}", "nnodes": 2}}, "bench")
            rdzv = Rendezvous("c10d", f"{rendezvous.LOOPBACK}:{rendezvous.free_port()}", out.name)
            args = [*torchrun_args(cfg, rdzv), str(probe), str(out)]
            node = [sys.executable, "-m", ways[way], *args]
            used = cpu_s(resource.RUSAGE_CHILDREN)
            t0 = time.time()
            procs = [subprocess.Popen(node, env=agent_env(2), cwd=REPO, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                      start_new_session=True) for _ in range(2)]  # fmt: skip
            codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
            both = cpu_s(resource.RUSAGE_CHILDREN) - used
            total[way].append(round(both / 2, 3))
            if any(codes):
                raise SystemExit(f"agent case {way}: exit codes {codes}")
            for node_rank in range(2):
                got = json.loads((out / f"agent{node_rank}.json").read_text())
                cpu[way].append(round(got["agent_cpu_s"], 3))
                wall[way].append(round(got["t"] - t0, 3))
            say(f"agent {i + 1}: {way:16s} {cpu[way][-2:]} CPU s to the rendezvous")
    med = {w: statistics.median(v) for w, v in cpu.items()}
    return {
        "agent_cpu_s": cpu,
        "median_cpu_s": {w: round(v, 3) for w, v in med.items()},
        "agent_over_torchrun_cpu": round(med["agent"] / med["torchrun"], 3),
        "workers_started_s median": {w: round(statistics.median(v), 3) for w, v in wall.items()},
        "whole_agent_cpu_s median": {w: round(statistics.median(v), 3) for w, v in total.items()},
    }


def summary(case: str, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    med = {w: statistics.median(r["first_step_s"] for r in rs) for w, rs in runs.items()}
    out: dict[str, Any] = {
        "first_step_s": {w: [r["first_step_s"] for r in rs] for w, rs in runs.items()},
        "median_s": {w: round(v, 3) for w, v in med.items()},
        "over_torchrun": {w: round(v / med["torchrun"], 3) for w, v in med.items()},
    }
    if "torchx" in med:
        out["launch_over_torchx"] = round(med["launch"] / med["torchx"], 3)
        if "launch@baseline" in med:
            out["baseline_over_torchx"] = round(med["launch@baseline"] / med["torchx"], 3)
    if all("rank0_cpu_s" in r for rs in runs.values() for r in rs):
        out["rank0_cpu_s median"] = {
            w: round(statistics.median(r["rank0_cpu_s"] for r in rs), 3) for w, rs in runs.items()
        }
    for way in (w for w in runs if any("ended" in r for r in runs[w])):
        out[f"{way} endings"] = [r.get("ended", "succeeded") for r in runs[way]]
    for way in (w for w in runs if w.startswith("launch")):
        keys = sorted({k for r in runs[way] for k in r} - {"first_step_s", "ended", "rank0_cpu_s"})
        out[f"{way} phases median_s"] = {
            k: round(statistics.median(r[k] for r in runs[way] if k in r), 3) for k in keys
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="runs of each way (rotating order)")
    p.add_argument("--steps", type=int, default=2, help="steps per run (the first is timed)")
    p.add_argument("--cases", default="builtin,script", help="builtin, script, agent (a list)")
    p.add_argument("--baseline", type=Path, help="another trainmaster source tree to launch too")
    p.add_argument("--torchx", type=Path, default=REPO / ".venv-torchx" / "bin" / "torchx")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args()
    cases = [c for c in ("builtin", "script", "agent") if c in args.cases.split(",")]
    # Bytecode for each tree, as an installed package has it: with PYTHONDONTWRITEBYTECODE set
    # (as here), every interpreter would compile the edited modules again, and the tree with more
    # of them would pay for it in every process.
    for tree in [Path(trainmaster.__file__).parent] + (
        [args.baseline / "src" / "trainmaster"] if args.baseline else []
    ):
        compileall.compile_dir(tree, quiet=1)
    report: dict[str, Any] = {
        "bench": "launch_overhead",
        "what": "seconds from starting the job to rank 0's step 1 in metrics.jsonl, 2 nodes x 1 "
        "worker, c10d on loopback; builtin: bert-tiny on the built-in corpus; script: "
        f"{SCRIPT} (a small DDP model)",
        "machine": machine(),
        "aim": "builtin launch within 1.15 x torchrun; script launch no slower than TorchX; "
        "the local agent cheaper than plain torchrun",
        "repeats": max(1, args.repeats),
        "cases": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
        root = Path(tmp)
        if "builtin" in cases:
            say("preparing the built-in corpus ...")
            prepare_corpus(root, shards=2)
        for case in cases:
            if case == "agent":
                report["cases"][case] = agent_case(root, report["repeats"])
                continue
            ways: dict[str, Way] = {
                "launch": via_launch(None, case),
                "torchrun": via_torchrun(case),
            }
            if case == "script":
                if args.torchx.exists():
                    ways["torchx"] = via_torchx(args.torchx)
                else:
                    report["cases"]["note"] = f"no TorchX at {args.torchx}: make torchx-venv"
            if args.baseline:
                ways["launch@baseline"] = via_launch(args.baseline.resolve(), case)
            runs: dict[str, list[dict[str, Any]]] = {w: [] for w in ways}
            names = list(ways)
            for i in range(report["repeats"]):
                for way in names[i % len(names) :] + names[: i % len(names)]:
                    name = f"{case}-{way.replace('@', '-')}-{i}"
                    runs[way].append(ways[way](root, name, args.steps))
                    say(
                        f"{case} {i + 1}: {way:16s} step 1 after {runs[way][-1]['first_step_s']:.2f} s"
                    )
            report["cases"][case] = summary(case, runs)
    emit(report, args.out)


if __name__ == "__main__":
    main()
