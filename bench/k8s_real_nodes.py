"""The cluster job for real: our image built, real nodes up, the job training in containers, a
node lost mid-job. Each figure from one run on this machine, side by side.

    python bench/k8s_real_nodes.py [--steps 60] [--every 10] [--warm] [--out FILE]

Root, and `make kube-build` and `make system-deps` first (containerd, runc, CNI plugins,
buildah, debootstrap). In order:
  image        controlplane/kube_image.py build, twice, in an empty image cache of its own
               (/var/tmp/tm-image-cold-*, removed at the end): the first is cold, as on a fresh
               machine (the debootstrap base, torch's wheels from PyPI, the build, the export),
               the second finds it all by its inputs (warm). --warm: the usual cache instead
  kube-up      `kube.py up --nodes 0 --real-nodes 3 --image-archive ...`, twice: the first may
               make the nodes' image store (kube_seed.py, once per image), the second finds it
  job          the plan's add-ons and the data (kube_job.setup), then bert-tiny on 2 nodes in
               containers (kube_job_loss.run): launch -> first step, and after a complete
               checkpoint one training node killed: loss -> first new step, per phase
The plane runs in TRAINMASTER_KUBE_DIR (default /tmp/trainmaster-kube-bench) and is taken
down at the end. Prints one JSON object; no assertions (docs/architecture.md 4).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import emit, machine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "controlplane"))
import kube_job  # type: ignore[import-not-found]  # noqa: E402
import kube_job_loss  # type: ignore[import-not-found]  # noqa: E402

RUN_DIR = Path(os.environ.get("TRAINMASTER_KUBE_DIR", "/tmp/trainmaster-kube-bench"))


def say(text: str) -> None:
    print(f"[k8s_real_nodes] {text}", file=sys.stderr, flush=True)


def kube(*args: str) -> tuple[float, str]:
    """`kube.py ARGS` on the bench's plane: seconds and stdout."""
    env = {**os.environ, "TRAINMASTER_KUBE_DIR": str(RUN_DIR)}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(ROOT / "controlplane" / "kube.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise SystemExit(f"kube.py {args[0]} failed:\n{done.stdout}\n{done.stderr}")
    return round(time.monotonic() - start, 1), done.stdout


def build(cache: Path | None) -> dict[str, Any]:
    """`kube_image.py build --json` in its own process, with CACHE as its image cache if given."""
    env = dict(os.environ)
    if cache is not None:
        env["TRAINMASTER_KUBE_CACHE"] = str(cache)
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(ROOT / "controlplane" / "kube_image.py"), "build", "--json"],
        env=env, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"kube_image.py build failed:\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.splitlines()[-1]), wall_s=round(time.monotonic() - start, 1))


def image(cold: Path | None) -> dict[str, Any]:
    """Built twice: the first cold when COLD names an empty cache (nothing of an earlier build
    found: debootstrap, torch's wheels from PyPI, the export, all timed), the second warm."""
    first = build(cold)
    again = build(cold)
    return {
        "ref": first["ref"],
        "size_gb": round(first["size_bytes"] / 1e9, 2),
        "cold": cold is not None,
        "first_s": first["wall_s"],
        "first_times": first["times"] | {"built": first["built"]},
        "warm_s": again["wall_s"],
        "archives": [first["archive"], first["etcd"]["archive"]],
        "image": first["image"],
    }


def kube_up(archives: list[str]) -> dict[str, Any]:
    given = [a for path in archives for a in ("--image-archive", path)]
    up = ["up", "--nodes", "0", "--real-nodes", "3", "--port", "0", *given]
    kube("down")
    first_s, first_out = kube(*up)
    kube("down")
    again_s, again_out = kube(*up)
    made = "the image store made" in first_out
    return {"first_s": first_s, "store_made_in_first": made, "again_s": again_s,
            "again_ready_at": again_out.splitlines()[1].strip()}  # fmt: skip


def job(img: str, steps: int, every: int) -> dict[str, Any]:
    kubeconfig = RUN_DIR / "kubeconfig"
    pool = kube_job.live_nodes(RUN_DIR)
    setup = kube_job.setup(kubeconfig, RUN_DIR, img, pool)
    sets = kube_job.job_sets(img, "bench-real", steps, every)
    out = kube_job_loss.run(kubeconfig, RUN_DIR, sets, pool[-1])
    final = out["final"]
    return {
        "setup_s": round(setup["setup_s"], 1),
        "launch_to_first_step_s": out["launch_to_first_step_s"],
        "victim": out["victim"],
        "loss_phases_s": out["phases"],
        "noticed_by": out["noticed_by"],  # the survivors' peer watch, or the node controller
        "final": {k: final[k] for k in ("phase", "step", "restarts", "job_retries", "goodput")},
        "resumed_from": [e["step"] for e in out["timeline"] if e["event"] == "start"][-1],
        "never_on_lost_node": all(p["node"] != out["victim"] for p in out["pods_after"]),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    p.add_argument("--out", type=Path)
    p.add_argument("--warm", action="store_true", help="build in the usual cache (no cold build)")
    args = p.parse_args()
    cold = None if args.warm else Path(tempfile.mkdtemp(prefix="tm-image-cold-", dir="/var/tmp"))
    say(f"image: built {'cold in ' + str(cold) if cold else 'in the usual cache'}, then again")
    img = image(cold)
    say(f"kube-up with 3 real nodes, twice ({img['ref']}, {img['size_gb']} GB)")
    up = kube_up(img.pop("archives"))
    try:
        say("the job in containers, a node lost after its first checkpoint")
        ran = job(img.pop("image"), args.steps, args.every)
    finally:
        kube("down")
        if cold is not None:  # the cold build's archives (GBs); its nodes' store stays cached
            shutil.rmtree(cold, ignore_errors=True)
    emit({"bench": "k8s_real_nodes", "machine": machine(), "image": img, "kube_up": up,
          "job": ran}, args.out)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
