"""bench/gpu_wheels.py: which wheels a registry-less GPU machine needs, by pip's own rule (an
installed distribution stays when every requirement on it accepts its version), worked out here
from wheels' metadata and the machine's package list, without the machine."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import gpu_env  # noqa: E402
import gpu_wheels  # noqa: E402


def wheel(folder: Path, name: str, version: str, *requires: str) -> Path:
    """A real (empty) wheel file with the METADATA pip would read."""
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", meta)
    return path


@pytest.fixture
def needed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two roots, as pyproject states them: transformers below 5, typer from 0.29."""
    monkeypatch.setattr(gpu_env, "NEEDED", ("transformers", "typer"))
    monkeypatch.setattr(
        gpu_env, "declared", lambda: {"transformers": ">=4.51.3,<5", "typer": ">=0.29,<1"}
    )


@pytest.fixture
def found(tmp_path: Path) -> dict[str, tuple[Path, Version, list[Requirement]]]:
    wheel(
        tmp_path,
        "transformers",
        "4.57.6",
        "huggingface-hub<1.0,>=0.34.0",
        "tokenizers<=0.23.0,>=0.22.0",
        "numpy>=1.17",
        "pytest; extra == 'testing'",  # extras are not installed
    )
    wheel(tmp_path, "huggingface-hub", "0.36.2", "hf-xet<2.0.0,>=1.1.3; platform_machine=='x86_64'")
    wheel(tmp_path, "hf-xet", "1.8.0")
    wheel(tmp_path, "tokenizers", "0.22.2", "huggingface-hub<2.0,>=0.16.4")
    wheel(tmp_path, "numpy", "2.5.5")
    wheel(tmp_path, "typer", "0.29.2", "pydantic>=2", "shellingham>=1.3.0")
    wheel(tmp_path, "pydantic", "2.14.4", "typing-extensions>=4.14.1; python_version < '3.13'")
    wheel(tmp_path, "typing-extensions", "4.16.0")
    wheel(tmp_path, "shellingham", "1.5.4")
    return gpu_wheels.wheels(tmp_path)


def test_each_wheel_is_read_by_its_canonical_name_with_its_requirements(found) -> None:  # noqa: ANN001
    whl, version, reqs = found["huggingface-hub"]
    assert whl.name.startswith("huggingface_hub-0.36.2") and version == Version("0.36.2")
    assert [str(r) for r in reqs] == ['hf-xet<2.0.0,>=1.1.3; platform_machine == "x86_64"']


@pytest.mark.usefixtures("needed")
def test_a_package_out_of_range_brings_what_its_wheel_needs_and_rules_out_what_no_longer_fits(
    found,  # noqa: ANN001
) -> None:
    have = {
        "transformers": Version("5.17.0"),  # pyproject wants <5
        "huggingface-hub": Version("1.33.0"),  # fine until transformers 4.57 asks for <1.0
        "tokenizers": Version("0.23.2"),  # fine for pyproject, not for transformers 4.57
        "numpy": Version("2.5.2"),
        "typer": Version("0.29.0"),  # fits: its own requirements are the image's business
        "hf-xet": None,  # present, version unknown: taken to fit
    }
    assert gpu_wheels.needed_there(found, have, "3.12") == {
        "transformers",
        "huggingface-hub",
        "tokenizers",
    }


@pytest.mark.usefixtures("needed")
def test_the_markers_are_those_of_the_target_python(found) -> None:  # noqa: ANN001
    have = {"transformers": Version("4.57.6"), "typer": Version("0.28.0")}
    on_312 = gpu_wheels.needed_there(found, have, "3.12")
    assert on_312 == {"typer", "pydantic", "typing-extensions", "shellingham"}
    assert gpu_wheels.needed_there(found, have, "3.13") == on_312 - {"typing-extensions"}


@pytest.mark.usefixtures("needed")
def test_on_a_bare_machine_everything_travels_and_nothing_is_counted_twice(found) -> None:  # noqa: ANN001
    assert gpu_wheels.needed_there(found, {}, "3.12") == set(found)


def test_the_package_list_takes_freeze_lines_bare_names_and_comments(tmp_path: Path) -> None:
    f = tmp_path / "have.txt"
    f.write_text(
        "# the image\nTorch==2.11.0\nhuggingface_hub==1.33.0  # listed\nh5py\n\n"
        "distro-info==1.1build1\n"  # Debian's, no PEP 440 version: as if absent, as pip does
    )
    assert gpu_wheels.read_have(f) == {
        "torch": Version("2.11.0"),
        "huggingface-hub": Version("1.33.0"),
        "h5py": None,
    }


def test_the_lent_images_list_names_only_real_versions() -> None:
    have = gpu_wheels.read_have(ROOT / "bench" / "gpu-image.txt")
    assert have["transformers"] == Version("5.17.0") and "pydantic" not in have
    assert not gpu_env.satisfies(str(have["transformers"]), gpu_env.declared()["transformers"])


@pytest.mark.usefixtures("needed")
def test_a_needed_project_without_a_wheel_is_still_named(found) -> None:  # noqa: ANN001
    del found["shellingham"]  # typer needs it; nothing downloaded for it
    have = {"transformers": Version("4.57.6"), "typer": Version("0.28.0")}
    assert "shellingham" in gpu_wheels.needed_there(found, have, "3.12") - found.keys()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--python-version", "312"], "--python-version 312: give X.Y"),
        (["--have", "no-such-list.txt"], "--have no-such-list.txt: no such file"),
    ],
)
def test_bad_arguments_say_which_and_download_nothing(
    tmp_path: Path, args: list[str], says: str
) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_wheels.py"), str(tmp_path / "kit"), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 2 and r.stderr.startswith(f"error: {says}"), r.stderr
    assert len(r.stderr.splitlines()) == 1 and not (tmp_path / "kit").exists()
