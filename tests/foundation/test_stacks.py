"""Declared = tested: pyproject's floors are versions CI runs (the trn1 stack, stacks/trn1.txt),
and the trn1 image pins the transformers that stack runs."""

from __future__ import annotations

import re
import tomllib

from tests.conftest import ROOT
from trainmaster.cluster import image, versions

REQUIREMENT = re.compile(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*(.*)$")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def floors() -> dict[str, str]:
    """Each runtime dependency's floor (its >= bound) in pyproject.toml."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out = {}
    for dep in deps:
        m = REQUIREMENT.match(dep)
        assert m, dep
        lower = re.search(r">=\s*([0-9][^,;\s]*)", m[2])
        assert lower, f"{dep}: every dependency declares a floor"
        out[norm(m[1])] = lower[1]
    return out


def stack(name: str) -> dict[str, str]:
    pins = {}
    for line in (ROOT / "stacks" / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            pkg, _, version = line.partition("==")
            assert version, f"stacks/{name}: {line!r} is not pinned exactly"
            pins[norm(pkg)] = version
    return pins


def release(version: str) -> tuple[int, ...]:
    parts = version.split(".")
    return tuple(int(p) for p in parts) + (0,) * (3 - len(parts))


def test_every_floor_is_a_version_the_trn1_stack_runs() -> None:
    pins = stack("trn1.txt")
    for name, floor in floors().items():
        assert name in pins, f"{name}: not in stacks/trn1.txt"
        assert release(pins[name]) == release(floor), f"{name}: floor {floor}, stack {pins[name]}"


def test_the_trn1_image_pins_the_transformers_the_stack_runs() -> None:
    pins = stack("trn1.txt")
    assert pins["transformers"] == versions.TRN1_TRANSFORMERS
    assert f'"transformers=={versions.TRN1_TRANSFORMERS}"' in image.neuron()
    assert "transformers==" not in image.cpu() and "transformers==" not in image.cuda()
    assert pins["torch"] == pins["torch-xla"] == "2.9.0"  # the Neuron 2.29.1 DLC's


def test_make_test_runs_the_stacks_suite_in_the_trn1_environment() -> None:
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: .*\bstacks\b", make, re.MULTILINE)
    assert "-c stacks/trn1.txt" in make and "pytest -q -m stacks" in make
