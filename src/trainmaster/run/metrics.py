"""`log_metrics(step=..., **values)`: one row of metrics.jsonl from your own training script.

    from trainmaster.api import log_metrics      # or: from trainmaster.run.metrics import log_metrics
    log_metrics(step=step, loss=loss.item(), tokens_per_s=tps)

The format (docs/architecture.md 3.5), read by `status`, `report` and `top`:
runs/JOB/metrics.jsonl holds one JSON object per line, each with an integer `step` and any
number of other values (numbers, strings, null). The built-in trainer's rows also carry loss,
lr, seq_per_s, elapsed_s...; the readers show whatever a row has.

Only rank 0 writes (RANK from torchrun; every other rank returns at once), so a script may call
it on every rank. A row is one write of one line to a file opened for appending (O_APPEND):
POSIX puts it at the end of the file in one piece, so a reader sees whole lines (a torn last
line after a crash is skipped by the readers). `elapsed_s` is added when the row has none,
seconds since this process imported this module: the readers split a run into restart segments
where it goes back. No torch, no pydantic: importing this costs nothing.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainmaster import files
from trainmaster.storage import RunPaths

RUN_DIR_ENV = "TRAINMASTER_RUN_DIR"
METRICS_FILE = RunPaths(Path()).metrics.name  # storage.py's name, also ./ when run by hand
_STARTED = time.time()


def metrics_path(environ: Mapping[str, str] = os.environ) -> Path | None:
    """$TRAINMASTER_RUN_DIR/metrics.jsonl, or None when not started by trainmaster."""
    run_dir = environ.get(RUN_DIR_ENV)
    return Path(run_dir) / METRICS_FILE if run_dir else None


def _value(key: str, value: Any) -> Any:
    """JSON-safe: numbers (NaN/inf become null: JSON has none), str, bool, None; a tensor or
    numpy scalar through .item()."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"log_metrics: {key}={value!r} is not a number or a string")


def log_metrics(
    step: int, *, environ: Mapping[str, str] = os.environ, **values: Any
) -> dict[str, Any] | None:
    """Append {"step": step, **values} to metrics.jsonl on rank 0; returns the row written
    (None on other ranks). Outside a trainmaster run (no $TRAINMASTER_RUN_DIR) it writes
    ./metrics.jsonl, so a script also works when started by hand."""
    if int(environ.get("RANK", "0") or 0) != 0:
        return None
    if isinstance(step, bool) or not isinstance(step, int):
        step = int(_value("step", step))
    row: dict[str, Any] = {"step": step}
    row |= {k: _value(k, v) for k, v in values.items()}
    row.setdefault("elapsed_s", round(time.time() - _STARTED, 3))
    path = metrics_path(environ) or Path(METRICS_FILE)
    line = (json.dumps(row, separators=(", ", ": ")) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return row


def drop_after(step: int, *, environ: Mapping[str, str] = os.environ) -> int:
    """A script that resumes from its checkpoint at `step` calls this first (rank 0 only, like
    log_metrics): rows of later steps, logged before the restart, are dropped so that no step
    appears twice. Returns how many lines were dropped."""
    path = metrics_path(environ) or Path(METRICS_FILE)
    if int(environ.get("RANK", "0") or 0) != 0 or not path.exists():
        return 0
    return truncate_after(path, step)


def truncate_after(path: Path, step: int) -> int:
    """Keep the lines of steps <= step (a torn or unreadable line goes too); returns how many
    were dropped. The file is replaced whole (temp file + rename), never left half-written."""
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
            keep = isinstance(row, dict) and int(row.get("step", 0)) <= step
        except (ValueError, TypeError):
            keep = False
        if keep:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        files.write_atomic(path, "".join(f"{line}\n" for line in kept))
    return dropped


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a one-object-per-line file (metrics.jsonl, timeline.jsonl, hangs.jsonl,
    preemptions.jsonl): a missing file is empty; a torn last line (a killed writer) and lines
    of another shape are skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out
