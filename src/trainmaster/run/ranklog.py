"""Per-rank log files: runs/JOB/logs/rankR.log, so `trainmaster logs JOB --rank R` needs no grep.

torchrun assigns global ranks at rendezvous, so only the worker knows which rank it is; it
tees its own Python-level stdout and stderr (log lines, warnings, tracebacks) into its rank's
file, appending across restarts, while the agent's stream (node log, pod log) keeps a copy.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO


class _Tee:
    def __init__(self, stream: TextIO, file: TextIO) -> None:
        self._stream, self._file = stream, file

    def write(self, text: str) -> int:
        self._file.write(text)
        self._file.flush()
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()
        self._file.flush()

    def __getattr__(self, name: str) -> object:  # isatty, fileno, encoding ... of the stream
        return getattr(self._stream, name)


def tee_to_rank_file(log_dir: Path, rank: int) -> Path:
    """Duplicate this process's sys.stdout/sys.stderr into log_dir/rank{rank}.log."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"rank{rank}.log"
    fh = path.open("a", encoding="utf-8", buffering=1)
    sys.stdout = _Tee(sys.stdout, fh)
    sys.stderr = _Tee(sys.stderr, fh)
    return path
