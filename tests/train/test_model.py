"""The masked-positions-only MLM head is Hugging Face's full head, and the FLOPs count is right."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from trainmaster.config import jobfile
from trainmaster.train import dataset, model


def tiny_cfg(vocab: int | None = None):  # type: ignore[no-untyped-def]
    sets = ['model.preset="bert-tiny"'] + ([f"model.vocab_size={vocab}"] if vocab else [])
    return jobfile.preset("local-cpu", sets)


@pytest.fixture(scope="module")
def shard(pydoc_storage: Path) -> dict[str, np.ndarray]:
    path = sorted((pydoc_storage / "datasets" / "pydoc").glob("*_training_*.hdf5"))[0]
    return dataset.load_shard(path, 4096)


def batch_of(shard: dict[str, np.ndarray], rows: slice) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v[rows]) for k, v in shard.items()}


def test_masked_head_loss_and_gradients_equal_bert_for_pretraining(shard: dict) -> None:
    cfg = tiny_cfg()
    bert = model.build(cfg, 4096).eval()  # no dropout: both must see the same network
    batch = batch_of(shard, slice(0, 16))
    assert int((batch["mlm_labels"] != dataset.IGNORE).sum()) > 100  # real masked tokens

    ours = model.Pretraining(bert)
    loss, mlm, nsp = ours(**batch)
    loss.backward()
    our_grads = {n: p.grad.clone() for n, p in bert.named_parameters()}
    bert.zero_grad()

    labels = torch.from_numpy(
        dataset.full_labels(shard["mlm_positions"][:16], shard["mlm_labels"][:16], 128)
    )
    hf = bert(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"],
        labels=labels,
        next_sentence_label=batch["nsp_labels"],
    )
    hf.loss.backward()
    assert loss.item() == pytest.approx(hf.loss.item(), abs=1e-5)
    assert (mlm + nsp).item() == pytest.approx(loss.item(), abs=1e-6)
    worst = max(float((our_grads[n] - p.grad).abs().max()) for n, p in bert.named_parameters())
    assert worst < 1e-5


@pytest.mark.stacks  # transformers' mask handling differs between 4.51 and 4.57
def test_an_eager_forward_reads_nothing_on_the_host(shard: dict) -> None:
    """A value read on the host (`.item()`, `bool(tensor)`, `nonzero`) is a GPU sync: none in
    the forward and backward of the masked-head model, counted on the CPU by the profiler's
    aten ops (the read transformers' SDPA path makes of a [B, S] mask is `aten::is_nonzero`)."""
    from torch.profiler import ProfilerActivity, profile

    bert = model.build(tiny_cfg(), 4096, "sdpa")
    batch = batch_of(shard, slice(0, 8))
    assert int((batch["attention_mask"] == 0).sum()) > 0  # padding: the mask matters
    reads = {"aten::is_nonzero", "aten::_local_scalar_dense", "aten::nonzero", "aten::item"}

    def host_reads(net: torch.nn.Module) -> int:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            net(**batch)[0].backward()
        return sum(e.name in reads for e in prof.events())

    ours = model.Pretraining(bert)
    assert ours.mask_per_query and host_reads(ours) == 0
    ours.mask_per_query = False  # the [B, S] mask as transformers takes it: one read
    assert host_reads(ours) >= 1


@pytest.mark.stacks
def test_the_mask_per_query_gives_the_same_loss(shard: dict) -> None:
    bert = model.build(tiny_cfg(), 4096, "sdpa").eval()
    batch = batch_of(shard, slice(0, 16))
    net = model.Pretraining(bert)
    with torch.no_grad():
        per_query = net(**batch)[0]
        net.mask_per_query = False
        per_key = net(**batch)[0]
    assert per_query.item() == pytest.approx(per_key.item(), abs=1e-6)


def test_unused_slots_do_not_count(shard: dict) -> None:
    """Extra slots labelled -100 (pointing anywhere) change nothing."""
    bert = model.build(tiny_cfg(), 4096).eval()
    batch = batch_of(shard, slice(16, 24))
    with torch.no_grad():
        base = model.Pretraining(bert)(**batch)[0]
    padded = dict(batch)
    padded["mlm_positions"] = torch.cat(
        [batch["mlm_positions"], torch.full((8, 5), 7, dtype=torch.long)], dim=1
    )
    padded["mlm_labels"] = torch.cat(
        [batch["mlm_labels"], torch.full((8, 5), dataset.IGNORE, dtype=torch.long)], dim=1
    )
    with torch.no_grad():
        again = model.Pretraining(bert)(**padded)[0]
    assert again.item() == pytest.approx(base.item(), abs=1e-6)


def test_weights_are_tied_and_the_same_on_every_rank() -> None:
    a, b = model.build(tiny_cfg(), 512), model.build(tiny_cfg(), 512)
    assert a.cls.predictions.decoder.weight is a.bert.embeddings.word_embeddings.weight
    assert all(
        torch.equal(x, y)
        for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    assert a.config.vocab_size == 512 and a.config.num_hidden_layers == 2


def test_weights_are_made_on_the_device_asked_for_with_every_tensor_there_and_still_tied() -> None:
    """The meta device stands in for a GPU: no tensor of the model is made on the host first."""
    bert = model.build(tiny_cfg(), 512, "sdpa", torch.device("meta"))
    assert {t.device.type for t in (*bert.parameters(), *bert.buffers())} == {"meta"}
    assert bert.cls.predictions.decoder.weight is bert.bert.embeddings.word_embeddings.weight
    assert torch.empty(1).device.type == "cpu"  # the device was the build's alone


@pytest.mark.parametrize(("kind", "made_there"), [("cuda", True), ("cpu", False), ("xla", False)])
def test_only_a_cuda_run_makes_its_weights_on_its_device(kind: str, made_there: bool) -> None:
    device = torch.device("cuda", 3) if kind == "cuda" else torch.device("cpu")
    assert model.home_of(kind, device) == (device if made_there else None)


def test_encoder_parameter_count_matches_the_model() -> None:
    bert = model.build(tiny_cfg(), 1000)
    counted = sum(p.numel() for p in bert.bert.encoder.parameters())
    assert model.encoder_params(2, 128, 512) == counted


@pytest.mark.parametrize(
    ("sizes", "n_enc", "gflop_per_seq"),
    [
        ((24, 1024, 4096), 302.3e6, 241.0),  # bert-large: derived by hand from the sizes
        ((12, 768, 3072), 85.1e6, 70.0),  # bert-base
    ],
)
def test_flops_match_the_published_derivation(
    sizes: tuple, n_enc: float, gflop_per_seq: float
) -> None:
    layers, d, inter = sizes
    assert model.encoder_params(layers, d, inter) == pytest.approx(n_enc, rel=2e-3)
    masked = model.flops_per_seq(
        num_layers=layers, hidden=d, intermediate=inter, vocab=30522, seq_len=128, predictions=20
    )
    assert masked / 1e9 == pytest.approx(gflop_per_seq, rel=0.01)
    none = model.flops_per_seq(
        num_layers=layers,
        hidden=d,
        intermediate=inter,
        vocab=30522,
        seq_len=128,
        predictions=20,
        head="none",
    )
    full = model.flops_per_seq(
        num_layers=layers,
        hidden=d,
        intermediate=inter,
        vocab=30522,
        seq_len=128,
        predictions=20,
        head="full",
    )
    assert none < masked < full
    if layers == 24:  # AWS's convention: 6 N_enc + 12 L s d per token = 1.849 GFLOP per token
        assert none / 128 / 1e9 == pytest.approx(1.849, rel=0.01)


def test_compiled_by_layers_the_encoder_layers_share_one_graph(shard: dict) -> None:
    """What makes a layer-wise compile start faster: one graph traced for every encoder layer
    (their weights are its inputs), plus the head's; the loss as eager's."""
    graphs: list[torch.fx.GraphModule] = []

    def counting(gm: torch.fx.GraphModule, _: list[torch.Tensor]) -> Any:
        graphs.append(gm)
        return gm.forward

    cfg = tiny_cfg()
    batch = batch_of(shard, slice(0, 8))
    eager = model.Pretraining(model.build(cfg, 4096, "sdpa").eval())
    net = model.Pretraining(model.build(cfg, 4096, "sdpa").eval())
    assert len(net.model.bert.encoder.layer) >= 2
    torch.compiler.reset()
    model.compile_layers(net, counting)  # type: ignore[arg-type]
    with torch.no_grad():
        want, got = eager(**batch)[0], net(**batch)[0]
        again = net(**batch)[0]
    assert len(graphs) == 2  # one encoder layer, one head: not one per layer
    assert got.item() == pytest.approx(want.item(), abs=1e-5) and again.item() == got.item()


@pytest.mark.stacks
def test_a_whole_step_reads_nothing_on_the_host_but_the_optimizers_own_step_count(
    shard: dict,
) -> None:
    """The Stepper's whole step (forward, loss, backward, clipping, schedule, update) reads no
    tensor on the host: the same profiler count, with one exception, AdamW's step counter,
    which is a CPU tensor on a CPU (on CUDA its fused kernel keeps it on the device)."""
    from torch.profiler import ProfilerActivity, profile

    from trainmaster.train import optim
    from trainmaster.train.device import Runtime
    from trainmaster.train.preflight import Env
    from trainmaster.train.step import Stepper

    cfg = tiny_cfg()
    bert = model.build(cfg, 4096, "sdpa")
    opt = optim.make_optimizer(cfg, bert, "cpu")
    stepper = Stepper(bert, opt, optim.make_scheduler(cfg, opt), Runtime(Env(), "cpu", bf16=False))
    batches = itertools.cycle([batch_of(shard, slice(i, i + 8)) for i in (0, 8, 16)])
    stepper(batches, 1)  # the optimizer's state exists from here on

    def reads_outside_the_optimizer() -> int:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            stepper(batches, 1)
        outside = 0
        for e in prof.events():
            if e.name not in ("aten::_local_scalar_dense", "aten::is_nonzero"):
                continue
            parent = e.cpu_parent
            while parent is not None and not parent.name.startswith("Optimizer.step"):
                parent = parent.cpu_parent
            outside += parent is None
        return outside

    assert reads_outside_the_optimizer() == 0
    stepper.net.mask_per_query = False  # type: ignore[assignment]  # the control: [B, S] mask
    assert reads_outside_the_optimizer() >= 1
