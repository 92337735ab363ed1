"""The compile fingerprint: what is in it, what is not, and how a difference is named."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest

from tests.golden import check
from trainmaster.compile import cache, fingerprint
from trainmaster.compile import precompile as pre_mod
from trainmaster.config import jobfile
from trainmaster.errors import UserError
from trainmaster.storage import Storage

GOLDEN = Path(__file__).parent / "golden"
FIXED: dict[str, fingerprint.Value] = {"versions.python": "3.11", "versions.torch": "2.13.0+cpu"}


def cfg(*sets: str):  # type: ignore[no-untyped-def]
    return jobfile.preset("local-cpu", ["train.compile=true", *sets])


def test_installed_versions_are_read_without_importing_torch() -> None:
    got = fingerprint.versions()
    assert got["versions.torch"] == importlib.metadata.version("torch")
    assert got["versions.transformers"] == importlib.metadata.version("transformers")
    assert got["versions.torch_xla"] is None and got["versions.neuronx_cc"] is None


def test_fields_that_change_graphs_are_in_it_and_the_rest_is_not() -> None:
    base = fingerprint.compute(cfg(), 4096, installed=FIXED)
    assert (
        base["train.batch_size"] == 16
        and base["world_size"] == 2
        and base["model.hidden_size"] == 128
    )
    same = fingerprint.compute(
        cfg(
            'job.name="other"',
            "train.lr=0.01",
            "train.seed=7",
            "train.max_steps=999",
            "train.steps_this_run=3",
            'train.cacheset="x"',
        ),
        4096,
        installed=FIXED,
    )
    assert fingerprint.compare(base, same) == []
    for override, field in [
        ("train.batch_size=8", "train.batch_size"),
        ('train.precision="bf16"', "train.precision"),
        ('train.optimizer="lamb"', "train.optimizer"),
        ("job.nnodes=1", "world_size"),
        ('model.preset="bert-mini"', "model.hidden_size"),
    ]:
        other = fingerprint.compute(cfg(override), 4096, installed=FIXED)
        assert field in [d.field for d in fingerprint.compare(base, other)], override
    vocab = fingerprint.compare(base, fingerprint.compute(cfg(), 8192, installed=FIXED))
    assert [d.field for d in vocab] == ["model.vocab_size"]
    newer = fingerprint.compare(
        base, fingerprint.compute(cfg(), 4096, installed=FIXED | {"versions.torch": "2.14.0"})
    )
    assert [str(d) for d in newer] == ["versions.torch 2.13.0+cpu in the cache, 2.14.0 now"]


def test_gradient_accumulation_counts_on_xla_only() -> None:
    cpu = fingerprint.compute(cfg(), 4096, installed=FIXED)
    assert "grad_accum" not in cpu
    trn = jobfile.preset("trn1-bert-large")
    assert fingerprint.compute(trn, 30522, installed=FIXED)["grad_accum"] == 32
    assert fingerprint.compute(trn, 30522, installed=FIXED)["instance_type"] == "trn1.32xlarge"


def test_write_read_and_a_broken_file(tmp_path: Path) -> None:
    fields = fingerprint.compute(cfg(), 4096)
    fingerprint.write(tmp_path, fields, "demo")
    saved = fingerprint.read(tmp_path)
    assert (
        saved is not None and saved.job == "demo" and saved.fields == json.loads(json.dumps(fields))
    )
    assert fingerprint.read(tmp_path / "none") is None
    (tmp_path / fingerprint.FILE).write_text("{half")
    with pytest.raises(UserError, match="fingerprint.json: unreadable"):
        fingerprint.read(tmp_path)


def test_vocab_size_comes_from_the_dataset_like_the_trainer(pydoc_storage: Path) -> None:
    store = Storage(pydoc_storage)
    lines = len((pydoc_storage / "datasets" / "pydoc" / "vocab.txt").read_text().splitlines())
    assert fingerprint.vocab_size_for(cfg(), store) == lines
    assert fingerprint.vocab_size_for(cfg("model.vocab_size=9000"), store) == 9000


def test_expect_cold_warm_and_mismatch(tmp_path: Path) -> None:
    store = Storage(tmp_path)
    job = cfg('train.cacheset="c"')
    assert pre_mod.expect(job, store).state == "cold"
    folder = store.cache_dir("c")
    fingerprint.write(
        folder, fingerprint.compute(job, fingerprint.vocab_size_for(job, store)), "demo-precompile"
    )
    assert pre_mod.expect(job, store).state == "cold"  # matching, but nothing compiled
    (folder / "inductor" / "fxgraph").mkdir(parents=True)
    (folder / "inductor" / "fxgraph" / "entry").write_bytes(b"x")
    assert pre_mod.expect(job, store) == pre_mod.Expectation("warm", "compile cache warm (c)")
    with pytest.raises(UserError) as err:
        pre_mod.expect(cfg('train.cacheset="c"', "train.batch_size=8"), store)
    text = str(err.value)
    assert text.startswith("train.cacheset: compile cache c holds the graphs of another job shape")
    assert "train.batch_size 16 in the cache, 8 now" in text and "trainmaster precompile" in text
    assert cache.entries(folder) == {"inductor": 1}


def test_precompile_config() -> None:
    pre = pre_mod.precompile_config(cfg("train.compile=false", "job.max_restarts=5"), steps=3)
    assert pre.job.name == "demo-precompile" and pre.train.compile and pre.train.steps_this_run == 3
    # a failing trial run is not repeated (docs/architecture.md 5: 12.8)
    assert pre.job.max_restarts == 0
    assert (
        pre_mod.precompile_config(
            cfg("train.max_steps=2", "train.warmup_steps=1"), 10
        ).train.steps_this_run
        == 2
    )
    with pytest.raises(UserError, match="job.name: 'a{39}' is too long"):
        pre_mod.precompile_config(cfg(f'job.name="{"a" * 39}"'))
    with pytest.raises(UserError, match="--steps: must be at least 1"):
        pre_mod.precompile_config(cfg(), 0)


def test_neuron_compiler_flags_are_in_it_on_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/architecture.md 5: 12.4. A change of the neuronx-cc flags must make the cache another
    job's."""
    trn = jobfile.preset("trn1-bert-large")
    saved = fingerprint.compute(trn, 30522, installed=FIXED)
    check(GOLDEN / "fingerprint-trn1-bert-large.json", json.dumps(saved, indent=2) + "\n")
    assert saved["neuron_cc_flags"] == "--model-type=transformer --retry_failed_compilation"
    # the flags the workers get are the ones in the fingerprint (plus the cache's own folder)
    flags = cache.env("neuron", Path("/data/cache/c"))["NEURON_CC_FLAGS"].split()
    assert flags == [*saved["neuron_cc_flags"].split(), "--cache_dir=/data/cache/c/neuron"]
    monkeypatch.setattr(cache, "NEURON_CC_OPTIONS", ("--model-type=transformer", "-O2"))
    now = fingerprint.compute(trn, 30522, installed=FIXED)
    assert [d.field for d in fingerprint.compare(saved, now)] == ["neuron_cc_flags"]
    assert "neuron_cc_flags" not in fingerprint.compute(
        cfg(), 4096, installed=FIXED
    )  # cpu: no neuronx-cc
