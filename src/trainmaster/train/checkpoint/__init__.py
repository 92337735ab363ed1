"""Checkpoints of a training run: what the trainer stages, how it is written, how a run resumes.

The trainer uses this face only:
  stage / save / write            stage (collective) the checkpoint's content; save = stage +
                                  write, synchronously; write = rank 0's atomic write of it
  agree_on_resume, load_*         resume: the step every rank agrees on, then model,
                                  optimizer and scheduler, every rank's RNG and data position
  BackgroundWriter, Written       rank 0's writer process: a save costs training one copy
(and the fault tests' hook list, saving.mid_save_hooks, which the writer pickles with each write)

Modules:
  saving      stage, write (temporary folder, fsync, rename), load; the content's layout
  background  BackgroundWriter: the staged tensors copied into the shared block, written by
              the writer process, one write in flight, its failure raised at the next wait
  writerproc  the writer process (`python -m trainmaster.train.checkpoint.writerproc`)
  staging     the shared-memory staging block the trainer and its writer process share
  odirect     a checkpoint file written past the page cache from the staging block
  zipcrc      the CRC-32 fields of a zip that odirect wrote without them

The checkpoints folder itself (which step_N are complete, whose, pruning) is torch-free and
lives with the run folder's other files: run/checkpoints.py. The bespoke writer is measured
against torch.distributed.checkpoint.async_save in bench/checkpoint_vs_dcp.py (bench/README.md
says which was kept and why).
"""

from trainmaster.train.checkpoint.background import SYNC_ENV, BackgroundWriter, WriterDied, Written
from trainmaster.train.checkpoint.saving import (
    Staged,
    agree_on_resume,
    detached,
    load_model,
    load_rank,
    load_trainer,
    save,
    stage,
    trainer_pid,
    write,
)

__all__ = [
    "SYNC_ENV",
    "BackgroundWriter",
    "Staged",
    "WriterDied",
    "Written",
    "agree_on_resume",
    "detached",
    "load_model",
    "load_rank",
    "load_trainer",
    "save",
    "stage",
    "trainer_pid",
    "write",
]
