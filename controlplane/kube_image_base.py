"""Local base images for controlplane/kube_image.py, made from Debian's packages.

No container registry is reachable here, so the training image's base, python:3.11-slim-bookworm
(versions.CPU_BASE_IMAGE), is made from what is: Debian's mirror. debootstrap lays down bookworm
(minbase plus python3, python3-venv, ca-certificates) from the mirror apt uses on this machine,
and a venv at /opt/venv, first on PATH, holds pip: `python -m pip install` in the Dockerfile then
installs into an environment of its own, as in the official image (whose python is
/usr/local/bin/python, outside Debian's PEP 668 marker). Python is Debian's 3.11.2, not the
official image's newest 3.11.x.

debootstrap takes minutes, so its result is cached by its inputs (suite, packages, mirror, the
setup script, debootstrap's version): a rootfs tarball under the cache and a buildah image
tagged with the inputs' hash. The etcd add-on's image, versions.ETCD_IMAGE, is replaced by a
stand-in of the same name: this base plus Debian's etcd-server binary (etcd 3.4, which serves
the v2 API torch's etcd rendezvous needs with --enable-v2) at /usr/local/bin/etcd, the path the
add-on's manifest runs, so the manifest runs unchanged.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

CACHE = (
    Path(
        os.environ.get("TRAINMASTER_KUBE_CACHE", Path.home() / ".cache" / "trainmaster-kube")
    ).expanduser()
    / "images"
)
SUITE = "bookworm"  # python:3.11-slim-bookworm's Debian
PACKAGES = ("python3", "python3-venv", "ca-certificates")
# python:3.11 images install pip 24.0 (docker-library PYTHON_PIP_VERSION; recalled, not
# checked here: no registry to look at); Debian's venv would bring its own 23.0.1
PIP_VERSION = "24.0"
PATH = "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Run inside the debootstrapped tree (chroot, /proc mounted, the host's resolv.conf for PyPI).
# The apt lists and caches go: the official image keeps none either.
SETUP = f"""set -eu
python3 -m venv /opt/venv
/opt/venv/bin/python -m pip install --no-cache-dir --disable-pip-version-check pip=={PIP_VERSION}
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb /root/.cache
"""
ETCD_BINARY = Path("/usr/bin/etcd")  # Debian's etcd-server
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")  # this machine's trust, its proxy's CA too


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """One build at a time per cache: `make unit` starts one in the background while the other
    tests run (Makefile), and a test's build waits here for it, then finds its record. The
    kernel drops the lock with the process, so a killed build never holds it."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "build.lock", "w") as held:
        if not _try_lock(held):
            log("another build of this cache is running: waiting for it")
            fcntl.flock(held, fcntl.LOCK_EX)
        yield


def _try_lock(held: IO[str]) -> bool:
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def log(msg: str) -> None:
    """Progress goes to stderr, so stdout holds only the final JSON line of --json."""
    print(f"[kube-image {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(*cmd: str, capture: bool = False, **kw: object) -> str:
    """Run a command, its output shown as progress (stderr) unless captured."""
    out = subprocess.run(
        cmd, check=True, text=True, stdout=subprocess.PIPE if capture else sys.stderr, **kw
    )
    return (out.stdout or "").strip()


def digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def file_digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def image_id(ref: str) -> str | None:
    """The local image's id, or None when buildah's storage has no image of that name."""
    out = subprocess.run(
        ["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", ref],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() if out.returncode == 0 else None


def apt_mirror() -> str:
    """The Debian mirror apt uses here (deb822 .sources or sources.list), not security's."""
    apt = Path("/etc/apt")
    for f in [*sorted(apt.glob("sources.list.d/*.sources")), apt / "sources.list"]:
        text = f.read_text() if f.is_file() else ""
        uris = re.findall(r"^URIs:\s*(\S+)", text, re.M) + re.findall(
            r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+" + SUITE + r"\s", text, re.M
        )
        for uri in uris:
            if "security" not in uri:
                return uri
    return "http://deb.debian.org/debian"


def read_record(path: Path) -> dict | None:
    """A cache record whose image is still in buildah's storage (same id) and whose archive, if
    it names one, is still there; anything else is a miss."""
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if image_id(rec["ref"]) != rec["id"]:
        return None
    if rec.get("archive") and not Path(rec["archive"]).is_file():
        return None
    return rec


def write_record(path: Path, rec: dict) -> dict:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=1) + "\n")
    tmp.replace(path)  # a build killed halfway leaves no record claiming it finished
    return rec


def size(ref: str) -> int:
    """The image's size in bytes: its layers as buildah stores them, uncompressed."""
    manifest = json.loads(run("buildah", "inspect", "--type", "image", ref, capture=True))
    return sum(layer["size"] for layer in json.loads(manifest["Manifest"])["layers"])


def export(rec: dict, name: str) -> dict:
    """Write the image to an archive in the cache, in `docker save` format, which names the ref
    ctr imports it as and keeps layers uncompressed: the archive never leaves the machine, so
    compressing would only cost CPU (buildah 1.28 gzips oci-archive layers even when told
    --disable-compression)."""
    archive = CACHE / f"{name}.docker.tar"
    part = archive.with_suffix(".part")
    part.unlink(missing_ok=True)
    start = time.monotonic()
    log(f"export {rec['ref']} -> {archive}")
    run("buildah", "push", "--quiet", rec["ref"], f"docker-archive:{part}:{rec['ref']}")
    part.replace(archive)
    return rec | {"archive": str(archive), "archive_bytes": archive.stat().st_size,
                  "export_s": round(time.monotonic() - start, 1)}  # fmt: skip


def _rootfs(key: str, mirror: str) -> Path:
    """debootstrap + SETUP, as a tarball (the slow part, minutes), cached by the inputs' hash."""
    tar = CACHE / f"base-{key[:16]}.rootfs.tar"
    if tar.is_file():
        return tar
    work = CACHE / f"base-{key[:16]}.work"
    done = CACHE / f"base-{key[:16]}.debootstrapped"  # a failed SETUP does not redo debootstrap
    if not done.is_file():
        shutil.rmtree(work, ignore_errors=True)
        include = ",".join(PACKAGES)
        log(f"debootstrap {SUITE} (minbase + {include}) from {mirror}")
        t = time.monotonic()
        run("debootstrap", "--variant=minbase", f"--include={include}", SUITE, str(work), mirror)
        done.write_text(f"{time.monotonic() - t:.1f}\n")
    # The chroot sees none of this machine's environment (its PIP_* settings name host paths),
    # but its DNS and TLS trust, only while SETUP runs: HTTPS here passes a proxy whose CA is in
    # the host's bundle, not in Debian's.
    shutil.copy("/etc/resolv.conf", work / "etc/resolv.conf")
    shutil.copy(HOST_CA, work / "tmp/host-ca.crt")
    env = {"PATH": PATH, "HOME": "/root", "LANG": "C.UTF-8", "PIP_CERT": "/tmp/host-ca.crt"}
    run("mount", "-t", "proc", "proc", str(work / "proc"))
    try:
        run("chroot", str(work), "/bin/sh", "-c", SETUP, env=env)
    finally:
        run("umount", str(work / "proc"))
    for name in ("etc/resolv.conf", "etc/hostname", "tmp/host-ca.crt"):  # the runtime's, or ours
        (work / name).unlink(missing_ok=True)
    # /dev, /proc and /sys are the runtime's too: the tarball leaves their contents out
    part = tar.with_suffix(".part")
    run(
        "tar", "--numeric-owner", "--xattrs", "-C", str(work), "--exclude=./dev/*",
        "--exclude=./proc/*", "--exclude=./sys/*", "-cf", str(part), ".",
    )  # fmt: skip
    part.replace(tar)
    shutil.rmtree(work)
    return tar


def base() -> dict:
    """The local base image (buildah), made or found by its inputs' hash."""
    CACHE.mkdir(parents=True, exist_ok=True)
    mirror = apt_mirror()
    version = run("dpkg-query", "-W", "-f=${Version}", "debootstrap", capture=True)
    key = digest(SUITE, PACKAGES, mirror, SETUP, PATH, version)
    record = CACHE / f"base-{key[:16]}.json"
    start = time.monotonic()
    if rec := read_record(record):
        return rec | {"cold": False, "seconds": round(time.monotonic() - start, 1)}
    tar = _rootfs(key, mirror)
    ref = f"localhost/trainmaster-base:{SUITE}-{key[:12]}"
    ctr = run("buildah", "from", "scratch", capture=True)
    try:
        mnt = run("buildah", "mount", ctr, capture=True)
        run("tar", "--numeric-owner", "--xattrs", "-C", mnt, "-xf", str(tar))
        run("buildah", "umount", ctr, capture=True)
        run(
            "buildah", "config", "--os", "linux", "--arch", "amd64", "--env", f"PATH={PATH}",
            "--env", "LANG=C.UTF-8", "--cmd", "python3",
            "--label", f"trainmaster.base=debootstrap {SUITE} + /opt/venv; inputs {key[:16]}", ctr,
        )  # fmt: skip
        run("buildah", "commit", "--quiet", ctr, ref, capture=True)
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True)
    rec = {"ref": ref, "id": image_id(ref), "key": key, "mirror": mirror}
    # debootstrap's own seconds, which _rootfs notes (none: a tarball made before notes)
    with contextlib.suppress(OSError, ValueError):
        rec["debootstrap_s"] = float((CACHE / f"base-{key[:16]}.debootstrapped").read_text())
    write_record(record, rec)
    return rec | {"cold": True, "seconds": round(time.monotonic() - start, 1)}


def etcd(base_rec: dict, ref: str) -> dict:
    """The etcd add-on's image, as a stand-in tagged `ref` (versions.ETCD_IMAGE): the base plus
    Debian's etcd binary at /usr/local/bin/etcd."""
    if not ETCD_BINARY.is_file():  # the Makefile's system-deps installs it; else install it now
        run("apt-get", "install", "-y", "--no-install-recommends", "etcd-server")
    version = run(str(ETCD_BINARY), "--version", capture=True).splitlines()[0]
    key = digest(base_rec["id"], file_digest(ETCD_BINARY), ref)
    record = CACHE / f"etcd-{key[:16]}.json"
    start = time.monotonic()
    if rec := read_record(record):
        return rec | {"seconds": round(time.monotonic() - start, 1), "built": False}
    ctr = run("buildah", "from", "--pull-never", base_rec["ref"], capture=True)
    try:
        run("buildah", "copy", ctr, str(ETCD_BINARY), "/usr/local/bin/etcd")
        note = f"stand-in for {ref}: Debian etcd-server ({version}) on the local base"
        run("buildah", "config", "--cmd", "/usr/local/bin/etcd", "--label",
            f"trainmaster.stand-in={note}", ctr)  # fmt: skip
        run("buildah", "commit", "--quiet", ctr, ref, capture=True)
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True)
    rec = {"ref": ref, "id": image_id(ref), "key": key, "stand_in": note, "size_bytes": size(ref)}
    rec = write_record(record, export(rec, f"etcd-{key[:16]}"))
    return rec | {"seconds": round(time.monotonic() - start, 1), "built": True}
