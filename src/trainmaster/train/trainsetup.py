"""The trainer's start-up: from the plan to a model, optimizer, schedule and data on the device,
resumed exactly (build), and the services a running trainer needs (TrainerSetup.start): the
SIGTERM handler, the hang watchdog, and on rank 0 the checkpoint writer, the metrics log and
the opening lines.

The order matters for exact resumption: the model is built (same weights on every rank) and
the checkpoint's weights loaded on the CPU, then moved to the device; every rank reseeds its
RNGs for dropout, then a resumed run restores optimizer, schedule and each rank's RNG state.
Constructing a TrainerSetup only holds the parts: build() reads and talks to the other ranks
before it, start() spawns, installs and writes after it, and close() undoes start(), also after
a failure, so that no writer process or SIGTERM handler outlives a setup that failed
(tests/train/test_constructors.py holds every constructor in train/ to this). loop.py's
Trainer runs the steps on a started setup.
"""

from __future__ import annotations

import os
import random
import socket
from types import TracebackType
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from transformers import BertForPreTraining

from trainmaster.run import goodput, peers
from trainmaster.train import checkpoint, health, metrics, nodefault, preempt
from trainmaster.train import model as model_mod
from trainmaster.train.checkpoint import BackgroundWriter, Written, saving
from trainmaster.train.data import ShardLoader
from trainmaster.train.device import Runtime, resolve_kind
from trainmaster.train.metrics import MetricsLog, log, write_rank0
from trainmaster.train.optim import make_optimizer, make_scheduler
from trainmaster.train.preflight import Plan
from trainmaster.train.step import Stepper
from trainmaster.train.watchdog import Watchdog


def build(plan: Plan, started: float) -> TrainerSetup:
    """Everything before the first step that reads (checkpoint, shards) or talks to the other
    ranks (the process group, the resume agreement, the node preflight); nothing started yet."""
    cfg = plan.cfg
    rt = Runtime(plan.env, resolve_kind(cfg.train.device), bf16=cfg.train.precision == "bf16")
    plan = checkpoint.agree_on_resume(plan, rt)
    model = model_mod.build(
        cfg,
        plan.vocab_size,
        rt.options.attn_implementation,
        model_mod.home_of(rt.kind, rt.device),
    )
    if plan.resume is not None:
        checkpoint.load_model(plan.resume.path, model)
    nn.Module.to(model, device=rt.device, dtype=rt.model_dtype())
    if rt.kind == "xla":
        model.tie_weights()  # the XLA device unties them (docs/architecture.md 4)
    checks = _preflight(plan, rt, model) if cfg.train.preflight else []
    # Dropout differs per rank; the weights above are the same on every rank.
    seed = cfg.train.seed + 1 + rt.rank
    rt.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    optimizer = make_optimizer(cfg, model, rt.kind)
    scheduler = make_scheduler(cfg, optimizer)
    start_step = 0
    if plan.resume is not None:
        start_step = checkpoint.load_trainer(plan.resume.path, optimizer, scheduler)
        checkpoint.load_rank(
            plan.resume.path, rt, same_world=plan.resume.meta.get("world_size") == rt.world
        )
    stepper = Stepper(model, optimizer, scheduler, rt, compile=plan.compile)
    loader = ShardLoader(
        [s.path for s in plan.shards],
        rank=rt.rank,
        world=rt.world,
        batch_size=cfg.train.batch_size,
        seed=cfg.train.seed,
        vocab_size=plan.vocab_size,
        start=plan.position,
        first_shard=plan.first_shard or None,
    )
    return TrainerSetup(
        plan,
        started,
        rt=rt,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        stepper=stepper,
        loader=loader,
        start_step=start_step,
        preflight=checks,
    )


def _preflight(p: Plan, rt: Runtime, model: BertForPreTraining) -> list[dict[str, Any]]:
    """Every node's health checks (health.py), before anything is trained; rank 0 logs them."""
    every = health.run(
        rt,
        inst=p.cfg.derived.instance,
        node=p.env.node_rank,
        local_rank=p.env.local_rank,
        local_workers=p.env.local_world_size,
        checkpoints=p.run.dir,
        keep=p.cfg.train.keep_checkpoints,
        params=sum(x.numel() for x in model.parameters()),
        on_aws=health.on_aws_node(),
    )
    nodes = health.per_node(every)
    if rt.rank == 0:
        for node in nodes:
            log(health.describe(node))
    return nodes


class TrainerSetup:
    """What a run holds before its first step, and its services: `with build(...) as setup`
    starts them (start) and stops them again (close), also when training fails."""

    def __init__(
        self,
        plan: Plan,
        started: float,
        *,
        rt: Runtime,
        model: BertForPreTraining,
        optimizer: torch.optim.Optimizer,
        scheduler: LambdaLR,
        stepper: Stepper,
        loader: ShardLoader,
        start_step: int,
        preflight: list[dict[str, Any]],
    ) -> None:
        self.plan, self.started, self.rt = plan, started, rt
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.stepper, self.loader, self.start_step = stepper, loader, start_step
        self.preflight = preflight
        self.flops = model_mod.flops_for(plan.cfg, plan.vocab_size)
        self.metrics: MetricsLog | None = None  # rank 0's, opened by start()
        self.writer: BackgroundWriter | None = None  # rank 0's; start() spawns its process
        if rt.rank == 0:
            self.writer = BackgroundWriter(
                plan.run.checkpoints, plan.cfg.train.keep_checkpoints, on_written=self._written
            )
        self.preempt = preempt.Preemption()  # start() installs its SIGTERM handler
        self.watchdog = Watchdog(
            logs=plan.run.logs,
            hangs=plan.run.hangs,
            rank=rt.rank,
            node=plan.env.node_rank,
            configured=plan.cfg.train.hang_timeout,
            on_hang=nodefault.hang_action(str(rt.device)),
        )
        # On Kubernetes the run has a fence: a pod given up for lost may yet be alive, and its
        # attempt (the rendezvous id) must not publish a checkpoint over the next one's.
        attempt = os.environ.get("TORCHELASTIC_RUN_ID", "")
        on_k8s = plan.cfg.job.backend == "kubernetes" and attempt
        self.fence = peers.Fence(plan.run.fence, attempt) if on_k8s else None

    def __enter__(self) -> TrainerSetup:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> TrainerSetup:
        """SIGTERM noted from now on, the watchdog's thread (armed by the first step), and on
        rank 0 goodput's start, the writer process (its start-up overlaps the first step, not
        the first save), rank0.json, the metrics log and the opening lines."""
        p, cfg, rt, started = self.plan, self.plan.cfg, self.rt, self.started
        try:
            self.preempt.install()
            self.watchdog.start()
            if self.fence is not None and rt.rank == 0:
                self.fence.claim()
                saving.publish_guards[:] = [self.fence]
            if rt.rank == 0:
                # Goodput's events (run/goodput.py): this process began at `started`, before its imports.
                goodput.record(
                    p.run.timeline,
                    "start",
                    t=started,
                    step=self.start_step,
                    compiles=p.compile or rt.kind == "xla",
                )
                if self.writer is not None:
                    self.writer.start()
                device = rt.device_name
                write_rank0(
                    p.run, node_rank=p.env.node_rank, local_rank=p.env.local_rank, device=device
                )
                # The Kubernetes backend finds rank 0's pod by this exact line (backends/kubernetes/status.py).
                pod = (
                    os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or socket.gethostname()
                )
                log(f"trainmaster: rank 0 on pod {pod}")
                self.metrics = MetricsLog(
                    p.run,
                    start_step=self.start_step,
                    started=started,
                    flops_per_seq=self.flops,
                    peak_tflops=metrics.peak_tflops_per_worker(
                        cfg.derived.instance.peak_tflops_per_worker, device
                    ),
                    world=rt.world,
                    global_batch=cfg.train.batch_size * p.grad_accum * rt.world,
                    seq_len=cfg.data.seq_len,
                ).open()
                self._describe()
        except BaseException:
            self.close()  # what did start: a failed start leaves no process or handler behind
            raise
        return self

    def close(self) -> None:
        """Undo start(), the last first; safe after a failure and twice. The writer process
        ends without waiting for a write: the loop drains it first when the run ends well."""
        if self.metrics is not None:
            self.metrics.close()
        if self.writer is not None:
            self.writer.close()
        self.watchdog.stop()
        if self.fence is not None:
            saving.publish_guards[:] = []
        self.preempt.uninstall()

    def _describe(self) -> None:
        p, cfg, rt = self.plan, self.plan.cfg, self.rt
        t = cfg.train
        params = sum(x.numel() for x in self.model.parameters())
        log(
            f"job {cfg.job.name} (config {cfg.derived.config_hash}): {rt.world} workers "
            f"({rt.world // cfg.job.nproc_per_node} node(s) x {cfg.job.nproc_per_node}), "
            f"micro-batch {t.batch_size} x grad_accum {p.grad_accum} = global batch "
            f"{t.global_batch_size}"
        )
        log(
            f"model {cfg.model.preset or 'custom'}: {params / 1e6:.2f}M parameters, vocab "
            f"{p.vocab_size}; device {rt.kind}, {t.precision}, {t.optimizer} lr {t.lr:g}, "
            f"compile {p.cache_state}; {self.flops / 1e9:.3f} GFLOP per sequence"
        )
        log(
            f"data {p.dataset} ({len(p.shards)} shards); rank 0 starts at epoch "
            f"{p.position.epoch} round {p.position.round} sample {p.position.offset}"
        )
        log(
            f"resumed from step {self.start_step} ({p.resume.path})"
            if p.resume
            else "no checkpoint: starting at step 0"
        )
        for note in p.notes:
            log(f"note: {note}")

    def _written(self, w: Written) -> None:
        """In background's listening thread, when a checkpoint is complete."""
        log(
            f"checkpoint {w.path}: {w.bytes / 1e6:.1f} MB in {w.seconds:.2f} s "
            f"({w.mb_per_s:.0f} MB/s), written in the background"
        )
        goodput.record(
            self.plan.run.timeline,
            "save",
            t=w.started,
            end=w.started + w.seconds,
            step=w.step,
            bytes=w.bytes,
        )
