"""What the entry shim costs a custom script's workers (issue 28.2): it reads the job file
without pydantic, and a worker imports nothing the script does not need, preflight included.

The last test is a real 2-worker torchrun job: the script lists the modules loaded at its first
line, after the shim and its preflight ran on a process group of their own, and finds torch's
objects frozen out of the collector's way while its own garbage is still collected.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import typing
from pathlib import Path

import pytest

from trainmaster import api
from trainmaster.config import TrainSection, jobfile
from trainmaster.errors import ConfigError
from trainmaster.launch import entry
from trainmaster.train import scriptsettings

ROOT = Path(__file__).resolve().parents[2]
# What a torchrun script does not import, and the shim therefore must not either.
NOT_NEEDED = ("pydantic", "yaml", "typer", "rich", "h5py", "tokenizers", "tomli_w",
              "trainmaster.config", "trainmaster.config.jobfile", "trainmaster.data",
              "trainmaster.train.preflight", "trainmaster.train.dataset")  # fmt: skip


def full(path: Path) -> scriptsettings.Settings:
    cfg = jobfile.load(path)
    t = cfg.train
    return scriptsettings.Settings(
        t.preflight, t.hang_timeout, t.device, t.keep_checkpoints, cfg.derived.instance,
        t.on_divergence,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("preset", "sets"),
    [
        ("local-cpu", []),
        ("local-cpu", ["train.preflight=false", "train.hang_timeout=45", "train.device='cpu'"]),
        ("local-cpu", ["job.backend='kubernetes'", "kubernetes.instance_type='p5.48xlarge'"]),
        ("trn1-bert-large", ["train.keep_checkpoints=5", "train.hang_timeout=0"]),
        ("local-cpu", ["train.on_divergence='off'"]),
        ("p5-bert-large", ["job.backend='local'"]),  # a p5 job file run here: a CPU host
    ],
)
def test_the_net_reads_launchs_job_file_as_the_config_does(
    tmp_path: Path, preset: str, sets: list[str]
) -> None:
    cfg = api.preset_job(preset, sets)
    path = tmp_path / "job.toml"
    path.write_text(jobfile.render(cfg, "resolved job (written by launch)"))
    assert scriptsettings._resolved(tomllib.loads(path.read_text())) is not None  # no pydantic
    assert scriptsettings.settings(path) == full(path)


def test_a_job_file_written_by_hand_goes_through_the_full_loader(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('[job]\nname = "mine"\nentrypoint = "train.py"\n[train]\nhang_timeout = 9\n')
    assert scriptsettings._resolved(tomllib.loads(path.read_text())) is None
    got = scriptsettings.settings(path)  # the defaults, from the config
    assert got == full(path) and got.preflight is True and got.hang_timeout == 9.0
    path.write_text(
        jobfile.render(api.preset_job("local-cpu"), "x").replace('device = "cpu"', 'device = "tpu"')
    )
    with pytest.raises(ConfigError) as bad:  # the config names what is wrong, as at launch
        scriptsettings.settings(path)
    assert "train.device" in str(bad.value)


def test_the_nets_device_and_divergence_values_are_the_configs() -> None:
    annotation = TrainSection.model_fields["device"].annotation
    assert typing.get_args(annotation) == scriptsettings.DEVICES
    annotation = TrainSection.model_fields["on_divergence"].annotation
    assert typing.get_args(annotation) == scriptsettings.DIVERGENCE


SCRIPT = """\
import gc, json, os, sys, weakref
import torch, torch.distributed as dist
loaded = sorted(sys.modules)
class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
collector = {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count(), "cycle": gone() is None}
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
print("MODULES " + json.dumps({"rank": dist.get_rank(), "total": total.item(), "loaded": loaded,
                               "gc": collector}))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_worker_imports_nothing_the_script_does_not_need(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    cfg = api.script_job("train.py", [], nnodes=1, nproc_per_node=2, name="lean")
    run = tmp_path / "store" / "runs" / "lean"
    run.mkdir(parents=True)
    (run / "job.toml").write_text(jobfile.render(cfg, "resolved job lean (written by launch)"))
    program = entry.program_args(
        cfg, job_file=str(run / "job.toml"), storage=str(tmp_path / "store"), workdir=str(tmp_path)
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--tee=3", *program]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [
        json.loads(line.split("MODULES ", 1)[1])
        for line in result.stdout.splitlines()
        if "MODULES " in line
    ]
    assert sorted(r["rank"] for r in rows) == [0, 1] and {r["total"] for r in rows} == {2.0}
    assert "preflight node 0" in (run / "logs" / "rank0.log").read_text()  # it did run
    for r in rows:
        loaded = set(r["loaded"])
        assert "trainmaster.train.scriptnet" in loaded and "trainmaster.train.health" in loaded
        extra = [m for m in loaded if any(m == n or m.startswith(n + ".") for n in NOT_NEEDED)]
        assert extra == [], f"rank {r['rank']} imported {extra}"
        # torch's objects (the preflight imported it) are frozen; the script's collector runs
        gc = r["gc"]
        assert gc["enabled"] and gc["cycle"] and gc["frozen"] > 100_000, gc
