"""Container images for the real nodes, made here and imported into each node's containerd.

No registry is reachable from this machine, so nothing is ever pulled: every image a pod uses
must already be in its node's containerd (namespace k8s.io, the CRI plugin's), and pods use
imagePullPolicy IfNotPresent or Never. write_archive() makes a Docker image archive (what
`docker save` writes: manifest.json, the config, one uncompressed layer) from a few static
files, deterministically (mtime 0, root-owned), in milliseconds; the sandbox ("pause") image
and the smoke test's image are made so from controlplane/pause and controlplane/nettest.

load_image(run_dir, archive) imports an archive (Docker or OCI, e.g. from `buildah push IMAGE
docker-archive:FILE:NAME`) into every live real node of the plane in RUN_DIR:

    sys.path.insert(0, "controlplane"); import kube_images
    kube_images.load_image("/tmp/trainmaster-kube", "job.tar")  # {"real-1": ["NAME"], ...}
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PAUSE_IMAGE = "localhost/trainmaster/pause:1.0"  # containerd's sandbox_image on every node
NETTEST_IMAGE = "localhost/trainmaster/nettest:1.0"
NAMESPACE = "k8s.io"  # containerd's namespace of the CRI plugin, so the kubelet's


def _tar(members: dict[str, bytes], modes: dict[str, int] | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), (modes or {}).get(name, 0o644), 0
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def write_archive(
    out: Path, ref: str, files: dict[str, Path], entrypoint: list[str], cmd: list[str] | None = None
) -> Path:
    """A Docker image archive at OUT: image REF (a full name, e.g. localhost/x/y:1.0) of one layer
    holding FILES ({path in the image: file here}, executable), with ENTRYPOINT and CMD."""
    layer = _tar(
        {p.lstrip("/"): src.read_bytes() for p, src in files.items()},
        {p.lstrip("/"): 0o755 for p in files},
    )
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Cmd": cmd, "Env": ["PATH=/"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "controlplane/kube_images.py write_archive"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id.split(":")[1] + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": [layer_name]}]
    archive = _tar(
        {
            layer_name: layer,
            config_name: config_bytes,
            "manifest.json": json.dumps(manifest).encode(),
        }
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(archive)
    return out


def node_images(bins: Path, out_dir: Path) -> list[Path]:
    """The archives every real node gets at start: the sandbox image and the smoke test's."""
    return [
        write_archive(out_dir / "pause.tar", PAUSE_IMAGE, {"/pause": bins / "pause"}, ["/pause"]),
        write_archive(
            out_dir / "nettest.tar", NETTEST_IMAGE, {"/nettest": bins / "nettest"}, ["/nettest"]
        ),
    ]


def import_into(socket: str, archive: Path) -> list[str]:
    """Import ARCHIVE into the containerd at SOCKET (unpacked for the CRI's overlayfs
    snapshotter, so that a pod can start from it); returns the image names it brought."""
    done = subprocess.run(
        ["ctr", "--address", socket, "--namespace", NAMESPACE, "images", "import", str(archive)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ctr images import {archive} into {socket}: {done.stderr.strip()}")
    # ctr prints "unpacking NAME (sha256:...)...done" for each image it imported
    return [
        line.split()[1]
        for line in done.stdout.splitlines()
        if line.startswith("unpacking ") and len(line.split()) > 2
    ]


def load_image(run_dir: Path | str, archive: Path | str) -> dict[str, list[str]]:
    """Import ARCHIVE into every real node of the plane in RUN_DIR that is not lost, all at
    once; returns {node: [image names]}. RuntimeError when the plane has no live real node."""
    state = json.loads((Path(run_dir) / "state.json").read_text())
    nodes = [n for n in state.get("real_nodes", []) if not n.get("lost")]
    if not nodes:
        raise RuntimeError(f"no live real node in {run_dir} (kube.py up --real-nodes N)")
    path = Path(archive).absolute()
    with ThreadPoolExecutor(len(nodes)) as pool:
        names = pool.map(lambda n: import_into(n["containerd_socket"], path), nodes)
        return {n["name"]: found for n, found in zip(nodes, names, strict=True)}
