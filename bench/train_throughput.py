"""Training throughput on this machine's CPU: trainmaster's step vs a minimal loop vs HF Trainer.

    python bench/train_throughput.py [--models bert-tiny,bert-base] [--precisions fp32,bf16]
                                     [--rounds 2] [--budget-s 10] [--out FILE]

Three ways to train the same model (BertConfig of the preset, vocab 30,522, seq 128, AdamW)
on the same sequences (the built-in corpus, prepared in a temp folder), single process:
  trainmaster   trainmaster.train.step.Stepper: masked-positions-only MLM head, fused AdamW,
                clipping, schedule, bf16 autocast around forward + loss (the trainer's code)
  minimal_loop  BertForPreTraining as it comes (MLM head on all 128 positions), torch AdamW,
                forward / backward / step / zero_grad, the same autocast
  hf_trainer    transformers.Trainer over a Dataset of the same tensors (its defaults: fused
                AdamW, clipping 1.0, linear schedule; bf16 through accelerate's autocast)
They run interleaved (round after round, each variant a few steps per round) so that machine
load hits all three alike; seq/s is batch / the median step time over all rounds (the first
step of each variant is a warm-up and not counted).

MFU = seq/s x FLOPs per sequence / peak, where FLOPs per sequence count the useful work the
same way for all three (trainmaster.train.model.flops_per_seq, head="masked": 6 N_enc S +
12 L S^2 d + 6 (d^2 + d V) P with P = 20) and the peak is this machine's, measured: the best of
a large matmul and a large linear layer in that dtype, all threads. A configuration whose
estimated step time exceeds --budget-s (e.g. bf16 on a CPU without bf16 instructions) is
skipped with the estimate (by default bert-base in bf16 on a CPU without bf16 instructions).
Prints one JSON object. No assertions (docs/architecture.md 4).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate.state import AcceleratorState
from transformers import BertForPreTraining, Trainer, TrainerCallback, TrainingArguments
from transformers import logging as hf_logging

from trainmaster.config import jobfile
from trainmaster.data.prepare import prepare
from trainmaster.train import dataset, model, optim
from trainmaster.train.device import Runtime
from trainmaster.train.preflight import Env
from trainmaster.train.step import Stepper

VOCAB, SEQ, PRED, LR = 30522, 128, 20, 1e-4
BATCH = {
    ("bert-tiny", "fp32"): 16,
    ("bert-tiny", "bf16"): 4,
    ("bert-base", "fp32"): 2,
    ("bert-base", "bf16"): 2,
}
STEPS = {"bert-tiny": 4, "bert-base": 1}  # timed steps per variant per round
VARIANTS = ("trainmaster", "minimal_loop", "hf_trainer")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _rate(fn: Any, flops: float, seconds: float = 1.0) -> tuple[float, float]:
    """(TFLOP/s, seconds per call) of fn, timed for about `seconds` after one warm-up call."""
    fn()
    t0, reps = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds or reps < 2:
        fn()
        reps += 1
    per_call = (time.perf_counter() - t0) / reps
    return flops / per_call / 1e12, per_call


def measure_peak(dtype: torch.dtype) -> dict[str, float]:
    """TFLOP/s of a square matmul and of a linear layer (what the model runs) in dtype.

    Sizes grow from 256 up to 2048 while a call takes under 0.2 s, so that a dtype the CPU
    has no instructions for (bf16 without AVX512-BF16/AMX: ~1 GFLOP/s) is measured in seconds.
    """
    out = {}
    for name in ("matmul", "linear"):
        n, best = 256, 0.0
        while True:
            if name == "matmul":
                a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
                rate, per_call = _rate(lambda a=a, b=b: a @ b, 2 * n**3, 0.5)
            else:  # a BERT-base feed-forward layer on n tokens
                x, w = torch.randn(n, 768, dtype=dtype), torch.randn(3072, 768, dtype=dtype)
                rate, per_call = _rate(
                    lambda x=x, w=w: torch.nn.functional.linear(x, w), 2 * n * 768 * 3072, 0.5
                )
            best = max(best, rate)
            if n >= 2048 or per_call * 8 > 0.2:
                break
            n *= 2
        out[name] = best
    return out


def load_sequences(folder: Path) -> dict[str, torch.Tensor]:
    result = prepare(
        builtin="pydoc",
        output=folder,
        seq_len=SEQ,
        max_pred=PRED,
        dupe_factor=1,
        shards=4,
        vocab_size=4096,
        workers=1,
    )
    shards = [dataset.load_shard(p, VOCAB) for p in result.shards]
    data = {k: np.concatenate([s[k] for s in shards]) for k in shards[0]}
    data["labels"] = dataset.full_labels(data["mlm_positions"], data["mlm_labels"], SEQ)
    return {k: torch.from_numpy(v) for k, v in data.items()}


def cycle(data: dict[str, torch.Tensor], batch: int, keys: tuple[str, ...]) -> Any:
    n, i = len(data["input_ids"]), 0
    while True:
        if i + batch > n:
            i = 0
        yield {k: data[k][i : i + batch] for k in keys}
        i += batch


OURS = (
    "input_ids",
    "token_type_ids",
    "attention_mask",
    "mlm_positions",
    "mlm_labels",
    "nsp_labels",
)
HF = ("input_ids", "token_type_ids", "attention_mask", "labels", "nsp_labels")


class Ours:
    def __init__(
        self, name: str, precision: str, batch: int, data: dict[str, torch.Tensor]
    ) -> None:
        cfg = jobfile.preset(
            "local-cpu",
            [
                f'model.preset="{name}"',
                f'train.precision="{precision}"',
                f"train.lr={LR}",
                "train.max_steps=100000",
            ],
        )
        bert = model.build(cfg, VOCAB)
        opt = optim.make_optimizer(cfg, bert, "cpu")
        rt = Runtime(Env(), "cpu", bf16=precision == "bf16")
        self.step_fn = Stepper(bert, opt, optim.make_scheduler(cfg, opt), rt)
        self.batches = cycle(data, batch, OURS)

    def run(self, steps: int) -> list[float]:
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            float(self.step_fn(self.batches, 1).losses[0])
            times.append(time.perf_counter() - t0)
        return times


class Minimal:
    def __init__(
        self, name: str, precision: str, batch: int, data: dict[str, torch.Tensor]
    ) -> None:
        cfg = jobfile.preset("local-cpu", [f'model.preset="{name}"'])
        self.model = BertForPreTraining(model.bert_config(cfg, VOCAB)).train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR)
        self.bf16 = precision == "bf16"
        self.batches = cycle(data, batch, HF)

    def run(self, steps: int) -> list[float]:
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            b = next(self.batches)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                out = self.model(
                    input_ids=b["input_ids"],
                    token_type_ids=b["token_type_ids"],
                    attention_mask=b["attention_mask"],
                    labels=b["labels"],
                    next_sentence_label=b["nsp_labels"],
                )
            out.loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            float(out.loss.detach())
            times.append(time.perf_counter() - t0)
        return times


class _Sequences(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, data: dict[str, torch.Tensor]) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data["input_ids"])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        d = self.data
        return {
            "input_ids": d["input_ids"][i],
            "token_type_ids": d["token_type_ids"][i],
            "attention_mask": d["attention_mask"][i],
            "labels": d["labels"][i],
            "next_sentence_label": d["nsp_labels"][i],
        }


class _StepClock(TrainerCallback):
    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.ends.append(time.perf_counter())


class HFTrainer:
    def __init__(
        self, name: str, precision: str, batch: int, data: dict[str, torch.Tensor], tmp: Path
    ) -> None:
        cfg = jobfile.preset("local-cpu", [f'model.preset="{name}"'])
        self.model = BertForPreTraining(model.bert_config(cfg, VOCAB))
        self.dataset, self.batch, self.bf16, self.tmp = (
            _Sequences(data),
            batch,
            precision == "bf16",
            tmp,
        )

    def run(self, steps: int) -> list[float]:
        """steps + 1 steps of Trainer.train(); the time between step ends of the last `steps`."""
        # TrainingArguments(bf16=True) sets ACCELERATE_MIXED_PRECISION=bf16 in os.environ and
        # accelerate keeps a process-wide state: without both reset, a Trainer made after a
        # bf16 one silently runs under bf16 autocast too.
        os.environ["ACCELERATE_MIXED_PRECISION"] = "bf16" if self.bf16 else "no"
        AcceleratorState._reset_state(reset_partial_state=True)
        clock = _StepClock()
        args = TrainingArguments(
            output_dir=str(self.tmp / "hf"),
            per_device_train_batch_size=self.batch,
            max_steps=steps + 1,
            learning_rate=LR,
            bf16=self.bf16,
            use_cpu=True,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            dataloader_pin_memory=False,
            dataloader_num_workers=0,
            seed=0,
        )
        with contextlib.redirect_stdout(sys.stderr):  # its end-of-train line is not our JSON
            Trainer(
                model=self.model, args=args, train_dataset=self.dataset, callbacks=[clock]
            ).train()
        return [b - a for a, b in zip(clock.ends, clock.ends[1:], strict=False)]


def bench_one(
    name: str,
    precision: str,
    rounds: int,
    budget_s: float,
    peak: float,
    data: dict[str, torch.Tensor],
    tmp: Path,
) -> dict[str, Any]:
    m = jobfile.preset("local-cpu", [f'model.preset="{name}"']).model
    sizes = {
        "num_layers": m.size("num_layers"),
        "hidden": m.size("hidden_size"),
        "intermediate": m.size("intermediate_size"),
    }
    flops = {
        head: model.flops_per_seq(**sizes, vocab=VOCAB, seq_len=SEQ, predictions=PRED, head=head)
        for head in ("masked", "full", "none")
    }
    batch = BATCH[(name, precision)]
    out: dict[str, Any] = {
        "model": name,
        "precision": precision,
        "batch": batch,
        "seq_len": SEQ,
        "vocab": VOCAB,
        "flops_per_seq": flops,
    }
    # a full-head step at half the measured peak (what BERT layers reach on a CPU, roughly)
    estimate = flops["full"] * batch / (0.5 * peak * 1e12)
    if estimate > budget_s:
        out["skipped"] = (
            f"estimated {estimate:.0f} s per step of the full-head variants (half "
            f"of this machine's {precision} peak, {peak * 1e3:.1f} GFLOP/s) exceeds "
            f"--budget-s {budget_s:g}; rerun with a larger --budget-s to include it"
        )
        return out
    say(f"{name} {precision} batch {batch}: warm-up")
    torch.manual_seed(0)
    runners = {
        "trainmaster": Ours(name, precision, batch, data),
        "minimal_loop": Minimal(name, precision, batch, data),
        "hf_trainer": HFTrainer(name, precision, batch, data, tmp),
    }
    runners["trainmaster"].run(1)
    runners["minimal_loop"].run(1)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        for v in VARIANTS:
            times[v] += runners[v].run(STEPS[name])
        say(
            f"  round {r + 1}/{rounds}: "
            + ", ".join(f"{v} {batch / statistics.median(times[v]):.1f} seq/s" for v in VARIANTS)
        )
    seq_s = {v: batch / statistics.median(times[v]) for v in VARIANTS}
    out |= {
        "seq_per_s": {v: round(s, 2) for v, s in seq_s.items()},
        "step_s_all": {v: [round(t, 4) for t in times[v]] for v in VARIANTS},
        "speedup_vs_minimal_loop": round(seq_s["trainmaster"] / seq_s["minimal_loop"], 3),
        "speedup_vs_hf_trainer": round(seq_s["trainmaster"] / seq_s["hf_trainer"], 3),
        "mfu": {v: round(s * flops["masked"] / (peak * 1e12), 4) for v, s in seq_s.items()},
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", default="bert-tiny,bert-base")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (median over all)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=10.0,
        help="skip configurations whose estimated step takes longer (seconds)",
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args()
    hf_logging.set_verbosity_error()
    started = time.perf_counter()
    say("measuring the matmul peak")
    peaks = {"fp32": measure_peak(torch.float32), "bf16": measure_peak(torch.bfloat16)}
    results = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        data = load_sequences(tmp / "pydoc")
        for name in args.models.split(","):
            for precision in args.precisions.split(","):
                peak = max(peaks[precision].values())
                results.append(
                    bench_one(name, precision, args.rounds, args.budget_s, peak, data, tmp)
                )
    report = {
        "benchmark": "train_throughput",
        "command": "python " + " ".join(sys.argv),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
        },
        "peak_tflops": {p: {k: round(v, 5) for k, v in d.items()} for p, d in peaks.items()},
        "flops_convention": "per sequence: 6*N_enc*S + 12*L*S^2*d + 6*(d^2+d*V)*P (masked head, "
        "P=20) for every variant; 'full' and 'none' given for reference",
        "results": results,
        "seconds": round(time.perf_counter() - started, 1),
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
