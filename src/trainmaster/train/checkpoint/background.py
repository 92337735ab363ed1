"""Checkpoint writes in a separate process, so that a save stalls training for one memory copy
(docs/architecture.md 5: 14.5).

A writer thread in the trainer still competed with training for the GIL (torch.save pickles
and writes in Python; `python bench/checkpoint_cost.py` measures the cost per step, bench/README.md
keeps the figures).
So rank 0 copies the staged state into a shared buffer (staging; copy_ releases the GIL) while
the next step's forward and backward run, and hands it to a long-lived writer process
(writerproc), which runs saving.write() on it.
The trainer starts it while it starts up itself, so that the writer's own start (a Python and
torch) is not paid by the first save. The guarantees of a synchronous save are kept:

- a half-written checkpoint is never taken for a good one: write() is the same atomic
  temporary-folder-then-rename as before, so a kill mid-write (of the trainer, the writer or
  both) leaves a .tmp-* folder that readers ignore, and the previous complete checkpoint; a
  writer whose trainer died drops its write rather than publish it (writerproc);
- at most one write is in flight, and the buffer is not touched while it is: submit() (and
  the trainer, before staging) first waits for the previous write;
- a checkpoint holds the values of its step: the optimizer's next update waits for the copy
  (before_update(); on a GPU the training stream waits on the GPU, the host does not);
- the last write completes before the trainer exits: it calls wait() before its summary;
- a write that failed fails training at the next wait(), with the writer's exception, as a
  synchronous save would have (torchrun then restarts it from the last good checkpoint); a
  writer process that died fails it with WriterDied, which names the process and the signal.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from trainmaster.train.checkpoint import saving, staging

# Set (to anything) to wait for every write before training goes on, as a synchronous save
# would: bench/checkpoint_cost.py measures what the background write saves against it.
SYNC_ENV = "TRAINMASTER_CHECKPOINT_SYNC"


class WriterDied(RuntimeError):
    pass


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
    """Rank 0's writer of checkpoints: one writer process, one write at a time."""

    def __init__(
        self, folder: Path, keep: int, on_written: Callable[[Written], None] | None = None
    ) -> None:
        self.folder, self.keep, self.on_written = folder, keep, on_written
        self._proc: subprocess.Popen[bytes] | None = None
        self._arena: staging.Arena | None = None
        self._fd = -1
        self._commands: Connection | None = None
        self._answers: queue.Queue[tuple[Any, ...]] = queue.Queue()
        # The step of the write that wait() is waiting for, while it waits (read by the tests
        # to see that a second save waits for the first rather than overlap it).
        self.waiting_for: int | None = None
        self._step: int | None = None
        self._fill: staging.Fill | None = None  # the last submit's copy, until before_update
        self._stalls: list[tuple[int, staging.Fill]] = []  # timed GPU waits not yet read
        self._copying: staging.Fill | None = None  # the same, until the block is unmapped

    @property
    def busy(self) -> bool:
        return self._step is not None and self._answers.empty()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def submit(self, staged: saving.Staged) -> None:
        """Copy `staged` into the shared buffer once the previous write is done and have the
        writer process write it; returns without waiting for the copy (staging.Fill) or the
        write. Call before_update() before the optimizer changes the staged tensors."""
        self.wait()
        skeleton, tensors = staging.flatten(
            (staged.model, staged.trainer, staged.ranks, staged.meta)
        )
        layout, size = staging.layout_of(tensors)
        if self._proc is None:
            self.start()
        if self._arena is None or self._arena.layout != layout:  # the first save, as a rule
            if self._arena is not None:
                self._arena.close()
            os.ftruncate(self._fd, size)
            self._arena = staging.Arena(self._fd, size, layout)
        assert self._commands is not None
        request = (staged.step, str(self.folder), self.keep, size, layout, skeleton)
        message = pickle.dumps((*request, saving.mid_save_hooks, saving.publish_guards))
        commands, answers = self._commands, self._answers

        def send() -> None:  # the bytes are in the block: the writer may take them
            try:
                commands.send_bytes(message)
            except OSError:
                pass  # the writer is gone: its listener says so
            except Exception as exc:  # e.g. the pipe closed under us: wait() must not hang
                failed(exc)

        def failed(exc: BaseException) -> None:  # wait() raises it, as a failed write
            answers.put(("error", exc, "".join(traceback.format_exception(exc))))

        fill = staging.Fill(self._arena, tensors, then=send, failed=failed)
        self._fill = self._copying = fill.start()
        self._step = staged.step  # once a Fill exists: an answer will come

    def before_update(self) -> float | None:
        """Before the optimizer changes the tensors of the last submit(): wait for their copy
        into the block (on a GPU, the training stream waits). The seconds waited here, or
        None when no copy was pending (the trainer counts the wait as checkpoint time)."""
        fill, self._fill = self._fill, None
        if fill is None:
            return None
        waited = fill.before_update()
        if fill.stall_pending and self._step is not None:  # its step: wait() clears both
            self._stalls.append((self._step, fill))
        return waited

    def gpu_stalls(self) -> list[tuple[int, float]]:
        """(step, seconds) of each save whose copy the training stream stood waiting for on
        the GPU (where the host only queues the wait), once the GPU has got past it: call it
        after a host sync. Each is given once."""
        done = []
        for step, fill in self._stalls:
            seconds = fill.gpu_stall_s()
            if seconds is not None:
                done.append((step, seconds))
        self._stalls = [(step, fill) for step, fill in self._stalls if fill.stall_pending]
        return done

    def wait(self) -> None:
        """Block until no write is in flight; raise the exception of one that failed."""
        self._fill = None  # an answer comes after the copy: nothing to wait for before updates
        if self._step is None:
            return
        step, self.waiting_for = self._step, self._step
        try:
            answer = self._answers.get()
        finally:
            self.waiting_for, self._step = None, None
        if answer[0] == "died":
            self._stop()
            raise WriterDied(
                f"the checkpoint writer process (pid {answer[1]}) {answer[2]} while writing "
                f"step {step}: that checkpoint was not written (the newest complete one stays)"
            )
        if answer[0] == "error":
            error: BaseException = answer[1]
            error.add_note(f"in the checkpoint writer process, writing step {step}:\n{answer[2]}")
            raise error

    def close(self) -> None:
        """End the writer process (waits for no write: call wait() first to keep it)."""
        self._stop()

    def start(self) -> None:
        """Start the writer process (submit does, if this was not called)."""
        self._stop()
        self._fd = staging.shared_fd()
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        fds = (cmd_r, res_w, self._fd)
        argv = [sys.executable, "-m", "trainmaster.train.checkpoint.writerproc", *map(str, fds)]
        env = os.environ | {"OMP_NUM_THREADS": "1"}
        try:
            proc = subprocess.Popen([*argv, str(os.getpid())], pass_fds=fds, env=env)
        finally:
            os.close(cmd_r)
            os.close(res_w)
        self._proc, self._commands = proc, Connection(cmd_w, readable=False)
        answers = Connection(res_r, writable=False)
        self._answers = queue.Queue()
        threading.Thread(
            target=self._listen, args=(proc, answers, self._answers), daemon=True
        ).start()

    def _listen(
        self, proc: subprocess.Popen[bytes], answers: Connection, into: queue.Queue[Any]
    ) -> None:
        """Reads the writer's answers (blocked in a read, without the GIL); on_written here."""
        while True:
            try:
                answer = pickle.loads(answers.recv_bytes())
            except (EOFError, OSError):
                into.put(("died", proc.pid, _how_it_ended(proc)))
                answers.close()
                return
            if answer[0] == "ok" and self.on_written is not None:
                _, step, path, started, seconds, nbytes = answer
                try:
                    self.on_written(Written(step, Path(path), started, seconds, nbytes))
                except Exception as exc:  # wait() raises it, as the thread did
                    answer = ("error", exc, traceback.format_exc())
            into.put(answer)

    def _stop(self) -> None:
        if self._commands is not None:
            self._commands.close()  # the writer exits at once on its end of file
            self._commands = None
        if self._proc is not None:
            self._proc.wait()
            self._proc = None
        if self._copying is not None:  # a copy may still read or write the block
            self._copying.settle()
            self._copying = None
        if self._arena is not None:
            self._arena.close()
            self._arena = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _how_it_ended(proc: subprocess.Popen[bytes]) -> str:
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        return "stopped answering"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"
