"""What the benchmarks share: the built-in corpus in a temp storage root, the machine, the output.

Imported by the scripts in this folder (`python bench/NAME.py` puts it on sys.path).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

NOISE = "shared machine: other work may be running; figures are indicative"


def prepare_corpus(root: Path, *, shards: int, extra: tuple[str, ...] = ()) -> None:
    """The built-in corpus as shards under root/datasets/pydoc (a storage root)."""
    cmd = [sys.executable, "-m", "trainmaster", "data", "prepare", "--builtin", "pydoc", "--output",
           str(root / "datasets" / "pydoc"), "--shards", str(shards), "--dupe-factor", "1", "--quiet",
           *extra]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": metadata.version("torch"), "note": NOISE}


def emit(report: dict[str, Any], out: Path | None, indent: int = 2) -> None:
    """One JSON object on stdout (and in `out`, when given)."""
    text = json.dumps(report, indent=indent)
    print(text)
    if out:
        out.write_text(text + "\n")
