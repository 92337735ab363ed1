"""A 2-node gloo script whose rank ABORT_RANK (1 unless set) aborts once (os.abort, as torch
2.13's gloo does at exit): after step ABORT_AT, or at the end (0). Used by bench/exit_abort.py
and tests/backends/local/test_exit_abort.py.

At the end means after its last step and destroy_process_group, once the other rank's process
has exited, so that node's agent is in its exit barrier and not still watching a live worker
(that one would restart its workers into the new round, and the job would simply run again). A
marker file makes it abort once: the restarted worker runs to the end.
"""

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from trainmaster import worker

rank, run = int(os.environ["RANK"]), Path(os.environ["TRAINMASTER_RUN_DIR"])
abort_at = int(os.environ["ABORT_AT"])
aborter = int(os.environ.get("ABORT_RANK", "1"))


def abort_once():
    try:
        (run / "aborted").open("x").close()
    except FileExistsError:
        return
    os.abort()


dist.init_process_group("gloo")
t = torch.ones(4)
for step in range(1, int(os.environ["STEPS"]) + 1):
    dist.all_reduce(t)
    worker.log_metrics(step, loss=1.0 / step)
    if rank == aborter and step == abort_at:
        abort_once()
dist.destroy_process_group()
if rank != aborter:
    (run / "peer.pid").write_text(str(os.getpid()))
elif abort_at == 0 and not (run / "aborted").exists():
    while not (run / "peer.pid").exists():
        time.sleep(0.05)  # waiting for the other rank's end (another process), polled
    stat = Path(f"/proc/{(run / 'peer.pid').read_text()}/stat")
    while stat.exists() and stat.read_text().rpartition(")")[2].split()[0] != "Z":
        time.sleep(0.05)  # until it has exited (a zombie until its agent reaps it)
    abort_once()
