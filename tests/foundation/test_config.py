"""The job file: presets, derived values, overrides, hash, and the commented writer."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from trainmaster import api
from trainmaster.errors import ConfigError
from trainmaster.presets import JOB_PRESETS

ROOT = Path(__file__).resolve().parents[2]


def test_tutorial_preset_accumulation_follows_global_batch() -> None:
    cfg = api.preset_job("trn1-bert-large")
    assert (cfg.derived.world_size, cfg.derived.grad_accum) == (64, 32)
    half = api.preset_job("trn1-bert-large", ["train.global_batch_size=16384"])
    assert half.derived.grad_accum == 16
    # Adding nodes keeps the global batch and lowers the accumulation (the tutorial doubled it).
    four = api.preset_job("trn1-bert-large", ["job.nnodes=4"])
    assert (four.train.global_batch_size, four.derived.grad_accum) == (32768, 16)


@pytest.mark.parametrize("name", sorted(JOB_PRESETS))
def test_init_output_round_trips(name: str, tmp_path: Path) -> None:
    text = api.init_job(name)
    path = tmp_path / "job.toml"
    path.write_text(text)
    assert api.load_job(path) == api.preset_job(name)
    assert text.count("\n# ") > 30  # every key carries its meaning


@pytest.mark.parametrize("name", sorted(JOB_PRESETS))
def test_examples_are_the_presets(name: str) -> None:
    """examples/ are `trainmaster init --preset NAME` output; regenerate with UPDATE_GOLDEN=1."""
    import os

    path = ROOT / "examples" / f"{name}.toml"
    text = api.init_job(name)
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.read_text() == text


def test_overrides_are_typed() -> None:
    cfg = api.preset_job("local-cpu", [
        "train.lr=3e-4", "train.compile=true", "kubernetes.image=repo/img:1.0",
        "kubernetes.node_selector={pool = \"a\"}", "cluster.zones=[\"us-west-2a\"]",
    ])
    assert cfg.train.lr == 3e-4 and cfg.train.compile is True
    assert cfg.kubernetes.image == "repo/img:1.0"
    assert cfg.kubernetes.node_selector == {"pool": "a"}
    assert cfg.cluster.zones == ["us-west-2a"]


def test_a_quoted_number_is_not_an_int() -> None:
    with pytest.raises(ConfigError, match=r"train\.batch_size"):
        api.preset_job("local-cpu", ['train.batch_size="8"'])


def test_elastic_range_checks_every_node_count() -> None:
    ok = api.preset_job("local-cpu", ["job.min_nnodes=1", "train.global_batch_size=32"])
    assert (ok.derived.min_world_size, ok.derived.world_size) == (1, 2)
    with pytest.raises(ConfigError, match=r"\(16 x 3 = 48 with 3 nodes\)"):
        api.preset_job("local-cpu", ["job.nnodes=3", "job.min_nnodes=2",
                                     "train.global_batch_size=64"])


def test_hash_is_stable_and_ignores_how_the_job_runs() -> None:
    base = api.preset_job("trn1-bert-large")
    assert base.derived.config_hash == api.preset_job("trn1-bert-large").derived.config_hash
    same = ["job.nnodes=4", "train.steps_this_run=10", "train.batch_size=8", "job.max_restarts=0",
            "kubernetes.image=x/y:z", "train.checkpoint_every=7"]
    for item in same:
        assert api.preset_job("trn1-bert-large", [item]).derived.config_hash == base.derived.config_hash, item
    for item in ["train.lr=1e-4", "model.preset=\"bert-base\"", "data.seq_len=256", "train.seed=1",
                 "train.global_batch_size=16384", "train.optimizer=\"lamb\""]:
        assert api.preset_job("trn1-bert-large", [item]).derived.config_hash != base.derived.config_hash, item


def test_explicit_sizes_override_the_preset() -> None:
    cfg = api.preset_job("local-cpu", ["model.num_layers=3"])
    assert cfg.model.size("num_layers") == 3 and cfg.model.size("hidden_size") == 128
    with pytest.raises(ConfigError, match="num_heads must divide hidden_size"):
        api.preset_job("local-cpu", ["model.num_heads=3"])


def test_describe_reports_storage_and_dataset(tmp_path: Path) -> None:
    info = api.describe(api.preset_job("local-cpu"), storage=str(tmp_path))
    assert info["derived"]["dataset_path"] == str(tmp_path / "datasets" / "pydoc")
    assert tomllib.loads(api.init_job("local-cpu"))["job"]["nnodes"] == 2
