"""Per-device cache settings, the Neuron precompile golden file, and agreement with the pod spec."""

from __future__ import annotations

import tomllib
from pathlib import Path, PurePosixPath

import pytest
import yaml

from tests.backends.kubernetes.schemas import (
    validate_k8s,
    validate_pod_templates,
    validate_volcano_job,
)
from tests.compile.helpers import tm
from tests.conftest import ROOT
from tests.golden import check
from trainmaster.backends.kubernetes import podspec, volcano
from trainmaster.compile import cache
from trainmaster.compile.precompile import precompile_config
from trainmaster.config import jobfile
from trainmaster.launch.torchrun import Rendezvous, command

GOLDEN = Path(__file__).parent / "golden"
TRN1 = jobfile.preset("trn1-bert-large")


def test_mechanism_per_device() -> None:
    local = jobfile.preset("local-cpu")
    assert cache.mechanism(local, {}) == "inductor"
    assert cache.mechanism(jobfile.preset("p5-bert-large"), {}) == "inductor"
    assert cache.mechanism(TRN1, {}) == "neuron"
    xla = jobfile.preset("local-cpu", ['train.device="xla"'])
    assert cache.mechanism(xla, {"PJRT_DEVICE": "CPU"}) == "xla"
    assert cache.mechanism(xla, {"PJRT_DEVICE": "NEURON"}) == "neuron"
    auto = jobfile.preset("local-cpu", ['train.device="auto"'])
    assert (
        cache.mechanism(auto, {}) == "inductor"
        and cache.mechanism(auto, {"PJRT_DEVICE": "TPU"}) == "xla"
    )


def test_inductor_settings_stay_inside_the_cacheset() -> None:
    env = cache.env("inductor", PurePosixPath("/s/cache/c"))
    assert env == {
        "TORCHINDUCTOR_CACHE_DIR": "/s/cache/c/inductor",
        "TRITON_CACHE_DIR": "/s/cache/c/triton",
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    }
    assert cache.precompile_command("inductor", ["python3", "-m", "x"]) == ["python3", "-m", "x"]
    assert (
        cache.worker_env("xla", PurePosixPath("/c"), 3)["XLA_PERSISTENT_CACHE_PATH"]
        == "/c/xla/rank3"
    )


def _neuron_precompile_text() -> str:
    """The Neuron precompile: the pure builder's command and environment, then the pod's."""
    folder = PurePosixPath("/data/cache") / TRN1.train.cacheset
    pre = precompile_config(TRN1, 10)
    torchrun = command(
        pre,
        Rendezvous("etcd", "etcd-server:2379"),
        job_file=f"/data/runs/{pre.job.name}/job.toml",
        storage="/data",
    )
    lines = ["# compile/cache.py: environment of every worker of the precompile job"]
    lines += [f"{k}={v}" for k, v in sorted(cache.precompile_env("neuron", folder).items())]
    lines += [
        "# compile/cache.py: the command of one node",
        " ".join(cache.precompile_command("neuron", torchrun)),
    ]
    *_, job = volcano.objects(TRN1, precompile=True, steps=10)
    container = job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    lines += ["# the Volcano precompile job's pod: environment"]
    lines += [f"{e['name']}={e['value']}" for e in container["env"] if "value" in e]
    exec_line = [line for line in container["command"][2].splitlines() if line.startswith("exec ")]
    lines += ["# the Volcano precompile job's pod: command", *exec_line]
    return "\n".join(lines) + "\n"


def test_golden_neuron_precompile_command_and_environment() -> None:
    text = _neuron_precompile_text()
    check(GOLDEN / "neuron-precompile.txt", text)
    # What the golden file must say, whatever else changes around it:
    assert (
        "\nneuron_parallel_compile python3 -m torch.distributed.run --nnodes=2 --nproc-per-node=32"
        in text
    )
    assert "neuron_parallel_compile python3 -m torch.distributed.run" in text.split("\nexec ")[1]
    # the recipe's compiler flags, and one shared cache
    assert (
        "NEURON_CC_FLAGS=--model-type=transformer --retry_failed_compilation "
        "--cache_dir=/data/cache/bert-large/neuron"
    ) in text
    # the precompile job runs with no restarts (docs/architecture.md 5: 12.8)
    assert "--max-restarts=0" in text and "--max-restarts=3" not in text
    assert "--job /data/runs/bert-large-trn1-precompile/job.toml" in text


def test_kubernetes_precompile_job_is_valid_and_compiles() -> None:
    cm, _, job = volcano.objects(jobfile.preset("p5-bert-large"), precompile=True, steps=5)
    validate_k8s(cm)
    validate_volcano_job(job)
    validate_pod_templates(job)
    resolved = jobfile.validate(tomllib.loads(cm["data"]["job.toml"]), where="the ConfigMap")
    assert resolved.train.compile and resolved.train.steps_this_run == 5
    assert resolved.job.name == "bert-large-p5-precompile"
    env = {
        e["name"]: e.get("value")
        for e in job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/data/cache/bert-large-p5/inductor"
    assert env["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "1"
    assert not env["TMPDIR"].startswith("/data/")  # scratch on the node, not on the shared storage
    script = job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["command"][2]
    assert "neuron_parallel_compile" not in script


@pytest.mark.parametrize("kind", ["inductor", "neuron", "xla"])
def test_only_caches_live_on_the_shared_storage(kind: cache.Mechanism, tmp_path: Path) -> None:
    """docs/architecture.md 5: 12.6. No scratch (TMPDIR) under the cacheset, in any worker's
    environment."""
    folder = tmp_path / "cache" / "c"
    settings = (
        cache.env(kind, folder)
        | cache.precompile_env(kind, folder)
        | cache.worker_env(kind, folder, 1)
    )
    assert "TMPDIR" not in settings
    assert not any(v.startswith(f"{folder}/tmp") for v in settings.values())
    assert all(d.name != "tmp" for d in cache.dirs_to_make(kind, folder))


@pytest.mark.parametrize("preset", ["trn1-bert-large", "p5-bert-large"])
def test_pod_spec_agrees_with_the_cache_settings(preset: str) -> None:
    """backends/kubernetes/podspec.py sets some cache variables itself: they must be compile/cache.py's."""
    cfg = jobfile.preset(preset, ["train.compile=true"])
    pod = {e["name"]: e.get("value") for e in podspec.env(cfg, cfg.derived.instance)}
    ours = cache.env(
        cache.mechanism(cfg), PurePosixPath(cfg.kubernetes.mount) / "cache" / cfg.train.cacheset
    )
    shared = set(pod) & set(ours)
    assert shared, "the pod spec sets no cache variable at all"
    assert {k: pod[k] for k in shared} == {k: ours[k] for k in shared}


def test_cli_dry_run_of_the_kubernetes_precompile() -> None:
    result = tm(
        "precompile",
        str(ROOT / "examples" / "trn1-bert-large.toml"),
        "--backend",
        "kubernetes",
        "--dry-run",
    )
    assert result.returncode == 0, result.stderr
    cm, _, job = list(yaml.safe_load_all(result.stdout))
    assert job["metadata"]["name"] == "bert-large-trn1-precompile"
    assert (
        "neuron_parallel_compile python3 -m torch.distributed.run"
        in job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["command"][2]
    )
