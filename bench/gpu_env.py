"""Can this Python run bench/gpu_bench.py as it is? bench/gpu.sh asks before it installs anything.

A cluster's GPU nodes often reach no package registry, and their images already hold a CUDA
torch (an H200 node here had torch 2.11.0+cu130). When that torch is inside pyproject's range
and sees a GPU, and the other packages the bench imports are there too, the bench runs on them
with this checkout's src/ on PYTHONPATH: nothing installed. Otherwise this says exactly what is
missing, and gpu.sh installs it from a wheel folder (TRAINMASTER_WHEELS) or, as before, makes
.venv-gpu with the pinned torch from PyPI.

    python bench/gpu_env.py          exit 0: usable (says which torch, CUDA, transformers)
                                     exit 3: no CUDA torch in the declared range here
                                     exit 4: torch fits; the packages named are missing or out
                                             of range (one line; --missing prints their specs)

Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The distributions the bench imports, torch apart: its data prepare and the trainer's parts,
# and for the launch mode the CLI (typer), the trainer's event files (tensorboard) and the
# job's /metrics (prometheus-client). The rest of pyproject (kubernetes, boto3, jsonschema,
# matplotlib, psutil, python-etcd) serves the cluster side, which a local GPU job never loads.
# tests/bench/test_gpu_env.py checks this against what a --dry run of every mode imports.
NEEDED = (
    "transformers",
    "tokenizers",
    "numpy",
    "h5py",
    "isal",
    "pydantic",
    "tomli-w",
    "pyyaml",
    "rich",
    "typer",
    "tensorboard",
    "prometheus-client",
)
USABLE, NO_TORCH, MISSING = 0, 3, 4


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> dict[str, str]:
    """Each runtime dependency's specifier in pyproject.toml, by normalised name."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out = {}
    for dep in deps:
        m = re.match(r"^([A-Za-z0-9_.-]+)\s*([^;#]*)", dep)
        if m:
            out[_norm(m[1])] = m[2].strip()
    return out


def release(version: str) -> tuple[int, ...]:
    """2.11.0+cu130 -> (2, 11, 0): the numeric release, local label and suffixes dropped."""
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0].split("rc")[0])[:3])


def satisfies(version: str, spec: str) -> bool:
    """Whether `version` meets a specifier of >=, <, <=, >, == and != clauses (no wildcards)."""
    have = release(version)
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        m = re.match(r"(>=|<=|==|!=|<|>)\s*(\S+)", clause)
        if not m:
            return False
        want = release(m[2])
        width = max(len(have), len(want))
        a, b = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
        ok = {
            ">=": a >= b,
            "<=": a <= b,
            "==": a == b,
            "!=": a != b,
            "<": a < b,
            ">": a > b,
        }[m[1]]
        if not ok:
            return False
    return True


def problems(names: tuple[str, ...], specs: dict[str, str]) -> list[str]:
    """'name (missing)' or 'name X.Y (needs SPEC)' for each package that does not fit."""
    out = []
    for name in names:
        spec = specs.get(_norm(name), "")
        try:
            version = md.version(name)
        except md.PackageNotFoundError:
            out.append(f"{name} (missing)")
            continue
        if not satisfies(version, spec):
            out.append(f"{name} {version} (needs {spec})")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--missing", action="store_true", help="print the specs of what is missing")
    a = ap.parse_args()
    specs = declared()
    torch_problem = problems(("torch",), specs)
    if torch_problem:
        print(
            f"gpu.sh: {sys.executable}: torch {torch_problem[0].partition(' ')[2]}", file=sys.stderr
        )
        return NO_TORCH
    import torch

    if not torch.cuda.is_available():
        print(f"gpu.sh: {sys.executable}: torch {torch.__version__} sees no GPU", file=sys.stderr)
        return NO_TORCH
    missing = problems(NEEDED, specs)
    if a.missing:
        print(" ".join(f"{p.split()[0]}{specs.get(_norm(p.split()[0]), '')}" for p in missing))
        return MISSING if missing else USABLE
    if missing:
        wheels = os.environ.get("TRAINMASTER_WHEELS")
        then = (
            f"installing them into .venv-gpu from {wheels}"
            if wheels
            else "install them, or set TRAINMASTER_WHEELS to a folder of their wheels "
            "(bench/gpu_wheels.py, on a machine with a registry), or TRAINMASTER_GPU_INSTALL=1 "
            "to make .venv-gpu from PyPI"
        )
        print(
            f"gpu.sh: {sys.executable} has torch {torch.__version__} (CUDA {torch.version.cuda}), "
            f"but not what the bench needs: {', '.join(missing)}; {then}",
            file=sys.stderr,
        )
        return MISSING
    print(
        f"gpu.sh: using {sys.executable}: torch {torch.__version__} (CUDA {torch.version.cuda}), "
        f"transformers {md.version('transformers')}; nothing (more) to install",
        file=sys.stderr,
    )
    return USABLE


if __name__ == "__main__":
    sys.exit(main())
