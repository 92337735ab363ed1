"""Checkpoint writes in the background, so that a save does not stall training
(docs/architecture.md 5: 14.5).

The training thread stages a checkpoint (checkpoint.stage: a private CPU copy, a memory copy
long) and hands it here; a thread writes it (checkpoint.write: files, fsync, rename) while
training goes on. The guarantees of a synchronous save are kept:

- a half-written checkpoint is never taken for a good one: write() is the same atomic
  temporary-folder-then-rename as before, so a kill mid-write leaves a .tmp-* folder that
  readers ignore, and the previous complete checkpoint;
- at most one write is in flight: submit() (and the trainer, before staging, so that at most
  one staged copy is held) first waits for the previous write;
- the last write completes before the trainer exits: it calls wait() before its summary;
- a write that failed fails training at the next wait(), with the writer's exception, as a
  synchronous save would have (torchrun then restarts it from the last good checkpoint).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainmaster.train import checkpoint

# Set (to anything) to wait for every write before training goes on, as a synchronous save
# would: bench/checkpoint_cost.py measures what the background write saves against it.
SYNC_ENV = "TRAINMASTER_CHECKPOINT_SYNC"


@dataclass(frozen=True)
class Written:
    step: int
    path: Path
    started: float  # time.time() when the write began
    seconds: float
    bytes: int

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


class BackgroundWriter:
    """Rank 0's writer of checkpoints, one thread per write, one write at a time."""

    def __init__(
        self, folder: Path, keep: int, on_written: Callable[[Written], None] | None = None
    ) -> None:
        self.folder, self.keep, self.on_written = folder, keep, on_written
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        # The step of the write that wait() is waiting for, while it waits (read by the tests
        # to see that a second save waits for the first rather than overlap it).
        self.waiting_for: int | None = None
        self._step: int | None = None

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, staged: checkpoint.Staged) -> None:
        """Start writing `staged` once the previous write is done; returns without waiting."""
        self.wait()
        self._step = staged.step
        self._thread = threading.Thread(
            target=self._write, args=(staged,), name=f"checkpoint-writer-{staged.step}", daemon=True
        )
        self._thread.start()

    def wait(self) -> None:
        """Block until no write is in flight; raise the exception of one that failed."""
        if self._thread is not None:
            self.waiting_for = self._step
            try:
                self._thread.join()
            finally:
                self.waiting_for = None
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _write(self, staged: checkpoint.Staged) -> None:
        started, t0 = time.time(), time.perf_counter()
        try:
            path, size = checkpoint.write(self.folder, staged, self.keep)
            done = Written(staged.step, path, started, time.perf_counter() - t0, size)
            if self.on_written is not None:
                self.on_written(done)
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread by wait()
            self._error = exc
