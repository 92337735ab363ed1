"""Your own training script as a job (`[job] entrypoint`): how torchrun starts it, and the shim.

A custom entrypoint gets what the built-in trainer gets: the same torchrun line (rendezvous,
restarts, devices, environment), the run folder, and the tools that read it. torchrun starts
this module on every worker, which prepares what the built-in trainer prepares for itself
and then runs the script in the same process (runpy, as `python script.py` would):

    python -m trainmaster.launch.entry --job RUN/job.toml --storage ROOT --workdir DIR \
        -- (SCRIPT | -m MODULE) [ARGS...]

- environment: TRAINMASTER_RUN_DIR (STORAGE/runs/JOB), TRAINMASTER_CHECKPOINT_DIR and
  TRAINMASTER_TENSORBOARD_DIR (its checkpoints/ and tensorboard/, created), TRAINMASTER_STORAGE,
  TRAINMASTER_JOB; torchrun's RANK, WORLD_SIZE, MASTER_ADDR, TORCHELASTIC_RESTART_COUNT...
- logs: each rank's output is also appended to RUN/logs/rankR.log (`trainmaster logs`), and
  rank 0 prints the `trainmaster: rank 0 on pod P` line a cluster backend finds it by.
- status: rank 0 writes rank0.json (where it runs, how often it restarted: _starts), and
  summary.json {"status": "completed"} when the script ends with exit code 0.
- code: DIR is where relative script paths and `-m` modules are looked up: the folder
  `launch` ran in (local, like TorchX's local_cwd) or /workspace in the image (Kubernetes).
- safety net (train/scriptnet.py): node preflight before the script, the hang watchdog, the
  goodput timeline and preemption, fed by trainmaster.worker's helpers; exit codes as the
  trainer's: 2 a failed preflight, 3 hung, 143 preempted (after preempted() said so).

Every worker pays for what the shim imports before the script's first step, so it imports only
what a torchrun script needs anyway: the standard library, trainmaster's stdlib-only run-folder
modules, and torch for the preflight (the script imports it next). The config's pydantic model
stays on the operator side (program_args, check_local import it there); the net reads
the resolved job.toml with tomllib (train/scriptnet.py settings()).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import os
import runpy
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from trainmaster import files
from trainmaster.errors import EXIT_BAD_INPUT, ConfigError, UserError
from trainmaster.run import goodput, ranklog
from trainmaster.run import metrics as runlog
from trainmaster.storage import ENV_VAR as STORAGE_ENV
from trainmaster.storage import RunPaths

if TYPE_CHECKING:
    from trainmaster.config import JobConfig

MODULE = "trainmaster.launch.entry"
WORKSPACE_DIR = "/workspace"  # where the images' Dockerfiles COPY code (cluster/image.py)
ENV_RUN_DIR = runlog.RUN_DIR_ENV  # TRAINMASTER_RUN_DIR: log_metrics writes there
ENV_CHECKPOINTS = "TRAINMASTER_CHECKPOINT_DIR"
ENV_TENSORBOARD = "TRAINMASTER_TENSORBOARD_DIR"
ENV_JOB = "TRAINMASTER_JOB"
ENV_NODE_INDEX = "TRAINMASTER_NODE_INDEX"  # the local supervisor's index of this worker's agent


def target_argv(entrypoint: str) -> list[str]:
    """`-m pkg.mod` -> ["-m", "pkg.mod"]; a file -> [file] (config.check_entrypoint checked it)."""
    return ["-m", entrypoint.split()[-1]] if entrypoint.startswith("-m") else [entrypoint]


def program_args(cfg: JobConfig, *, job_file: str, storage: str, workdir: str) -> list[str]:
    """What torchrun runs on each worker for a custom entrypoint (module docstring)."""
    return [
        "-m",
        MODULE,
        "--job",
        job_file,
        "--storage",
        storage,
        "--workdir",
        workdir,
        "--",
        *target_argv(cfg.job.entrypoint),
        *cfg.job.args,
    ]


def check_local(cfg: JobConfig, cwd: Path) -> None:
    """Before a local launch: the script exists (relative to the launch folder), or the
    module's top-level package can be found from there. Packages are not imported: that would
    run their code in the launching shell."""
    if cfg.job.builtin:
        return
    target = target_argv(cfg.job.entrypoint)
    if target[0] == "-m":
        top = target[1].split(".")[0]
        saved = sys.path[:]
        sys.path.insert(0, str(cwd))
        try:
            found = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            found = False
        finally:
            sys.path[:] = saved
        if not found:
            raise ConfigError(
                f"no module {top!r} importable from {cwd} (the folder `launch` runs "
                "in); install it or launch from the folder that holds it",
                where="job.entrypoint",
            )
        return
    path = cwd / Path(target[0]).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"no such file {path}; paths are relative to the folder `launch` runs in ({cwd})",
            where="job.entrypoint",
        )


# --- the shim, on every worker -----------------------------------------------------------------


def _finished(run: RunPaths, environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Locally, say that this worker's script returned (RUN/finished/nodeN.LOCAL_RANK): once
    every worker of a node did, the script has ended, even if a peer then dies before its
    own end and its agent waits for a round that never comes (backends/local/completion.py).
    Replaced, not rewritten: the folder's time tells the supervisor something new is there."""
    node = environ.get(ENV_NODE_INDEX)
    if node is None:
        return
    run.finished.mkdir(exist_ok=True)
    name = f"node{node}.{environ.get('LOCAL_RANK', '0')}"
    files.write_atomic(run.finished / name, environ.get("TORCHELASTIC_RUN_ID", ""))


def _starts(run: RunPaths, run_id: str) -> int:
    """How often rank 0 has started in this launch (its --rdzv-id), this start included.

    torchrun counts restarts per node agent (TORCHELASTIC_RESTART_COUNT), and only the agent
    whose worker failed counts one: rank 0 on a healthy node sees 0. Every restart starts rank
    0 again, wherever it lands, so its starts under one rendezvous id count the job's restarts
    without a collective (the built-in trainer all-gathers the agents' counts instead)."""
    try:
        old = json.loads(run.rank0.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 1
    if (
        isinstance(old, dict)
        and run_id
        and old.get("run_id") == run_id
        and isinstance(old.get("starts"), int)
    ):
        return int(old["starts"]) + 1
    return 1


def prepare(
    run: RunPaths, storage: str, environ: dict[str, str] | os._Environ[str] = os.environ
) -> int:
    """Environment, folders, rank log and rank 0's files; returns the rank."""
    for folder in (run.checkpoints, run.tensorboard, run.logs):
        folder.mkdir(parents=True, exist_ok=True)
    environ[ENV_RUN_DIR] = str(run.dir)
    environ[ENV_CHECKPOINTS] = str(run.checkpoints)
    environ[ENV_TENSORBOARD] = str(run.tensorboard)
    environ[STORAGE_ENV] = storage
    environ[ENV_JOB] = run.dir.name
    rank = int(environ.get("RANK", "0") or 0)
    ranklog.tee_to_rank_file(run.logs, rank)
    if rank == 0:
        pod = environ.get("POD_NAME") or environ.get("HOSTNAME") or socket.gethostname()
        starts = _starts(run, environ.get("TORCHELASTIC_RUN_ID", ""))
        files.write_json(
            run.rank0,
            {
                "host": socket.gethostname(),
                "pod": pod,
                "pid": os.getpid(),
                "node_rank": int(environ.get("GROUP_RANK", "0") or 0),
                "local_rank": int(environ.get("LOCAL_RANK", "0") or 0),
                "run_id": environ.get("TORCHELASTIC_RUN_ID", ""),
                "starts": starts,
                "restarts": starts - 1,
                "started_at": time.time(),
            },
        )
        # A cluster backend finds the pod holding rank 0 by this exact line (its RANK0_LINE).
        print(f"trainmaster: rank 0 on pod {pod}", flush=True)
    return rank


def run_target(target: list[str], workdir: Path) -> None:
    """Run the script or module as __main__ with sys.argv and sys.path as python would set them."""
    if target[0] == "-m":
        sys.argv = [target[1], *target[2:]]
        sys.path.insert(0, str(workdir))
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        return
    script = (workdir / Path(target[0]).expanduser()).resolve()
    sys.argv = [str(script), *target[1:]]
    sys.path.insert(0, str(script.parent))
    runpy.run_path(str(script), run_name="__main__")


def _summary(run: RunPaths, target: list[str], extra: dict[str, object]) -> None:
    """Rank 0's end of a normal run: status and elastic jobs read it (run/state.py)."""
    rank0: object = None
    with contextlib.suppress(OSError, ValueError):
        rank0 = json.loads(run.rank0.read_text(encoding="utf-8"))
    restarts = rank0.get("restarts", 0) if isinstance(rank0, dict) else 0
    files.write_json(
        run.summary,
        {
            "status": "completed",
            "entrypoint": " ".join(target),
            "restarts": restarts,
            "job_retries": goodput.job_retries(),
            "finished_at": time.time(),
            **extra,
        },
    )


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    p = argparse.ArgumentParser(
        prog=f"python -m {MODULE}",
        description="Run a custom job.entrypoint as one worker of a job.",
    )
    p.add_argument("--job", required=True, help="the run's job.toml (STORAGE/runs/JOB/job.toml)")
    p.add_argument("--storage", required=True, help="storage root")
    p.add_argument("--workdir", required=True, help="where relative scripts and modules are found")
    p.add_argument("target", nargs=argparse.REMAINDER, help="-- SCRIPT|-m MODULE [ARGS...]")
    args = p.parse_args(argv)
    target = args.target[1:] if args.target[:1] == ["--"] else args.target
    if not target or target == ["-m"]:
        p.error("give the script or -m MODULE after --")
    run = RunPaths(Path(args.job).resolve().parent)
    rank = prepare(run, args.storage)
    from trainmaster.train import scriptnet  # worker side only (pyproject: the one allowed edge)

    # No collections while the preflight imports torch, and what exists when the script starts
    # (torch's modules, the shim) is frozen: the script's next imports (DDP alone pulls in
    # torch._dynamo and sympy, ~900 modules) would otherwise make the collector walk torch's
    # hundreds of thousands of objects again and again, 0.2-0.4 s of CPU per worker before its
    # first step. Frozen objects live for the whole process anyway; the script's own are
    # collected as usual.
    gc.disable()
    try:
        net = scriptnet.start(Path(args.job), run, started)
    except UserError as exc:  # a node failed its preflight: one line, every rank, no traceback
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    gc.freeze()
    gc.enable()
    code: object = 0
    try:
        run_target(target, Path(args.workdir))
    except SystemExit as exc:
        code = exc.code
    code = net.finish(code)
    if code in (0, None):
        _finished(run)
        if rank == 0:
            _summary(run, target, net.summary_fields())
        return 0
    raise SystemExit(code)


if __name__ == "__main__":
    sys.exit(main())
