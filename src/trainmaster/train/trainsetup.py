"""The trainer's start-up: from the plan to a model, optimizer, schedule and data on the device,
resumed exactly, and on rank 0 the checkpoint writer, the metrics log and the opening lines.

The order matters for exact resumption: the model is built (same weights on every rank) and
the checkpoint's weights loaded on the CPU, then moved to the device; every rank reseeds its
RNGs for dropout, then a resumed run restores optimizer, schedule and each rank's RNG state.
loop.py's Trainer is a TrainerSetup that runs the steps.
"""

from __future__ import annotations

import os
import random
import socket
from typing import Any

import numpy as np
from torch import nn

from trainmaster.run import goodput
from trainmaster.train import checkpoint, health, metrics, nodefault, preempt
from trainmaster.train import model as model_mod
from trainmaster.train.checkpoint import BackgroundWriter, Written
from trainmaster.train.data import ShardLoader
from trainmaster.train.device import Runtime, resolve_kind
from trainmaster.train.metrics import MetricsLog, log, write_rank0
from trainmaster.train.optim import make_optimizer, make_scheduler
from trainmaster.train.preflight import Plan
from trainmaster.train.step import Stepper
from trainmaster.train.watchdog import Watchdog


class TrainerSetup:
    """What a run holds before its first step; loop.Trainer adds the steps and the end."""

    def __init__(self, plan: Plan, started: float) -> None:
        self.plan, self.started = plan, started
        cfg = plan.cfg
        self.rt = Runtime(
            plan.env, resolve_kind(cfg.train.device), bf16=cfg.train.precision == "bf16"
        )
        rt = self.rt
        self.plan = plan = checkpoint.agree_on_resume(plan, rt)
        self.model = model_mod.build(
            cfg,
            plan.vocab_size,
            rt.options.attn_implementation,
            model_mod.home_of(rt.kind, rt.device),
        )
        if plan.resume is not None:
            checkpoint.load_model(plan.resume.path, self.model)
        nn.Module.to(self.model, device=rt.device, dtype=rt.model_dtype())
        if rt.kind == "xla":
            self.model.tie_weights()  # the XLA device unties them (docs/architecture.md 4)
        self.preflight = self._preflight() if cfg.train.preflight else []
        # Dropout differs per rank; the weights above are the same on every rank.
        seed = cfg.train.seed + 1 + rt.rank
        rt.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        self.optimizer = make_optimizer(cfg, self.model, rt.kind)
        self.scheduler = make_scheduler(cfg, self.optimizer)
        self.start_step = 0
        if plan.resume is not None:
            self.start_step = checkpoint.load_trainer(
                plan.resume.path, self.optimizer, self.scheduler
            )
            checkpoint.load_rank(
                plan.resume.path, rt, same_world=plan.resume.meta.get("world_size") == rt.world
            )
        self.stepper = Stepper(self.model, self.optimizer, self.scheduler, rt, compile=plan.compile)
        self.loader = ShardLoader(
            [s.path for s in plan.shards],
            rank=rt.rank,
            world=rt.world,
            batch_size=cfg.train.batch_size,
            seed=cfg.train.seed,
            vocab_size=plan.vocab_size,
            start=plan.position,
            first_shard=plan.first_shard or None,
        )
        self.flops = model_mod.flops_for(cfg, plan.vocab_size)
        self.metrics: MetricsLog | None = None
        self.writer: BackgroundWriter | None = None
        self.saved = 0  # the step of the last checkpoint submitted to the writer
        self.net_plugin: str | None = None
        self.preempt = preempt.Preemption().install()
        self.watchdog = Watchdog(
            logs=plan.run.logs,
            hangs=plan.run.hangs,
            rank=rt.rank,
            node=plan.env.node_rank,
            configured=cfg.train.hang_timeout,
            on_hang=nodefault.hang_action(str(rt.device)),
        )
        if rt.rank == 0:
            # Goodput's events (run/goodput.py): this process began at `started`, before its imports.
            goodput.record(
                plan.run.timeline,
                "start",
                t=started,
                step=self.start_step,
                compiles=plan.compile or rt.kind == "xla",
            )
            self.writer = BackgroundWriter(
                plan.run.checkpoints, cfg.train.keep_checkpoints, on_written=self._written
            )
            self.writer.start()  # its start-up overlaps ours, not the first save
            device = rt.device_name
            write_rank0(
                plan.run,
                node_rank=plan.env.node_rank,
                local_rank=plan.env.local_rank,
                device=device,
            )
            # The Kubernetes backend finds rank 0's pod by this exact line (backends/kubernetes/status.py).
            pod = os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or socket.gethostname()
            log(f"trainmaster: rank 0 on pod {pod}")
            self.metrics = MetricsLog(
                plan.run,
                start_step=self.start_step,
                started=started,
                flops_per_seq=self.flops,
                peak_tflops=metrics.peak_tflops_per_worker(
                    cfg.derived.instance.peak_tflops_per_worker, device
                ),
                world=rt.world,
                global_batch=cfg.train.global_batch_size,
                seq_len=cfg.data.seq_len,
            ).open()
            self._describe()

    def _preflight(self) -> list[dict[str, Any]]:
        """Every node's health checks (health.py), before anything is trained; rank 0 logs them."""
        p, rt = self.plan, self.rt
        every = health.run(
            rt,
            inst=p.cfg.derived.instance,
            node=p.env.node_rank,
            local_rank=p.env.local_rank,
            local_workers=p.env.local_world_size,
            checkpoints=p.run.dir,
            keep=p.cfg.train.keep_checkpoints,
            params=sum(x.numel() for x in self.model.parameters()),
            on_aws=health.on_aws_node(),
        )
        nodes = health.per_node(every)
        if rt.rank == 0:
            for node in nodes:
                log(health.describe(node))
        return nodes

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
