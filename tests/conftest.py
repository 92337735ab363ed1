"""Shared fixtures: run the real `trainmaster` command in a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m trainmaster ARGS` as a user would run it (no in-process shortcuts)."""
    full_env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "trainmaster", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sigint_default() -> None:
    """preexec_fn of a child the test Ctrl-Cs: SIGINT handled as in a terminal. A test run
    started in the background of a non-interactive shell inherits SIGINT ignored (POSIX), and
    Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll another process's progress until cond() holds; AssertionError after timeout s."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)  # polling another process's progress, bounded


@pytest.fixture
def cli():  # type: ignore[no-untyped-def]
    return run_cli


@pytest.fixture(scope="session")
def pydoc_storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A storage root holding the built-in corpus as shards (datasets/pydoc), made once.

    Small on purpose (one duplicate, a 4k vocabulary) so that jobs start in seconds.
    """
    root = tmp_path_factory.mktemp("storage")
    result = run_cli(
        "data",
        "prepare",
        "--builtin",
        "pydoc",
        "--output",
        str(root / "datasets" / "pydoc"),
        "--shards",
        "4",
        "--dupe-factor",
        "1",
        "--vocab-size",
        "4096",
        "--seq-len",
        "128",
        "--quiet",
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return root


def etcd_available() -> bool:
    import shutil

    return shutil.which("etcd") is not None
