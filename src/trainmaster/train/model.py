"""BERT for pretraining, with the masked-LM head computed at the masked positions only.

Hugging Face's BertForPreTraining runs the MLM head (transform + a d x V decoder) on every
position and then ignores all but ~15% of them. We run `model.bert`, gather the max_pred
prediction slots of every sequence (a fixed [B, P] shape, so XLA sees one graph), and apply
`model.cls.predictions` to those only; unused slots carry the label -100 and drop out of the
mean. The loss is the same number as BertForPreTraining's own (tests/train/test_model.py).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, BertForPreTraining

from trainmaster.config import JobConfig
from trainmaster.train.dataset import IGNORE

DROPOUT_ENV = "TRAINMASTER_DROPOUT"  # an A/B knob (devices, batch layouts); unset = BERT's 0.1
SIZES = ("num_layers", "hidden_size", "num_heads", "intermediate_size")


def bert_config(
    cfg: JobConfig, vocab_size: int, attn_implementation: str | None = None
) -> BertConfig:
    m = cfg.model
    extra: dict[str, Any] = {}
    if attn_implementation is not None:  # device.options_for: "sdpa" on cpu/cuda
        extra["attn_implementation"] = attn_implementation
    if os.environ.get(DROPOUT_ENV):
        p = float(os.environ[DROPOUT_ENV])
        extra.update(hidden_dropout_prob=p, attention_probs_dropout_prob=p)
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=m.size("hidden_size"),
        num_hidden_layers=m.size("num_layers"),
        num_attention_heads=m.size("num_heads"),
        intermediate_size=m.size("intermediate_size"),
        max_position_embeddings=m.max_position_embeddings,
        type_vocab_size=2,
        tie_word_embeddings=True,
        **extra,
    )


def build(
    cfg: JobConfig,
    vocab_size: int,
    attn_implementation: str | None = None,
    device: torch.device | str | None = None,
) -> BertForPreTraining:
    """A fresh model (no download): the same weights on every rank for the same seed.

    `device` is where the weights are made (home_of says which). BERT-large's 340M initial
    draws take seconds on a host CPU, then a copy to the GPU; made on the GPU they take
    milliseconds. The draws differ from the CPU's, not between ranks, and DDP starts every rank
    from rank 0's weights anyway."""
    torch.manual_seed(cfg.train.seed)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = BertForPreTraining(bert_config(cfg, vocab_size, attn_implementation))
    model.tie_weights()
    return model


def home_of(kind: str, device: torch.device) -> torch.device | None:
    """Where build makes a run's weights: on its CUDA device itself; anywhere else on the host
    (None), as before: a CPU run is there already, and XLA takes a module built on the CPU (the
    Neuron examples' way; its lazy tensors would trace every initial draw)."""
    return device if kind == "cuda" else None


class Pretraining(nn.Module):
    """Batch in, (loss, mlm_loss, nsp_loss) out; what DDP wraps and torch.compile compiles."""

    def __init__(self, model: BertForPreTraining) -> None:
        super().__init__()
        self.model = model
        # transformers' SDPA path asks the device whether a [B, S] mask is all ones
        # (`torch.all(mask == 1)`, read on the host) in every eager forward: a GPU sync per
        # micro-batch. The same mask as [B, S, S] takes its other path, which builds the same
        # additive mask without reading anything (compiled graphs skip the read already, so
        # eager and compiled now run the same masked kernel).
        self.mask_per_query = model.bert.attn_implementation == "sdpa"

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        mlm_positions: torch.Tensor,
        mlm_labels: torch.Tensor,
        nsp_labels: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.mask_per_query:
            seq = attention_mask.size(1)
            attention_mask = attention_mask[:, None, :].expand(-1, seq, -1)
        out = self.model.bert(
            input_ids=input_ids,
            token_type_ids=token_type_ids,
            attention_mask=attention_mask,
            return_dict=False,
        )
        return self.head_and_loss(out[0], out[1], mlm_positions, mlm_labels, nsp_labels)

    def head_and_loss(
        self,
        sequence: torch.Tensor,
        pooled: torch.Tensor,
        mlm_positions: torch.Tensor,
        mlm_labels: torch.Tensor,
        nsp_labels: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The masked-positions head and both losses (compiled on its own by compile_layers)."""
        hidden = sequence.size(-1)
        index = mlm_positions.unsqueeze(-1).expand(-1, -1, hidden)
        picked = torch.gather(sequence, 1, index)  # [B, P, d]: only the prediction slots
        scores = self.model.cls.predictions(picked)  # [B, P, V]
        mlm = F.cross_entropy(
            scores.reshape(-1, scores.size(-1)).float(), mlm_labels.reshape(-1), ignore_index=IGNORE
        )
        nsp = F.cross_entropy(
            self.model.cls.seq_relationship(pooled).float(), nsp_labels.reshape(-1)
        )
        return mlm + nsp, mlm.detach(), nsp.detach()


def compile_layers(net: Pretraining, backend: str) -> None:
    """torch.compile per region instead of the whole model: each encoder layer, and the head
    with its losses. The layers are one module class, so they share one compiled graph (their
    weights are its inputs): a cold compile traces one layer instead of all of them, which is
    most of a cold start (bench/compile_cache.py --scopes model,layers measures both)."""
    for layer in net.model.bert.encoder.layer:
        layer.compile(backend=backend)
    net.head_and_loss = torch.compile(net.head_and_loss, backend=backend)  # type: ignore[method-assign]


def encoder_params(num_layers: int, hidden: int, intermediate: int) -> int:
    """Non-embedding encoder parameters N_enc (weights, biases and LayerNorms of all layers)."""
    d, i = hidden, intermediate
    per_layer = 4 * d * d + 4 * d + 2 * d * i + i + d + 4 * d
    return num_layers * per_layer


def flops_per_seq(
    *,
    num_layers: int,
    hidden: int,
    intermediate: int,
    vocab: int,
    seq_len: int,
    predictions: int,
    head: str = "masked",
) -> float:
    """Training FLOPs (forward + backward = 3 x forward) for one sequence.

    6 * N_enc * S  +  12 * L * S^2 * d  (attention scores and mixing)  +  the MLM head:
      head="masked"  6 * (d^2 + d * V) * P   on the P prediction slots (what this trainer runs;
                                             the default, and what metrics' mfu uses)
      head="full"    6 * (d^2 + d * V) * S   (Hugging Face's head on every position)
      head="none"    0                       (AWS Neuron's published MFU convention:
                                             3,733 seq/s = 29.07% of 3,040 TF)
    Embeddings, pooler, NSP head and softmax/LayerNorm element-wise work are not counted.
    """
    n_enc = encoder_params(num_layers, hidden, intermediate)
    body = 6.0 * n_enc * seq_len + 12.0 * num_layers * seq_len * seq_len * hidden
    per_slot = 6.0 * (hidden * hidden + hidden * vocab)
    slots = {"masked": predictions, "full": seq_len, "none": 0}[head]
    return body + per_slot * slots


def flops_for(cfg: JobConfig, vocab_size: int, head: str = "masked") -> float:
    m = cfg.model
    return flops_per_seq(
        num_layers=m.size("num_layers"),
        hidden=m.size("hidden_size"),
        intermediate=m.size("intermediate_size"),
        vocab=vocab_size,
        seq_len=cfg.data.seq_len,
        predictions=cfg.data.max_pred,
        head=head,
    )
