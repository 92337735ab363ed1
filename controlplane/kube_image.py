#!/usr/bin/env python3
"""Build the training image that `trainmaster cluster plan` writes, for real, and load it into
containerd: the local nodes' images, on a machine that reaches no container registry.

    .venv/bin/python controlplane/kube_image.py build [--flavour cpu] [--json]
    .venv/bin/python controlplane/kube_image.py load --sockets SOCK [SOCK ...] [--json]
    .venv/bin/python controlplane/kube_image.py load --state RUN_DIR/state.json [--json]

`build` builds image/Dockerfile.cpu exactly as the plan writes it (trainmaster.cluster.image),
with `buildah bud --layers` from the repository root (the Dockerfile's .dockerignore says what
the context sends), on a local base made from Debian's packages (kube_image_base.py) and with
PyPI as torch's index, since download.pytorch.org is not reachable here. PyPI's torch 2.13.0
Linux wheel is the CUDA build: it pulls the CUDA runtime wheels (nvidia-*, cuda-toolkit, triton)
and the image is several GB; without them `import torch` fails (torch/__init__.py preloads
cuBLAS), so the image keeps them. The image is tagged with a hash of its inputs (Dockerfile,
ignore rules, every file the context sends, base image id, build arguments) and exported
uncompressed to a docker-archive; a record per hash makes a second run with unchanged inputs a
report. Also built: the etcd add-on's image as a local stand-in (kube_image_base.etcd).
`load` imports the archives into each containerd socket's k8s.io namespace, where the kubelet's
CRI finds them, building first what is missing. Caches: ${TRAINMASTER_KUBE_CACHE:-
~/.cache/trainmaster-kube}/images, outside the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import kube_image_base as kb  # noqa: E402
from kube_image_base import log, run  # noqa: E402

from trainmaster.cluster import image, versions  # noqa: E402

TORCH_INDEX_URL = "https://pypi.org/simple"  # download.pytorch.org is not reachable here
# Only the CPU flavour builds here: the others' bases and installers (Neuron's DLC and pip
# repository, nvidia/cuda, the EFA installer) are behind registries this machine cannot reach.
BUILDABLE = ("cpu",)


def _pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex (moby/patternmatcher): `**` spans folders, `*` and `?`
    stay within one."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] in "*?":
            out, i = out + ("[^/]*" if pattern[i] == "*" else "[^/]"), i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + "$")


def context_files(root: Path, ignore: str) -> list[str]:
    """The files the build context sends, by the ignore file's rules as Docker applies them: the
    last rule matching the path or one of its parent folders decides, `!` re-includes."""
    rules = []
    for line in ignore.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), _pattern(line.lstrip("!").strip("/"))))
    # literal prefixes of the `!` rules: a folder none of them reaches is not walked (.git, .venv)
    keep = [
        re.split(r"[*?\[]", rx.pattern, maxsplit=1)[0].replace("\\", "") for n, rx in rules if n
    ]

    def excluded(rel: str) -> bool:
        parts = rel.split("/")
        paths = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        out = False
        for negate, rx in rules:
            if any(rx.match(p) for p in paths):
                out = not negate
        return out

    files = []
    for folder, dirs, names in os.walk(root):
        base = Path(folder).relative_to(root).as_posix()
        prefix = "" if base == "." else base + "/"
        dirs[:] = sorted(
            d
            for d in dirs
            if not excluded(prefix + d)
            or any(k.startswith(prefix + d + "/") or (prefix + d + "/").startswith(k) for k in keep)
        )
        files += [prefix + n for n in sorted(names) if not excluded(prefix + n)]
    return sorted(files)


def build(flavour: str = "cpu") -> dict:
    """Build (or find by its inputs) the `flavour` training image and the etcd stand-in, both
    exported; returns the image's record: ref (also as image), id, size_bytes, archive, built,
    times (this run's) and recorded_times (the build's), etcd (ref, archive, stand_in)."""
    if flavour not in BUILDABLE:
        raise ValueError(f"only {BUILDABLE} build on this machine, not {flavour!r}")
    with kb.build_lock():
        return _build(flavour)


def _build(flavour: str) -> dict:
    start = time.monotonic()
    base = kb.base()
    log(f"base {base['ref']} ({'made' if base['cold'] else 'cached'}, {base['seconds']} s)")
    etcd = kb.etcd(base, versions.ETCD_IMAGE)
    files = image.dockerfiles()
    dockerfile, ignore = files[f"Dockerfile.{flavour}"], files[f"Dockerfile.{flavour}.dockerignore"]
    args = {"BASE": base["ref"], "TORCH_INDEX_URL": TORCH_INDEX_URL}
    sent = context_files(ROOT, ignore)
    hashes = {f: kb.file_digest(ROOT / f) for f in sent}
    key = kb.digest(flavour, dockerfile, ignore, hashes, base["id"], args)
    name = f"trainmaster-{flavour}-{key[:16]}"
    record = kb.CACHE / f"{name}.json"
    times = {"base_s": base["seconds"], "base_cold": base["cold"]}
    if base["cold"] and "debootstrap_s" in base:
        times["debootstrap_s"] = base["debootstrap_s"]
    if rec := kb.read_record(record):
        log(f"{rec['ref']}: inputs unchanged, nothing to build")
        times["total_s"] = round(time.monotonic() - start, 1)
        return _result(rec, False, times, etcd)
    # The Dockerfile and its ignore file are written outside the context, as the plan's are
    # (PLAN_DIR/image); buildah is told which ignore file applies.
    ctx = kb.CACHE / "dockerfiles"
    ctx.mkdir(exist_ok=True)
    (ctx / f"Dockerfile.{flavour}").write_text(dockerfile)
    (ctx / f"Dockerfile.{flavour}.dockerignore").write_text(ignore)
    ref = f"localhost/trainmaster:{flavour}-{key[:12]}"
    log(f"build {ref}: {len(sent)} files in the context, torch from {TORCH_INDEX_URL}")
    t = time.monotonic()
    build_args = [a for k, v in args.items() for a in ("--build-arg", f"{k}={v}")]
    # HTTPS from here passes a proxy whose CA only this machine's bundle holds: RUN steps see
    # that bundle and a pip.conf naming it through bind mounts, which no layer keeps (the
    # image trusts what Debian's ca-certificates trusts, as elsewhere). --network host: RUN
    # steps reach PyPI without CNI, of which none is configured here.
    (ctx / "pip.conf").write_text(f"[global]\ncert = {kb.HOST_CA}\n")
    mounts = ["-v", f"{kb.HOST_CA}:{kb.HOST_CA}:ro", "-v", f"{ctx / 'pip.conf'}:/etc/pip.conf:ro"]
    run("buildah", "bud", "--layers", "--network", "host", *mounts, *build_args,
        "-f", str(ctx / f"Dockerfile.{flavour}"),
        "--ignorefile", str(ctx / f"Dockerfile.{flavour}.dockerignore"), "-t", ref, str(ROOT))  # fmt: skip
    times["build_s"] = round(time.monotonic() - t, 1)
    rec = {"ref": ref, "id": kb.image_id(ref), "key": key, "flavour": flavour, "base": base["ref"]}
    rec = kb.export(rec | {"size_bytes": kb.size(ref)}, name)
    times["export_s"] = rec.pop("export_s")
    rec["recorded_times"] = dict(times)  # the times of the build that made it, for later reports
    kb.write_record(record, rec)
    _prune(flavour, record)
    times["total_s"] = round(time.monotonic() - start, 1)
    return _result(rec, True, times, etcd)


def _prune(flavour: str, keep: Path) -> None:
    """Drop the earlier builds of `flavour`: every change to src/ makes a new multi-GB archive.
    The layers the new image shares (base, torch) stay in buildah's storage."""
    for old in kb.CACHE.glob(f"trainmaster-{flavour}-*.json"):
        if old == keep:
            continue
        with contextlib.suppress(OSError, ValueError, KeyError):
            rec = json.loads(old.read_text())
            Path(rec["archive"]).unlink(missing_ok=True)
            subprocess.run(["buildah", "rmi", rec["ref"]], capture_output=True)
        old.unlink(missing_ok=True)


def _result(rec: dict, built: bool, times: dict, etcd: dict) -> dict:
    """The record plus this run's times; "image" repeats "ref" (kube_job.py reads it)."""
    brief = {k: etcd[k] for k in ("ref", "id", "archive", "stand_in") if k in etcd}
    return rec | {"image": rec["ref"], "built": built, "times": times, "etcd": brief}


def load(archive: str | Path, sockets: Sequence[str | Path]) -> list[dict]:
    """Import an image archive into the k8s.io namespace of each containerd socket (where the
    kubelet's CRI looks; the archive's ref is the name pods use). Returns, per socket, the refs
    imported and the seconds taken."""
    out = []
    for sock in sockets:
        start = time.monotonic()
        text = run("ctr", "-a", str(sock), "-n", "k8s.io", "images", "import", "--platform",
                   "linux/amd64", str(archive), capture=True)  # fmt: skip
        refs = re.findall(r"^unpacking (\S+) \(", text, re.M)
        out.append(
            {"socket": str(sock), "refs": refs, "seconds": round(time.monotonic() - start, 1)}
        )
        log(f"{sock}: imported {', '.join(refs) or archive} in {out[-1]['seconds']} s")
    return out


def state_sockets(state: str | Path) -> list[str]:
    """The containerd sockets of the real nodes a plane's state.json lists (kube_real.py), the
    nodes marked lost left out."""
    nodes = json.loads(Path(state).read_text()).get("real_nodes", [])
    return [n["containerd_socket"] for n in nodes if not n.get("lost")]


def images(sock: str | Path) -> list[str]:
    """The image refs a containerd socket holds in k8s.io."""
    text = run("ctr", "-a", str(sock), "-n", "k8s.io", "images", "ls", "-q", capture=True)
    return text.split()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or find) the training image and the etcd stand-in")
    b.add_argument("--flavour", default="cpu", choices=BUILDABLE)
    b.add_argument("--json", action="store_true", help="print the result as one JSON line")
    ld = sub.add_parser("load", help="import both images into containerd sockets (builds first)")
    ld.add_argument("--flavour", default="cpu", choices=BUILDABLE)
    where = ld.add_mutually_exclusive_group(required=True)
    where.add_argument("--sockets", nargs="+", help="containerd socket paths")
    where.add_argument("--state", help="a plane's state.json: its real nodes' sockets")
    ld.add_argument("--json", action="store_true")
    opts = parser.parse_args(argv)
    try:
        result = build(opts.flavour)
        if opts.cmd == "load":
            sockets = opts.sockets or state_sockets(opts.state)
            archives = (result["archive"], result["etcd"]["archive"])
            result["load"] = [load(a, sockets) for a in archives]
    except subprocess.CalledProcessError as e:
        print(f"error: {' '.join(map(str, e.cmd))} exited {e.returncode}", file=sys.stderr)
        return 1
    if opts.json:
        print(json.dumps(result))
    else:
        gb = result["size_bytes"] / 1e9
        print(f"{result['ref']}  {gb:.2f} GB  {result['archive']}  times {result['times']}")
        print(f"{result['etcd']['ref']}  {result['etcd'].get('stand_in', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
