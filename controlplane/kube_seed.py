"""A containerd store holding images, made once and given to every real node at its start.

Importing the training image into a node's containerd copies and unpacks it: PyPI's torch is
the CUDA build, so that is ~5.7 GB of layers kept twice (content and snapshots), ~2 minutes and
~11 GB a node, every `up`. Instead the images are imported once into a store of their own (a
containerd run only for that, with the nodes' snapshotter) kept in the cache beside the
archives, keyed by the archives; each node's containerd root then starts as a hard-linked copy
of it (`cp -al`: seconds, no bytes copied). That is safe because containerd never writes a
committed layer or a content blob in place (a container writes to its own upper dir); its two
bolt databases it does write, so each node gets its own copy of those. An EKS node whose AMI
has the image baked in starts the same way: the pods' image is there before the kubelet asks.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import kube_images

CACHE = (
    Path(os.environ.get("TRAINMASTER_KUBE_CACHE", Path.home() / ".cache/trainmaster-kube"))
    / "stores"
)
DONE = ".complete"
DATABASES = ("io.containerd.metadata.v1.bolt/meta.db", "io.containerd.snapshotter.v1.overlayfs/metadata.db")  # fmt: skip


def key(archives: Sequence[Path]) -> str:
    """The store's name: the archives' names and sizes (each archive is named by its inputs)."""
    text = "\n".join(f"{a.name} {a.stat().st_size}" for a in sorted(archives))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _config(root: Path, state: Path) -> str:
    # The CRI plugin stays off: nothing here runs a pod, and its CNI setup would only complain.
    return f"""version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{state}/containerd.sock"
"""


def make(archives: Sequence[Path], cache: Path = CACHE) -> tuple[Path, bool]:
    """The store holding ARCHIVES, made if missing; returns its containerd root and whether it
    was made now. Only one store is kept: each is ~11 GB for the training image, and a change
    to src/ makes a new image (the nodes' copies are hard links: a running plane keeps its own)."""
    store = cache / f"store-{key(archives)}"
    if (store / DONE).exists():
        return store / "root", False
    for old in cache.glob("store-*"):
        shutil.rmtree(old, ignore_errors=True)  # an older store, or one half made by a killed run
    store.mkdir(parents=True)
    # a short state dir: a unix socket's path has at most 108 bytes
    state = Path(tempfile.mkdtemp(prefix="tm-seed-", dir="/run"))
    (store / "containerd.toml").write_text(_config(store / "root", state))
    log = (store / "containerd.log").open("wb")
    proc = subprocess.Popen(
        ["containerd", "--config", str(store / "containerd.toml")],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        sock = state / "containerd.sock"
        deadline = time.monotonic() + 60
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"containerd for the image store did not start: {store}")
            time.sleep(0.1)  # waiting for containerd's socket, bounded by the deadline
        for archive in archives:
            kube_images.import_into(str(sock), archive)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()
        shutil.rmtree(state, ignore_errors=True)
    (store / DONE).touch()
    return store / "root", True


def give(seed_root: Path, node_root: Path) -> None:
    """A node's containerd root as a hard-linked copy of SEED_ROOT, its databases its own."""
    node_root.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(seed_root), str(node_root)], check=True)
    for db in DATABASES:
        path = node_root / db
        if path.exists():
            path.unlink()  # break the link: the node's containerd writes its own copy
            shutil.copy2(seed_root / db, path)
