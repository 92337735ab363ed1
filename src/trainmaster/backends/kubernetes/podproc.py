"""A pod's first process running its command as a child (cache_hold, publish).

Kubernetes stops a pod with SIGTERM to its first process: that process passes the signal on
and waits for the command to end, and the command's exit code is the pod's.
"""

from __future__ import annotations

import signal
import subprocess
import sys

CANNOT_START = 127  # the shell's code for a command it cannot run


def start(command: list[str]) -> subprocess.Popen[bytes] | None:
    """The command as a child, SIGTERM and SIGINT passed on to it; None (said on stderr) when
    it cannot start."""
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"error: {command[0]}: {exc}", file=sys.stderr)
        return None
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    return child


def exit_code(code: int) -> int:
    """A child's return code as the shell reports it: 128 + N when signal N killed it."""
    return code if code >= 0 else 128 - code
