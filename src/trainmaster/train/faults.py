"""Fault injection for the end-to-end tests, kept out of the code paths it breaks.

`python -m trainmaster.train` calls install() before training; it does nothing unless a test
set TRAINMASTER_FAULT_KILL_IN_CHECKPOINT=N, which SIGKILLs rank 0 half-way through writing
checkpoint N (checkpoint.mid_save_hooks), once per job, to prove the previous one survives.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Mapping
from pathlib import Path

from trainmaster.train import checkpoint

KILL_IN_CHECKPOINT_ENV = "TRAINMASTER_FAULT_KILL_IN_CHECKPOINT"


def kill_in_checkpoint(target: int, folder: Path, step: int) -> None:
    """Once is kept by a marker file, not by TORCHELASTIC_RESTART_COUNT: an agent that restarts
    its workers for a membership change does not count a restart, so that count can be 0 again
    after a kill."""
    marker = folder / f".fault-injected-{step}"
    if step == target and not marker.exists():
        marker.touch()
        os.kill(os.getpid(), signal.SIGKILL)


def install(environ: Mapping[str, str] = os.environ) -> None:
    target = environ.get(KILL_IN_CHECKPOINT_ENV)
    if target:
        checkpoint.mid_save_hooks.append(functools.partial(kill_in_checkpoint, int(target)))
