"""The CPU training image built for real from `cluster plan`'s Dockerfile (controlplane/
kube_image.py), run, found again by its inputs, and loaded into containerd.

The first run builds (minutes: debootstrap, torch's wheels from PyPI, a multi-GB export); later
runs find the image by its inputs' hash, or rebuild only the layers after a change to src/.
Needs root, buildah, debootstrap, containerd and ctr (Debian's packages); skips without them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.controlplane.conftest import controlplane_module
from trainmaster.cluster import versions

TOOLS = ("buildah", "debootstrap", "containerd", "ctr", "runc")
pytestmark = [
    pytest.mark.realnodes,
    pytest.mark.timeout(3600),  # a cold build: debootstrap, GBs of wheels, the export
    pytest.mark.skipif(
        os.geteuid() != 0 or not all(shutil.which(t) for t in TOOLS),
        reason=f"needs root and {', '.join(TOOLS)}",
    ),
]


@pytest.fixture(scope="module")
def kube_image() -> Any:
    return controlplane_module("kube_image")


@pytest.fixture(scope="module")
def built(kube_image: Any) -> dict:
    return kube_image.build("cpu")


def _sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def test_cpu_image_holds_the_pinned_torch_and_the_project(built: dict) -> None:
    ctr = _sh("buildah", "from", "--pull-never", built["ref"])
    try:
        code = (
            "import torch, trainmaster, etcd, tensorboard; "
            "print(torch.__version__, trainmaster.__version__, int(torch.ones(3).sum()))"
        )
        out = _sh("buildah", "run", ctr, "--", "python", "-c", code)
    finally:
        _sh("buildah", "rm", ctr)
    torch_version, trainmaster_version, total = out.split()[-3:]
    assert torch_version.split("+")[0] == versions.TORCH_VERSION
    assert trainmaster_version and total == "3"
    assert built["size_bytes"] > 0 and Path(built["archive"]).is_file()


def test_unchanged_inputs_build_nothing(kube_image: Any, built: dict) -> None:
    again = kube_image.build("cpu")
    assert not again["built"] and not again["times"]["base_cold"]
    assert (again["ref"], again["id"], again["archive"]) == (
        built["ref"],
        built["id"],
        built["archive"],
    )


def _containerd(folder: Path) -> subprocess.Popen:
    """A throwaway containerd, everything under `folder`; CRI is off (no kubelet talks to it):
    the import and `ctr run` need only its content store, snapshotter and runtime."""
    folder.mkdir(parents=True)
    config = folder / "config.toml"
    config.write_text(
        f'version = 2\nroot = "{folder}/root"\nstate = "{folder}/state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
    )
    sock = folder / "sock"
    log = (folder / "log").open("w")
    proc = subprocess.Popen(
        ["containerd", "--root", f"{folder}/root", "--state", f"{folder}/state"]
        + ["--address", str(sock), "--config", str(config)],
        stdout=log,
        stderr=log,
    )
    for _ in range(100):
        if (
            sock.exists()
            and subprocess.run(["ctr", "-a", str(sock), "version"], capture_output=True).returncode
            == 0
        ):
            return proc
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"containerd did not start: {(folder / 'log').read_text()[-2000:]}")


@pytest.fixture
def sockets() -> Iterator[list[Path]]:
    # not under pytest's tmp_path: a unix socket's path is at most 107 bytes
    base = Path(_sh("mktemp", "-d", "/tmp/tm-ctd-XXXXXX"))
    procs = [_containerd(base / name) for name in ("a", "b")]
    try:
        yield [base / name / "sock" for name in ("a", "b")]
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)


def test_load_imports_into_each_containerd_under_the_manifests_name(
    kube_image: Any, built: dict, sockets: list[Path]
) -> None:
    """The etcd stand-in (the smaller archive) goes into two containerds, named exactly as the
    etcd add-on's manifest names its image, and runs its binary from the manifest's path."""
    result = kube_image.load(built["etcd"]["archive"], sockets)
    assert [r["refs"] for r in result] == [[versions.ETCD_IMAGE]] * 2
    for sock in sockets:
        assert versions.ETCD_IMAGE in kube_image.images(sock)
    out = _sh(
        "ctr", "-a", str(sockets[0]), "-n", "k8s.io", "run", "--rm", versions.ETCD_IMAGE,
        "etcd-version", "/usr/local/bin/etcd", "--version",
    )  # fmt: skip
    assert out.startswith("etcd Version: 3.4")
