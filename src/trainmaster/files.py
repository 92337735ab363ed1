"""Writing a file so that a reader sees the old one or the new one, never a part of either.

Every small file a reader may open while it is being written (state.json, dataset.json,
vocab.txt, a checkpoint's meta.json, the cache lock, the compile fingerprint, a report) goes
through replacing(): a temporary file in the same folder (a rename is atomic only within one
file system), hidden and ending in .tmp (so `data verify` and the checkpoint readers take it
for what it is), named after this host, process and thread (runs share storage across nodes,
and a process writes from more than one thread); its bytes fsynced before the rename (else a
crash just after could leave the new name on empty blocks); and removed when anything fails,
so no stray temporary is left behind and the old file stays as it was.

Large files written in place by design (HDF5 shards, checkpoint records) have their own
temporary names and folders (data/output.py, run/checkpoints.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def temp_path(path: Path) -> Path:
    """The temporary beside PATH: hidden, unique to this host, process and thread, *.tmp."""
    who = f"{socket.gethostname()}.{os.getpid()}.{threading.get_native_id()}"
    return path.with_name(f".{path.name}.{who}.tmp")


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """Yield a temporary path to write PATH's new content to; on a normal exit it is fsynced
    and renamed over PATH, on an error removed (PATH untouched) and the error raised."""
    tmp = temp_path(path)
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_atomic(path: Path, data: str | bytes) -> None:
    """PATH's whole new content (text as UTF-8, with the newlines given), atomically."""
    with replacing(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


def write_json(path: Path, data: Any, indent: int | None = 2) -> None:
    """DATA as JSON with a final newline, atomically."""
    write_atomic(path, json.dumps(data, indent=indent) + "\n")
