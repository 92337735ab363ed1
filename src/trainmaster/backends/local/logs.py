"""`trainmaster logs JOB [--rank R] [-f]`: rank 0 by default, found by the tool, not by grepping.

The trainer tees each rank's output into runs/JOB/logs/rankR.log; the node logs (torchrun
agent output, with every local worker's lines) are the fallback for a rank that has no file.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from trainmaster.errors import UserError
from trainmaster.run import state
from trainmaster.storage import RunPaths


def log_file(run: RunPaths, rank: int | None, node: int | None) -> Path:
    if node is not None:
        path = run.logs / f"node{node}.log"
    else:
        path = run.logs / f"rank{rank or 0}.log"
        if not path.exists() and (rank or 0) == 0:
            path = run.logs / "node0.log"
    if not path.exists():
        have = ", ".join(sorted(p.name for p in run.logs.glob("*.log"))) or "none yet"
        raise UserError(f"no log {path.name} (logs: {have})", where=str(run.dir))
    return path


def follow(path: Path, run: RunPaths, poll_s: float = 0.5) -> Iterator[str]:
    """Yield lines as they are written, until the run has ended and the file is drained."""
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        while True:
            line = fh.readline()
            if line:
                yield line
                continue
            if state.observed(run.state).phase in state.FINAL:
                rest = fh.read()
                if rest:
                    yield rest
                return
            time.sleep(poll_s)  # tailing a file written by another process


def first_error(run: RunPaths) -> str | None:
    """The `error: ...` line a worker wrote last (bad input, a failed node preflight), of the
    lowest rank that wrote one: the one line `status` shows for a failed job (the supervisor's
    verdict, ending.py). The newest, since rank logs append across restarts and launches."""
    logs = sorted(
        run.logs.glob("rank*.log"), key=lambda p: int(p.stem[4:]) if p.stem[4:].isdigit() else 0
    )
    for log in logs:
        with log.open(encoding="utf-8", errors="replace") as f:
            errors = [line for line in f if line.startswith("error: ")]
        if errors:
            return errors[-1].removeprefix("error: ").strip()
    return None
