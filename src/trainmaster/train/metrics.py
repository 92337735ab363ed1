"""What rank 0 tells the world (docs/architecture.md 3.5): metrics.jsonl, TensorBoard,
log lines, summary.

One JSON object per optimizer step is appended to runs/JOB/metrics.jsonl and the same scalars
go to TensorBoard (runs/JOB/tensorboard/). A resumed run first drops the lines (and, through
purge_step, the TensorBoard events) of steps after its checkpoint, so no step appears twice.

MFU = seq/s x FLOPs per sequence / (world size x peak per worker); FLOPs per sequence count the
masked-positions head (model.flops_per_seq, head="masked"). The peak is TRAINMASTER_PEAK_TFLOPS
when set (a measured per-worker peak, e.g. from bench/train_throughput.py), else the catalog's
for the job's instance type or for the local GPU by its name; with none (a generic CPU host)
mfu is null.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from trainmaster import catalog, files
from trainmaster.run import goodput, segments
from trainmaster.run import metrics as runlog
from trainmaster.storage import RunPaths

PEAK_ENV = "TRAINMASTER_PEAK_TFLOPS"
KEYS = (
    "step",
    "loss",
    "mlm_loss",
    "nsp_loss",
    "lr",
    "grad_norm",
    "seq_per_s",
    "tokens_per_s",
    "mfu",
    "elapsed_s",
)


def peak_tflops_per_worker(catalog_value: float, device: str = "") -> float:
    """TRAINMASTER_PEAK_TFLOPS when set (a peak you measured, or one for a card the catalog
    takes for another); else the job's node type's; else the catalog's for the device by its
    name (a local job on a GPU: "NVIDIA H200"); else 0 (MFU not known)."""
    raw = os.environ.get(PEAK_ENV, "")
    try:
        given = max(0.0, float(raw)) if raw else 0.0
    except ValueError:
        given = 0.0
    if given > 0:
        return given
    if catalog_value > 0:
        return catalog_value
    known = catalog.peak_for_device(device) if device else None
    return known[0] if known is not None else 0.0


def mfu(seq_per_s: float, flops_per_seq: float, world: int, peak_tflops: float) -> float | None:
    if peak_tflops <= 0:
        return None
    return seq_per_s * flops_per_seq / (world * peak_tflops * 1e12)


def write_rank0(run: RunPaths, *, node_rank: int, local_rank: int, device: str = "") -> None:
    files.write_json(
        run.rank0,
        {
            "host": socket.gethostname(),
            "pod": os.environ.get("POD_NAME") or os.environ.get("HOSTNAME"),
            "pid": os.getpid(),
            "node_rank": node_rank,
            "local_rank": local_rank,
            "started_at": time.time(),
            "device": device,  # the accelerator's name, when it has one ("NVIDIA H200")
        },
        indent=1,
    )


def log(message: str) -> None:
    print(message, flush=True)


class MetricsLog:
    """Rank 0's writer; created only on rank 0. open() starts the files, close() ends them."""

    def __init__(
        self,
        run: RunPaths,
        *,
        start_step: int,
        started: float,
        flops_per_seq: float,
        peak_tflops: float,
        world: int,
        global_batch: int,
        seq_len: int,
    ) -> None:
        self.run, self.started, self.world = run, started, world
        self.flops, self.peak = flops_per_seq, peak_tflops
        self.global_batch, self.seq_len = global_batch, seq_len
        self.start_step = start_step
        self.rows: list[dict[str, Any]] = []
        self._file: TextIO | None = None
        self._tb: Any = None

    def open(self) -> MetricsLog:
        """A resumed run's rows and events after its checkpoint go (it trains those steps again)."""
        return self._reopen(self.start_step, tensorboard=True)

    def step(
        self,
        *,
        step: int,
        loss: float,
        mlm_loss: float,
        nsp_loss: float,
        lr: float,
        grad_norm: float,
        step_s: float,
    ) -> dict[str, Any]:
        seq_per_s = self.global_batch / step_s if step_s > 0 else 0.0
        row: dict[str, Any] = {
            "step": step,
            "loss": loss,
            "mlm_loss": mlm_loss,
            "nsp_loss": nsp_loss,
            "lr": lr,
            "grad_norm": grad_norm if math.isfinite(grad_norm) else None,
            # workers of this step and its batch (micro-batch x accumulation x workers): an
            # elastic job keeps the batch when it runs on fewer nodes
            "world": self.world,
            "global_batch": self.global_batch,
            "seq_per_s": round(seq_per_s, 3),
            "tokens_per_s": round(seq_per_s * self.seq_len, 1),
            "mfu": mfu(seq_per_s, self.flops, self.world, self.peak),
            "elapsed_s": round(time.time() - self.started, 3),
        }
        self.rows.append(row)
        assert self._file is not None, "MetricsLog.open() first"
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key in KEYS[1:]:
                if isinstance(row[key], (int, float)):
                    self._tb.add_scalar(key, row[key], step)
        log(
            f"step {step} loss {loss:.4f} lr {lr:.2e} seq/s {seq_per_s:.1f} "
            f"grad_norm {grad_norm:.3f}"
        )
        return row

    def summary(self, **fields: Any) -> dict[str, Any]:
        """summary.json: the rates over every trainer process of this launch (a restarted
        trainer's own rows would leave out the steps before its restart; an earlier launch's,
        perhaps on other nodes, are not this one's: its world_size and steps_this_run)."""
        events = goodput.read(self.run.timeline)
        resumed = goodput.resume_steps(events, goodput.launched_at_from())
        since = resumed[0] if resumed else self.rows[0]["step"] - 1 if self.rows else 0
        rows = [r for r in runlog.read_jsonl(self.run.metrics) if _after(r, since)] or self.rows
        each = segments.segments(rows, resumed)
        speeds = [
            float(r["seq_per_s"]) for r in rows if segments.number(r.get("seq_per_s")) is not None
        ]
        # each process's first step includes its warm-up / compilation
        steady = [float(r["seq_per_s"]) for seg in each for r in (seg[1:] or seg)
                  if segments.number(r.get("seq_per_s")) is not None]  # fmt: skip
        avg = sum(steady) / len(steady) if steady else None
        out = {
            **fields,
            "avg_seq_per_s": round(avg, 3) if avg is not None else None,
            "peak_seq_per_s": max(speeds) if speeds else None,
            "avg_mfu": mfu(avg, self.flops, self.world, self.peak) if avg else None,
            "flops_per_seq": self.flops,
            "flops_convention": "6*N_enc*S + 12*L*S^2*d + 6*(d^2+d*V)*max_pred (masked head)",
        }
        files.write_json(self.run.summary, out, indent=1)
        return out

    def rollback(self, step: int) -> None:
        """Back to STEP (a divergence rolled back): its later rows and TensorBoard events go, as
        a resumed run's do, so that no step appears twice; rollbacks.jsonl keeps the bad one."""
        self._reopen(step, tensorboard=self._tb is not None)

    def _reopen(self, step: int, *, tensorboard: bool) -> MetricsLog:
        self.close()
        runlog.truncate_after(self.run.metrics, step)
        self._file = open(self.run.metrics, "a", encoding="utf-8")  # noqa: SIM115 - in close()
        self.rows = [r for r in self.rows if r["step"] <= step]
        if tensorboard:
            self._tb = _summary_writer(self.run.tensorboard, purge_step=step + 1)
        return self

    def close(self) -> None:
        """Safe twice (the loop closes it at its end, the trainer's setup again)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _after(row: dict[str, Any], step: int) -> bool:
    value = segments.number(row.get("step"))
    return value is not None and value > step


def _summary_writer(folder: Path, purge_step: int) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print(
            "warning: tensorboard is not installed; no TensorBoard events are written "
            "(pip install tensorboard)",
            file=sys.stderr,
            flush=True,
        )
        return None
    return SummaryWriter(log_dir=str(folder), purge_step=purge_step)


def last_logged_loss(path: Path) -> float | None:
    """A run that had nothing left to do reports the loss its predecessor logged last."""
    if not path.exists():
        return None
    for line in reversed(path.read_text(encoding="utf-8").splitlines()):
        with contextlib.suppress(ValueError):
            return float(json.loads(line)["loss"])
    return None
