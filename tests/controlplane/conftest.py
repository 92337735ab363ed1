"""The `real_kube` fixture: a real local Kubernetes control plane (controlplane/kube.py).

etcd, kube-apiserver, kube-controller-manager, Volcano (webhook, controllers, scheduler) and
kwok's fake nodes, on 127.0.0.1. A plane already up in TRAINMASTER_KUBE_DIR (`make kube-up`)
is reused and left running; otherwise the fixture starts one and stops it at the end of the
session. Its binaries are built once by `make kube-build` (minutes); without them the tests
skip, unless TRAINMASTER_KUBE_BUILD=1 asks the fixture to build them first.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTROLPLANE = ROOT / "controlplane"
KUBE_PY = CONTROLPLANE / "kube.py"
T = TypeVar("T")


def controlplane_module(name: str) -> Any:
    """A module of controlplane/ (kube.py, kube_faults.py), as its scripts import each other."""
    if str(CONTROLPLANE) not in sys.path:
        sys.path.insert(0, str(CONTROLPLANE))
    return importlib.import_module(name)


def _kube_module() -> Any:
    """controlplane/kube.py as a module: the same is_up and bin_dir the script uses."""
    return controlplane_module("kube")


def _built(kube: Any) -> bool:
    try:
        bins = kube.bin_dir()
    except (OSError, subprocess.CalledProcessError):  # no Go: nothing can be built either
        return False
    return (
        all((bins / name).exists() for name in kube.kube_procs.ORDER)
        and (bins.parent / "share" / ".complete").exists()
    )


@dataclass
class RealKube:
    """A running control plane: its kubeconfig, its state (ports, nodes, instance type) and
    API clients; namespace() makes a fresh namespace that is deleted after the session."""

    run_dir: Path
    kubeconfig: Path
    state: dict[str, Any]
    api: Any  # kubernetes.client.ApiClient
    _namespaces: list[str] = field(default_factory=list)

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api)

    @property
    def coordination(self) -> Any:
        from kubernetes import client

        return client.CoordinationV1Api(self.api)

    @property
    def node_names(self) -> list[str]:
        return sorted(n.metadata.name for n in self.core.list_node().items)

    def namespace(self, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.core.create_namespace(
            {"metadata": {"name": name, "labels": {"trainmaster.io/test": "1"}}}
        )
        self._namespaces.append(name)
        # pods need the namespace's `default` service account, which the controller manager adds
        self.wait_for(
            lambda: exists(lambda: self.core.read_namespaced_service_account("default", name)),
            30,
            f"the default service account in {name}",
        )
        return name

    def wait_for(self, probe: Callable[[], T | None], timeout: float, what: str) -> T:
        """Poll PROBE until it returns something truthy (returned); AssertionError after timeout s."""
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.2)  # polling the control plane's progress, bounded by the deadline

    def delete_namespace(self, name: str, timeout: float = 60) -> None:
        """Delete NAME and wait (bounded) until no pod is left in it: kwok removes a deleted pod
        at once, and the namespace itself may take longer to disappear (its finalizers)."""
        if name not in self._namespaces:
            return  # deleted already
        self.core.delete_namespace(name)
        self._namespaces.remove(name)
        self.wait_for(
            lambda: not self.core.list_namespaced_pod(name).items or None,
            timeout,
            f"the pods of namespace {name} deleted",
        )

    def cleanup(self) -> None:
        for name in self._namespaces:
            with contextlib.suppress(Exception):  # best effort: the plane may be going down
                self.core.delete_namespace(name)


def exists(read: Callable[[], object]) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        read()
    except ApiException:
        return False
    return True


@pytest.fixture(scope="session")
def real_kube() -> Iterator[RealKube]:
    pytest.importorskip("kubernetes")
    kube = _kube_module()
    started = False
    if not kube.is_up(kube.RUN_DIR):
        if not _built(kube):
            if not os.environ.get("TRAINMASTER_KUBE_BUILD"):
                pytest.skip(
                    "control-plane binaries not built: `make kube-build` (once, minutes), "
                    "or set TRAINMASTER_KUBE_BUILD=1 to build them here"
                )
            subprocess.run(["bash", str(CONTROLPLANE / "build.sh")], check=True)
        # a plane of our own needs no fixed port: any free one, unless TRAINMASTER_KUBE_PORT says
        port = [] if os.environ.get("TRAINMASTER_KUBE_PORT") else ["--port", "0"]
        # the node controller's grace 30 s, not 50: the node-loss tests wait for it four times,
        # and what they prove does not depend on its length (bench/k8s_node_loss.py keeps 50)
        grace = ["--node-grace-s", "30"]
        up = subprocess.run(
            [sys.executable, str(KUBE_PY), "up", *port, *grace], capture_output=True, text=True
        )
        if up.returncode != 0:
            pytest.fail(f"kube.py up failed:\n{up.stdout}\n{up.stderr}")
        started = True
    from kubernetes import config

    run_dir = kube.RUN_DIR
    state = kube.read_state(run_dir)
    plane = RealKube(
        run_dir,
        run_dir / "kubeconfig",
        state,
        config.new_client_from_config(config_file=str(run_dir / "kubeconfig")),
    )
    try:
        yield plane
    finally:
        plane.cleanup()
        if started:
            subprocess.run([sys.executable, str(KUBE_PY), "down"], check=False)


@pytest.fixture
def kube_namespace(real_kube: RealKube) -> Iterator[str]:
    """A fresh namespace for one test, deleted after it; the next test starts once its pods are
    gone, so that it finds every node's devices free."""
    name = real_kube.namespace()
    yield name
    real_kube.delete_namespace(name)


# the fixtures of trainmaster's own jobs on this plane (cluster add-ons, a namespace with storage)
from tests.controlplane.kubejobs import cluster_addons, job_ns, plan_dir  # noqa: E402, F401

# a plane of real nodes of its own (kube.py up --real-nodes), for the `realnodes` tests
from tests.controlplane.realnodes import real_nodes  # noqa: E402, F401
