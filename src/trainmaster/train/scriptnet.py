"""The built-in trainer's safety net for your own script, run by the entry shim
(docs/architecture.md 5: 26).

launch/entry.py runs the script in its own process (runpy); before that it calls start(), which

1. records the process start in timeline.jsonl (rank 0), so `report` splits a custom script's
   wall time as it does the trainer's (run/goodput.py);
2. runs the node preflight (health.py, the trainer's checks) on a process group of its own and
   destroys it again before the script makes its own. The group's store keys live under their
   own prefix, and rank 0's TCP store is kept open for the life of the process: torch's env://
   store on rank 0 is multi-tenant, so the script's init_process_group shares that server
   instead of binding the port again while peers may still talk to a dying one. A failing node
   raises the UserError that names node, host and check (`status` shows it);
3. starts the hang watchdog (watchdog.py), armed by the first progress: every log_metrics(step)
   or heartbeat() of trainmaster.worker, on every rank;
4. makes itself trainmaster.worker.net, through which the helpers report progress, checkpoints,
   the resume step and preemption votes.

Preemption follows preempt.py with one difference: SIGTERM is caught only once the script has
asked preempted() (a script that never asks dies on SIGTERM as before). After preempted() said
yes the script saves and ends; finish() records it in preemptions.jsonl (rank 0) and the process
exits EXIT_PREEMPTED. Nothing here imports torch at module level: only the preflight needs it.
"""

from __future__ import annotations

import datetime
import gc
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainmaster import worker
from trainmaster.run import checkpoints, divergence, goodput
from trainmaster.storage import RunPaths
from trainmaster.train import nodefault, preempt
from trainmaster.train.scriptsettings import Settings, settings
from trainmaster.train.watchdog import Watchdog

STORE_PREFIX = "trainmaster-preflight"  # the preflight group's keys: never the script's default_pg
FAULT_PREFIX = "TRAINMASTER_FAULT_"  # tests only (faults.py), e.g. a node computing wrong numbers
_kept: list[Any] = []  # rank 0's preflight store: its server stays up for the script (docstring)


class Net:
    """One per worker process: what trainmaster.worker's helpers report, turned into watchdog
    beats (every rank), timeline events (rank 0) and, at the end, a preemption record."""

    def __init__(
        self,
        run: RunPaths,
        *,
        rank: int,
        node: int,
        hang_timeout: float | None,
        device: str = "auto:0",
        on_divergence: str = "rollback",
    ) -> None:
        self.run, self.rank, self.on_divergence = run, rank, on_divergence
        self.timeline = run.timeline if rank == 0 else None
        self.watchdog = Watchdog(
            logs=run.logs,
            hangs=run.hangs,
            rank=rank,
            node=node,
            configured=hang_timeout,
            on_hang=nodefault.hang_action(device),
        )
        self.preemption: preempt.Preemption | None = None
        self.stopping_at: float | None = None  # when preempted() first said yes
        self.step: int | None = None  # the last step reported
        self.mark = time.time()  # the end of the last step or checkpoint: the next one's start
        self.saved: int | None = None  # the last checkpoint_saved step
        self._resumed = False

    def record(self, event: str, **fields: Any) -> None:
        if self.timeline is not None:
            goodput.record(self.timeline, event, **fields)

    def progress(self, step: int | None) -> None:
        now = time.time()
        if step is None:
            step = (self.step or 0) + 1
        if self.step is not None and step <= self.step:  # a second row of one step: alive
            self.watchdog.beat(self.watchdog.step)
            return
        if self.step is None:  # the first step carries start-up (compile, caches): no window
            self.record("steps", t=now, end=now, first=step, last=step)
            self.watchdog.beat(step)
        else:
            self.record("steps", t=self.mark, end=now, first=self.step + 1, last=step)
            self.watchdog.beat(step, (now - self.mark) / (step - self.step))
        self.watchdog.where = f"after step {step}"
        self.step, self.mark = step, now

    def loss(self, step: int, value: Any) -> None:
        """A non-finite loss logged: the job stops (run/divergence.py; a script has no rollback
        of ours, so `rollback` stops it too), one line, exit EXIT_DIVERGED, unless `off`."""
        if self.on_divergence == "off" or type(value) not in (int, float) or math.isfinite(value):
            return
        bad = divergence.Verdict(step, "non-finite loss", float(value), None)
        newest = checkpoints.newest_named(self.run.checkpoints)
        line = divergence.stop_line(bad, newest, f"rank {self.rank}'s script logged it")
        launch = divergence.launch_of(os.environ)
        divergence.record(
            self.run.rollbacks, bad, action="stop", to=newest, launch=launch, line=line
        )
        print(f"trainmaster: {line}", file=sys.stderr, flush=True)
        raise SystemExit(divergence.EXIT_DIVERGED)

    def checkpoint_saved(self, step: int) -> None:
        """Training stood still since the last step for this save (log before saving)."""
        now = time.time()
        self.record("checkpoint", t=self.mark, end=now, step=step, saved=True)  # complete
        self.mark, self.saved = now, step
        self.watchdog.beat(self.watchdog.step)
        self.watchdog.where = f"after the checkpoint of step {step}"

    def resumed(self, step: int) -> None:
        if not self._resumed:
            self._resumed = True
            self.record("resume", t=time.time(), step=step)

    def sigterm(self) -> bool:
        if self.preemption is None:  # the first preempted(): from now on SIGTERM is a note
            self.preemption = preempt.Preemption().install()
        return self.preemption.requested_at is not None

    def preempting(self) -> None:
        if self.stopping_at is None:
            self.stopping_at = time.time()

    def finish(self, code: object) -> object:
        """The script ended with `code`: stop watching; after an agreed preemption a clean end
        (0 or 143) is a preemption, recorded as the trainer records one."""
        self.watchdog.stop()
        if self.stopping_at is None or code not in (0, None, preempt.EXIT_PREEMPTED):
            return code
        step = self.saved if self.saved is not None else (self.step or 0)
        requested = self.preemption.requested_at if self.preemption else None
        if self.rank == 0:
            preempt.record(
                self.run.preemptions,
                step=step,
                requested_at=requested,
                saved_s=time.time() - self.stopping_at,
            )
        what = preempt.Preempted(step) if self.saved == step else f"preempted after step {step}"
        print(f"trainmaster: {what}", flush=True)
        return preempt.EXIT_PREEMPTED

    def summary_fields(self) -> dict[str, Any]:
        """Rank 0 at a completed run: summary.json's goodput, as the trainer writes it."""
        if self.timeline is None:
            return {}
        return {
            "steps": self.step,
            "preemptions": len(preempt.read(self.run.preemptions)),
            **goodput.summary_fields(self.timeline, self.step or 0),
        }


def start(
    job_file: Path, run: RunPaths, started: float, environ: Mapping[str, str] = os.environ
) -> Net:
    """Everything before the script's first line (module docstring). Raises UserError when a
    node fails its preflight; the job file may be missing (the shim run by hand or in tests)."""
    cfg = settings(job_file) if job_file.exists() else None
    device = cfg.device if cfg else "auto"
    net = Net(
        run,
        rank=int(environ.get("RANK", "0") or 0),
        node=int(environ.get("GROUP_RANK", "0") or 0),
        hang_timeout=cfg.hang_timeout if cfg else None,
        on_divergence=cfg.on_divergence if cfg else "rollback",
        device=f"{device}:{environ.get('LOCAL_RANK', '0') or 0}" if device != "cpu" else "cpu",
    )
    net.record("start", t=started, compiles=False)
    if cfg is not None and cfg.preflight:
        t0 = time.time()
        nodes = preflight(cfg, run, environ)
        if nodes:
            net.record("preflight", t=t0, end=time.time(), nodes=len(nodes))
    net.mark = time.time()
    worker.net = net
    net.watchdog.start()
    return net


def _newest_mb(folder: Path) -> float:
    """The newest checkpoint's size (the disk check's unit); 0 before the first one."""
    newest = worker.latest_checkpoint({worker.CHECKPOINT_DIR_ENV: str(folder)})
    if newest is None:
        return 0.0
    files = [newest] if newest.is_file() else [p for p in newest.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 1e6


def preflight(cfg: Settings, run: RunPaths, environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """health.run on a process group of the shim's own, destroyed before the script runs.
    Skipped without torchrun (no peers) and on XLA (torch_xla's process group is made once per
    process: the script's own)."""
    import torch.distributed as dist

    from trainmaster.train import health
    from trainmaster.train.device import DEFAULT_TIMEOUT_S, TIMEOUT_ENV, Runtime, resolve_kind
    from trainmaster.train.env import Env

    env = Env.read(environ)
    kind = resolve_kind(cfg.device)
    if not env.launched or kind == "xla":
        return []
    if any(k.startswith(FAULT_PREFIX) for k in environ):
        from trainmaster.train import faults  # imports the trainer: only when a test asks

        faults.install(environ)
    # The collection after the checks needs only the objects made since: torch's import left
    # hundreds of thousands, and a full collection of them cost each worker about 0.1 s of CPU.
    gc.freeze()
    store = None
    if env.world_size > 1:
        timeout = datetime.timedelta(seconds=float(environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))
        agent = environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # as torch's env:// does
        tcp = dist.TCPStore(
            environ["MASTER_ADDR"],
            int(environ["MASTER_PORT"]),
            env.world_size,
            is_master=env.rank == 0 and not agent,
            timeout=timeout,
            multi_tenant=not agent,
        )
        _kept.append(tcp)
        store = dist.PrefixStore(STORE_PREFIX, tcp)
    rt = Runtime(env, kind, bf16=False, store=store)
    try:
        every = health.run(
            rt,
            inst=cfg.instance,
            node=env.node_rank,
            local_rank=env.local_rank,
            local_workers=env.local_world_size,
            checkpoints=run.dir,
            params=0,
            keep=cfg.keep_checkpoints,
            on_aws=health.on_aws_node(),
            checkpoint_mb=_newest_mb(run.checkpoints),
        )
    finally:
        del rt
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.collect()  # the group's last tensors, before the script's group starts
        gc.unfreeze()  # the script's collections see everything again
    nodes = health.per_node(every)
    if env.rank == 0:
        for node in nodes:
            print(health.describe(node), flush=True)
    return nodes
