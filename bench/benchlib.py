"""What the benchmarks share: the built-in corpus in a temp storage root, the machine, the output.

Imported by the scripts in this folder (`python bench/NAME.py` puts it on sys.path).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

NOISE = "shared machine: other work may be running; figures are indicative"


def prepare_corpus(root: Path, *, shards: int, extra: tuple[str, ...] = ()) -> None:
    """The built-in corpus as shards under root/datasets/pydoc (a storage root)."""
    cmd = [
        sys.executable,
        "-m",
        "trainmaster",
        "data",
        "prepare",
        "--builtin",
        "pydoc",
        "--output",
        str(root / "datasets" / "pydoc"),
        "--shards",
        str(shards),
        "--dupe-factor",
        "1",
        "--quiet",
        *extra,
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def cpu_s(who: int = resource.RUSAGE_SELF) -> float:
    """User + system CPU seconds so far, of this process (RUSAGE_SELF) or of its children it
    has waited for (RUSAGE_CHILDREN): subtract two readings for what the work between cost."""
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": metadata.version("torch"),
        "note": NOISE,
    }


def emit(report: dict[str, Any], out: Path | None, indent: int = 2) -> None:
    """One JSON object on stdout (and in `out`, when given)."""
    text = json.dumps(report, indent=indent)
    print(text)
    if out:
        out.write_text(text + "\n")


# --- timing a local run to its first step (bench/scale_local.py; launch_overhead.py has its own) --
POLL_S = 0.01


def agent_env(world_size: int) -> dict[str, str]:
    """What the supervisor gives its agents (backends/local/supervisor.py), so a bench's directly
    started torchrun runs the same as `trainmaster launch`: one thread per worker's share."""
    from trainmaster.launch.torchrun import AGENT_ENV

    env = {**os.environ, "PYTHONUNBUFFERED": "1", **AGENT_ENV}
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world_size)))
    return env


def first_step_at(metrics: Path, t0: float, timeout_s: float = 900.0) -> float:
    """Seconds from t0 (time.time()) to rank 0's write of step 1 in metrics.jsonl: that file's
    modification time while it holds one row (polled: another process writes it)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if metrics.exists():
            rows = metrics.read_text().splitlines()
            if len(rows) == 1:
                return metrics.stat().st_mtime - t0
            if rows:  # polled late: the first row's time is not known exactly; now bounds it
                return time.time() - t0
        time.sleep(POLL_S)
    raise SystemExit(f"no first step in {metrics} after {timeout_s:g} s")


def load() -> list[float]:
    """The 1/5/15-minute load averages: how busy the shared machine was around a run."""
    return [round(x, 2) for x in os.getloadavg()]


def wait_final(run_state: Path, timeout_s: float = 900.0) -> str:
    """The phase a job launched by another process ends in (state.json, polled; bounded)."""
    from trainmaster.run import state

    end = time.monotonic() + timeout_s
    while (phase := state.observed(run_state).phase) not in state.FINAL and time.monotonic() < end:
        time.sleep(0.1)  # another process tree's job
    return phase
