"""The `real_nodes` fixture: a plane whose nodes run containers (kube.py up --real-nodes).

`kube.py up --nodes 0 --real-nodes 6 --image-archive ...` (the training image built, as
test_image.py builds it, and given to every node from its start) in a run dir and on an API port of its own (not the
`real_kube` plane's: TRAINMASTER_KUBE_REAL_DIR, default /tmp/trainmaster-kube-real, any free
port), started afresh for the session and taken down at its end, since its tests kill a node.
Without built binaries the tests skip, unless TRAINMASTER_KUBE_BUILD=1 lets the fixture build
them (as `real_kube` decides); on a host that cannot run real nodes at all (not root, no
containerd, runc or CNI plugins) they skip too, saying what is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.controlplane.conftest import CONTROLPLANE, KUBE_PY, RealKube, controlplane_module

RUN_DIR = Path(os.environ.get("TRAINMASTER_KUBE_REAL_DIR", "/tmp/trainmaster-kube-real"))
# test_real_nodes.py uses (and loses) real-1..3, test_real_job.py real-4..6 (2 and a spare)
COUNT = 6
UP_TIMEOUT_S = 400  # `up --real-nodes 3` takes ~30 s here, minutes on a loaded machine
IMAGE_STORE_S = 900  # the first `up` with a new image makes its store: ~3 minutes here


@dataclass
class RealNodes:
    """The plane: its run dir, API clients, kube.py run against it, a fresh namespace."""

    run_dir: Path
    api: Any
    image: str | None  # the training image every node holds (None where it cannot be built)
    _namespaces: list[str] = field(default_factory=list)

    @property
    def state(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "state.json").read_text())

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    def node(self, name: str) -> dict[str, Any]:
        return next(n for n in self.state["real_nodes"] if n["name"] == name)

    def kube(self, *args: str) -> subprocess.CompletedProcess[str]:
        return _kube(self.run_dir, *args)

    def namespace(self) -> str:
        name = f"real-{uuid.uuid4().hex[:8]}"
        self.core.create_namespace({"metadata": {"name": name}})
        self._namespaces.append(name)
        # pods need the namespace's `default` service account, made by the controller manager
        self.wait_for(
            lambda: _has_default_sa(self.core, name),
            30,
            f"the default service account in {name}",
        )
        return name

    wait_for = RealKube.wait_for  # poll with a deadline, AssertionError after it


def _has_default_sa(core: Any, namespace: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        core.read_namespaced_service_account("default", namespace)
    except ApiException:
        return False
    return True


def _kube(run_dir: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRAINMASTER_KUBE_DIR": str(run_dir)}
    return subprocess.run(
        [sys.executable, str(KUBE_PY), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _built(kube: Any, real: Any) -> bool:
    try:
        bins = kube.bin_dir()
    except (OSError, subprocess.CalledProcessError):  # no Go: nothing can be built either
        return False
    names = [*kube.kube_procs.ORDER, *real.BINARIES]
    return all((bins / n).exists() for n in names) and (bins.parent / "share/.complete").exists()


def _training_image() -> tuple[str | None, list[str]]:
    """The CPU training image built from `cluster plan`'s Dockerfile and the etcd add-on's
    stand-in (controlplane/kube_image.py; cached by their inputs, minutes when cold), as the
    archives every node starts with; (None, []) where buildah or debootstrap is missing."""
    if not all(shutil.which(t) for t in ("buildah", "debootstrap")):
        return None, []
    built = controlplane_module("kube_image").build("cpu")
    return built["image"], [built["archive"], built["etcd"]["archive"]]


@pytest.fixture(scope="session")
def real_nodes() -> Iterator[RealNodes]:
    pytest.importorskip("kubernetes")
    kube, real = controlplane_module("kube"), controlplane_module("kube_real")
    hostnet = controlplane_module("kube_hostnet")
    if not _built(kube, real):
        if not os.environ.get("TRAINMASTER_KUBE_BUILD"):
            pytest.skip(
                "control-plane binaries not built: `make kube-build` (once, minutes), "
                "or set TRAINMASTER_KUBE_BUILD=1 to build them here"
            )
        subprocess.run(["bash", str(CONTROLPLANE / "build.sh")], check=True)
    problem = hostnet.problem(RUN_DIR)
    if problem and (os.geteuid() != 0 or problem.startswith("missing")):
        pytest.skip(problem)
    _kube(RUN_DIR, "down")  # a plane a killed session left here: start afresh
    image, archives = _training_image()
    given = [a for path in archives for a in ("--image-archive", path)]
    up = _kube(
        RUN_DIR,
        "up",
        "--nodes",
        "0",
        "--real-nodes",
        str(COUNT),
        "--port",
        "0",
        *given,
        timeout=UP_TIMEOUT_S + (IMAGE_STORE_S if given else 0),
    )
    if up.returncode != 0:
        _kube(RUN_DIR, "down")
        pytest.fail(f"kube.py up --real-nodes {COUNT} failed:\n{up.stdout}\n{up.stderr}")
    print(up.stdout)  # the timings, shown with -s
    from kubernetes import config

    plane = RealNodes(
        RUN_DIR, config.new_client_from_config(config_file=str(RUN_DIR / "kubeconfig")), image
    )
    try:
        yield plane
    finally:
        for name in plane._namespaces:
            with contextlib.suppress(Exception):
                plane.core.delete_namespace(name)
        down = _kube(RUN_DIR, "down")
        assert down.returncode == 0, down.stderr
