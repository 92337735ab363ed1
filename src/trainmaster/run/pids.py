"""Whether a process is alive: shared by the launcher's state and the compile cache's lock
(which may not import the launcher). Standard library only.

A pid alone does not name a process for long: once it exits, the kernel hands the number to
the next process. A pid recorded with its start time (/proc/PID/stat field 22, in clock ticks
since boot, see proc(5)) names exactly one process: a reused pid has another start time.
"""

from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 on (the command name in field 2 may hold spaces and ')')."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def start_time(pid: int | None) -> int | None:
    """The process's start time (field 22 of /proc/PID/stat); None if it is gone or unknown."""
    if not pid:
        return None
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None  # field 22 is the 20th after field 2
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int | None, started: int | None = None) -> bool:
    """True while the process exists and is not a zombie; with `started` (a recorded
    start_time), only while the pid still belongs to that same process."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = _stat_fields(pid)
    if fields is None:  # no /proc (not Linux): kill(0) is all we know
        return True
    if fields[0] == "Z":  # a zombie (exited, not yet reaped) is dead for our purposes
        return False
    return started is None or start_time(pid) == started
