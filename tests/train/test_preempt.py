"""SIGTERM handling in the trainer process (docs/architecture.md 5: 14.3): noted, voted, restored."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from trainmaster.train import preempt


def test_sigterm_is_noted_not_obeyed_and_the_old_handler_comes_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    p = preempt.Preemption().install()
    try:
        assert p.flag == 0.0
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to this (main) thread before kill returns
        assert p.flag == 1.0 and p.requested_at is not None
        first = p.requested_at
        os.kill(
            os.getpid(), signal.SIGTERM
        )  # a second SIGTERM (torchrun forwards one) changes nothing
        assert p.requested_at == first
    finally:
        p.uninstall()
    assert signal.getsignal(signal.SIGTERM) == before


def test_records_read_back_and_torn_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "preemptions.jsonl"
    preempt.record(path, step=17, requested_at=12.5, saved_s=0.25)
    with path.open("a") as f:
        f.write('{"step": ')
    [entry] = preempt.read(path)
    assert entry["step"] == 17 and entry["signal_at"] == 12.5 and entry["checkpoint_s"] == 0.25
    assert preempt.EXIT_PREEMPTED == 143
