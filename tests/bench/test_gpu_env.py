"""bench/gpu_env.py: whether a machine's own Python can run the GPU bench without installing
anything (gpu.sh on a GPU node with no registry), and the exact list of what is missing."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import gpu_bench  # noqa: E402
import gpu_env  # noqa: E402


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("2.11.0+cu130", True),
        ("2.9.0", True),
        ("2.13.0+cpu", True),
        ("2.14.0", False),
        ("2.8.1", False),
    ],
)
def test_a_torch_is_taken_inside_the_declared_range_only(version: str, ok: bool) -> None:
    assert gpu_env.satisfies(version, gpu_env.declared()["torch"]) is ok


def test_what_does_not_fit_is_named_with_the_spec_it_needs() -> None:
    specs = {"torch": ">=2.9,<2.14", "numpy": ">=99"}
    found = gpu_env.problems(("numpy", "no-such-dist-here", "torch"), specs)
    assert found == [f"numpy {md.version('numpy')} (needs >=99)", "no-such-dist-here (missing)"]


def test_without_a_gpu_the_machine_python_is_not_used() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_env.py")],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},  # no GPU, even on a machine with one
    )
    assert r.returncode == gpu_env.NO_TORCH and "sees no GPU" in r.stderr


# Every process of the run (the bench starts one child per mode, the launch its supervisor and
# trainer) lists its imports at exit. boto3 is made unimportable: tensorboard's file layer
# imports it if it is there (for s3:// paths), and the bench must run where it is not.
SITECUSTOMIZE = """
import atexit, os, sys

sys.modules["boto3"] = None

def _dump():
    path = os.path.join(os.environ["TM_IMPORTS"], str(os.getpid()))
    with open(path, "w") as f:
        f.write("\\n".join({m.partition(".")[0] for m, v in list(sys.modules.items()) if v is not None}))

atexit.register(_dump)
"""


@pytest.mark.slow
def test_needed_names_every_declared_package_the_bench_imports(tmp_path: Path) -> None:
    """The dry run of every mode (the real run's code on the CPU, its children and the launched
    job too) imports only torch and gpu_env.NEEDED among pyproject's dependencies, and succeeds:
    a machine with those runs the whole bench, launch included."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (tmp_path / "imports").mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path / "site"),
        "TM_IMPORTS": str(tmp_path / "imports"),
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
    }
    r = subprocess.run(
        ["bash", "bench/gpu.sh", "--dry", "--steps", "1", "--warmup", "0"],  # every mode
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    results = json.loads(r.stdout)["results"]
    assert [x.get("error") for x in results] == [None] * len(results), results
    assert {x["mode"] for x in results} == set(gpu_bench.MODES)
    dumps = list((tmp_path / "imports").iterdir())
    assert len(dumps) >= len(gpu_bench.MODES) + 2  # the bench, a child per mode, the job's
    tops = {name for f in dumps for name in f.read_text().split()}
    dists = md.packages_distributions()
    imported = {gpu_env._norm(d) for top in tops for d in dists.get(top, [])}
    declared = set(gpu_env.declared())
    assert imported & declared == {gpu_env._norm(n) for n in (*gpu_env.NEEDED, "torch")}
