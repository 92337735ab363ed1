"""The wheels a GPU machine without a package registry lacks for bench/gpu.sh, gathered here.

A GPU node's image usually holds a CUDA torch and much of what the bench needs, but not all of
it, or not in pyproject's ranges (one CUDA image here had transformers 5.17 and no pydantic).
gpu.sh then installs what is missing from a folder of wheels (TRAINMASTER_WHEELS=DIR) into
.venv-gpu, a venv beside the image's torch that sees the image's packages, with the image's own
pip. This fills that folder, on a machine that reaches PyPI:

    python bench/gpu_wheels.py DIR [--python-version 3.12] [--have FILE]

It downloads, for the GPU machine's Python on x86-64 Linux, every wheel that the bench's
packages (gpu_env.NEEDED, with pyproject's ranges) need, torch apart. With --have (the target's
`pip list --format=freeze`: `name==version` lines; a bare `name` is taken to fit) it keeps only
those pip would install there: a package the target has at a version that every requirement on
it accepts stays out, with everything that only it needed. What would travel to a machine with a
size limit is what is left; the last line says how much.

Two things pip checks on the target that a freeze list cannot tell: the requirements of a
package kept there (its metadata is on that machine only), and extras. A kept package that asks
for a newer version of something this replaces fails the offline install there, by name.

Needs `packaging` (transformers depends on it, so every .venv of this project has it).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_env  # noqa: E402

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64")
PLATFORMS += ("manylinux2014_x86_64", "manylinux1_x86_64")


def roots() -> list[Requirement]:
    specs = gpu_env.declared()
    return [Requirement(f"{name}{specs.get(gpu_env._norm(name), '')}") for name in gpu_env.NEEDED]


def download(folder: Path, python: str) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:"]
    cmd += ["--python-version", python, "--implementation", "cp"]
    cmd += ["--abi", "cp" + python.replace(".", "")]
    for p in (*PLATFORMS, "any"):
        cmd += ["--platform", p]
    subprocess.run([*cmd, "-d", str(folder), *map(str, roots())], check=True)


def wheels(folder: Path) -> dict[str, tuple[Path, Version, list[Requirement]]]:
    """Each wheel's project (canonical name), file, version and requirements."""
    out = {}
    for whl in sorted(folder.glob("*.whl")):
        with zipfile.ZipFile(whl) as z:
            meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            meta = Parser().parsestr(z.read(meta_name).decode())
        reqs = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
        out[canonicalize_name(meta["Name"])] = (whl, Version(meta["Version"]), reqs)
    return out


def read_have(path: Path) -> dict[str, Version | None]:
    """name -> version (None: there, version not given). A version that is no PEP 440 one
    (Debian's `1.1build1`) leaves the package out, as if absent: pip passes it over too."""
    have: dict[str, Version | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            try:
                have[canonicalize_name(name.strip())] = Version(version) if version else None
            except InvalidVersion:
                continue
    return have


def needed_there(
    found: dict[str, tuple[Path, Version, list[Requirement]]],
    have: dict[str, Version | None],
    python: str,
) -> set[str]:
    """The projects pip would install on the target, by the rule it follows: an installed
    distribution stays when it meets every requirement on it; what is installed brings its own
    requirements. Repeated until nothing changes, since a new requirement can rule out a kept one
    (transformers 4.57 needs huggingface-hub below 1.0)."""
    env = {**default_environment(), "python_version": python, "python_full_version": python + ".0"}
    env.update(sys_platform="linux", platform_system="Linux", platform_machine="x86_64")
    install: set[str] = set()
    while True:
        wants: dict[str, list[Requirement]] = {}
        # a project with no wheel here brings nothing: main() names it as missing
        for req in [*roots(), *(r for p in install if p in found for r in found[p][2])]:
            if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
                wants.setdefault(canonicalize_name(req.name), []).append(req)
        grown = set(install)
        for name, reqs in wants.items():
            there = have.get(name, False)
            fits = there is None or (
                there is not False and all(r.specifier.contains(there, True) for r in reqs)
            )
            if not fits:
                grown.add(name)
        if grown == install:
            return install
        install = grown


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path, help="where the wheels go (made if missing)")
    ap.add_argument("--python-version", default="3.12", help="the GPU machine's Python (X.Y)")
    ap.add_argument("--have", type=Path, help="the GPU machine's `pip list --format=freeze`")
    a = ap.parse_args()
    if not re.fullmatch(r"3\.\d+", a.python_version):
        print(f"error: --python-version {a.python_version}: give X.Y, e.g. 3.12", file=sys.stderr)
        return 2
    if a.have and not a.have.is_file():
        print(
            f"error: --have {a.have}: no such file (a `pip list --format=freeze`)", file=sys.stderr
        )
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        # Downloaded apart, then put in place: wheels an earlier run left in the folder (other
        # versions, which pip might take there) are replaced, and a failed run changes nothing.
        try:
            download(Path(tmp), a.python_version)
        except subprocess.CalledProcessError as exc:
            print(
                f"error: pip download failed ({exc.returncode}): does PyPI answer here?",
                file=sys.stderr,
            )
            return 1
        found = wheels(Path(tmp))
        if a.have:
            keep = needed_there(found, read_have(a.have), a.python_version)
            missing = keep - found.keys()
            if missing:
                print(
                    f"error: no wheel downloaded for {', '.join(sorted(missing))}", file=sys.stderr
                )
                return 1
            found = {n: found[n] for n in keep}
        a.folder.mkdir(parents=True, exist_ok=True)
        for stale in a.folder.glob("*.whl"):
            stale.unlink()
        for name, (whl, version, reqs) in found.items():
            found[name] = (Path(shutil.move(whl, a.folder / whl.name)), version, reqs)
    size = sum(whl.stat().st_size for whl, _, _ in found.values())
    for name in sorted(found):
        print(f"{found[name][0].name}")
    print(f"gpu_wheels: {len(found)} wheels, {size / 2**20:.1f} MiB in {a.folder}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
