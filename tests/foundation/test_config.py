"""The job file: presets, derived values, overrides, hash, and the commented writer."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.conftest import assert_user_error
from trainmaster import api
from trainmaster.config.presets import JOB_PRESETS
from trainmaster.errors import ConfigError

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
    cfg = api.preset_job(
        "local-cpu",
        [
            "train.lr=3e-4",
            "train.compile=true",
            "kubernetes.image=repo/img:1.0",
            'kubernetes.node_selector={pool = "a"}',
            'cluster.zones=["us-west-2a"]',
        ],
    )
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
        api.preset_job(
            "local-cpu", ["job.nnodes=3", "job.min_nnodes=2", "train.global_batch_size=64"]
        )


def test_hash_is_stable_and_ignores_how_the_job_runs() -> None:
    base = api.preset_job("trn1-bert-large")
    assert base.derived.config_hash == api.preset_job("trn1-bert-large").derived.config_hash
    same = [
        "job.nnodes=4",
        "train.steps_this_run=10",
        "train.batch_size=8",
        "job.max_restarts=0",
        "kubernetes.image=x/y:z",
        "train.checkpoint_every=7",
    ]
    for item in same:
        assert (
            api.preset_job("trn1-bert-large", [item]).derived.config_hash
            == base.derived.config_hash
        ), item
    for item in [
        "train.lr=1e-4",
        'model.preset="bert-base"',
        "data.seq_len=256",
        "train.seed=1",
        "train.global_batch_size=16384",
        'train.optimizer="lamb"',
    ]:
        assert (
            api.preset_job("trn1-bert-large", [item]).derived.config_hash
            != base.derived.config_hash
        ), item


def test_explicit_sizes_override_the_preset() -> None:
    cfg = api.preset_job("local-cpu", ["model.num_layers=3"])
    assert cfg.model.size("num_layers") == 3 and cfg.model.size("hidden_size") == 128
    with pytest.raises(ConfigError, match="num_heads must divide hidden_size"):
        api.preset_job("local-cpu", ["model.num_heads=3"])


def test_describe_reports_storage_and_dataset(tmp_path: Path) -> None:
    info = api.describe(api.preset_job("local-cpu"), storage=str(tmp_path))
    assert info["derived"]["dataset_path"] == str(tmp_path / "datasets" / "pydoc")
    assert tomllib.loads(api.init_job("local-cpu"))["job"]["nnodes"] == 2


# --- [job] entrypoint and args: your own training script (docs/architecture.md 3.8) ------------


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ("-m trainmaster.train", "-m trainmaster.train"),
        ("-m   pkg.sub_mod", "-m pkg.sub_mod"),
        ("train.py", "train.py"),
        ("  examples/custom-gpt/train_gpt.py ", "examples/custom-gpt/train_gpt.py"),
        ("my dir/train.py", "my dir/train.py"),
    ],
)
def test_entrypoint_is_a_file_or_a_module(value: str, stored: str) -> None:
    cfg = api.preset_job("local-cpu", [f"job.entrypoint={value!r}".replace("'", '"')])
    assert cfg.job.entrypoint == stored


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("python train.py", "give the script alone, not a command (python is started for you"),
        ("torchrun train.py", "give the script alone, not a command (torchrun"),
        ("-m", "expected -m package.module"),
        ("-m pkg.mod --lr 1", "expected -m package.module (arguments go in job.args)"),
        ("-m torch.distributed.run", "torchrun is started for you"),
        ("", "give a Python file (train.py) or -m package.module"),
    ],
)
def test_bad_entrypoint_names_the_field(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"job\.entrypoint: ") as err:
        api.preset_job("local-cpu", [f'job.entrypoint="{value}"'])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_args_are_strings() -> None:
    assert api.preset_job("local-cpu", ['job.args=["--lr", "3e-4", ""]']).job.args == [
        "--lr",
        "3e-4",
        "",
    ]
    with pytest.raises(ConfigError, match=r"job\.args\.0: input should be a valid string"):
        api.preset_job("local-cpu", ["job.args=[1]"])
    with pytest.raises(ConfigError, match=r"job\.args: an argument holds a NUL character"):
        api.preset_job("local-cpu", ['job.args=["a\\u0000b"]'])


def test_missing_script_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """One line naming job.entrypoint, exit 2, and no run folder: nothing was launched."""
    from tests.conftest import run_cli

    store = tmp_path / "store"
    job = tmp_path / "job.toml"
    job.write_text('[job]\nname = "mine"\nentrypoint = "nope/train.py"\n')
    result = run_cli("launch", str(job), "--set", f'job.storage="{store}"', cwd=tmp_path)
    assert_user_error(result, "job.entrypoint: no such file", str(tmp_path / "nope" / "train.py"))
    assert not (store / "runs" / "mine").exists()
    job.write_text('[job]\nname = "mine"\nentrypoint = "-m no_such_package_here.train"\n')
    result = run_cli("launch", str(job), "--set", f'job.storage="{store}"', cwd=tmp_path)
    assert_user_error(result, "job.entrypoint: no module 'no_such_package_here'")
    assert not (store / "runs" / "mine").exists()


def test_custom_entrypoint_is_not_held_to_the_builtin_trainers_batch() -> None:
    """[train] sizes the built-in trainer's batch; a custom script on 16 workers is valid."""
    sets = ["job.nnodes=2", "job.nproc_per_node=8", "train.global_batch_size=32"]
    with pytest.raises(ConfigError, match=r"train\.global_batch_size: 32 is not a multiple"):
        api.preset_job("local-cpu", sets)
    cfg = api.preset_job("local-cpu", [*sets, 'job.entrypoint="train.py"'])
    assert (cfg.derived.world_size, cfg.derived.grad_accum) == (16, 1)
