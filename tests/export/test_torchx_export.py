"""`trainmaster export torchx` (docs/architecture.md 5: 13.5): a TorchX component whose role
runs the job's own torchrun command line, checked by running its script as TorchX would: macros
substituted the way torchx.specs does it (string.Template), then `bash -c` with a stand-in
`python`."""

from __future__ import annotations

import importlib.util
import json
import os
import string
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, assert_user_error, run_cli
from trainmaster import api
from trainmaster.config import jobfile
from trainmaster.export import torchx
from trainmaster.launch.entry import WORKSPACE_DIR
from trainmaster.launch.torchrun import Rendezvous, command

# Just enough of torchx.specs to call a component (torchx is not a dependency).
STUB = """
from dataclasses import dataclass, field

@dataclass
class Resource:
    cpu: int
    gpu: int
    memMB: int
    devices: dict = field(default_factory=dict)
    capabilities: dict = field(default_factory=dict)

@dataclass
class VolumeMount:
    src: str
    dst_path: str
    read_only: bool = False

@dataclass
class Role:
    name: str
    image: str
    entrypoint: str
    args: list
    env: dict
    num_replicas: int
    max_retries: int
    resource: Resource
    port_map: dict
    mounts: list = field(default_factory=list)

@dataclass
class AppDef:
    name: str
    roles: list
"""


def _component(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> Any:
    pkg = tmp_path / "stub" / "torchx"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "specs.py").write_text(STUB)
    monkeypatch.syspath_prepend(str(tmp_path / "stub"))
    for name in ("torchx", "torchx.specs"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    path = tmp_path / "component.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("component", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_component_runs_the_jobs_torchrun_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mount = tmp_path / "data"
    cfg = api.load_job(ROOT / "examples" / "trn1-bert-large.toml", [f'kubernetes.mount="{mount}"'])
    app = _component(tmp_path, monkeypatch, torchx.component(cfg)).bert_large_trn1(image="img:1")
    (role,) = app.roles
    assert (app.name, role.image, role.num_replicas, role.max_retries) == (
        "bert-large-trn1",
        "img:1",
        2,
        3,
    )
    assert role.resource.devices == {"aws.amazon.com/neuron": 16, "vpc.amazonaws.com/efa": 8}
    assert role.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1" and role.port_map == {
        "c10d": 29400
    }

    # What TorchX does with the role's args before the scheduler starts it (macros.Values).
    macros = {"rank0_env": "TORCHX_RANK0_HOST", "app_id": "bert-large-trn1-x7", "replica_id": "1"}
    script = string.Template(role.args[1]).safe_substitute(macros)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(
        f'#!/bin/sh\n"{sys.executable}" -c \'import json, sys; '
        f'print(json.dumps(sys.argv[1:]))\' "$@" > "{tmp_path / "argv.json"}"\n'
    )
    (bin_dir / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TORCHX_RANK0_HOST": "host-0"}
    subprocess.run([role.entrypoint, role.args[0], script], env=env, check=True, timeout=60)

    run = mount / "runs" / "bert-large-trn1"
    written = jobfile.load(run / "job.toml")
    assert (
        written.derived.config_hash == cfg.derived.config_hash
        and written.kubernetes.mount == str(mount)
    )
    assert not list(run.glob(".job.toml.*"))  # written through a temporary file, then renamed
    want = command(
        cfg,
        Rendezvous("c10d", "host-0:29400", run_id="bert-large-trn1-x7"),
        job_file=str(run / "job.toml"),
        storage=str(mount),
        python="python",
        workdir=WORKSPACE_DIR,
    )
    assert json.loads((tmp_path / "argv.json").read_text()) == want[1:]


def test_cli_writes_the_component(tmp_path: Path) -> None:
    out = tmp_path / "bert.py"
    result = run_cli(
        "export",
        "torchx",
        str(ROOT / "examples" / "trn1-bert-large.toml"),
        "--out",
        str(out),
        "--image",
        "img:2",
    )
    assert result.returncode == 0, result.stderr
    assert f"{out}:bert_large_trn1" in result.stdout
    assert "def bert_large_trn1(image: str = 'img:2')" in out.read_text()
    bad = run_cli(
        "export",
        "torchx",
        str(ROOT / "examples" / "trn1-bert-large.toml"),
        "--set",
        "job.nproc_per_node=64",
    )
    assert_user_error(bad, "job.nproc_per_node")
    assert not bad.stdout
