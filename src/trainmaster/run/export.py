"""`trainmaster export checkpoint JOB DEST`: a run's newest checkpoint, copied out and verified.

Checkpoints live in the run folder on the job's storage, which on a cluster is the FSx file
system that `cluster down` deletes. This copies one complete checkpoint (a step_N folder:
readers never see a half-written one, docs/architecture.md 3.6) to a folder or to S3, then
checks every file against a manifest of sizes and SHA-256 sums taken from the source:

    DEST/JOB/step_N/...              the checkpoint's files
    DEST/JOB/step_N/MANIFEST.json    {"job", "step", "files": {relpath: [size, sha256]}}

A folder copy is made under a temporary name and renamed when verified; an S3 upload writes
the manifest last, so a manifest says the upload is whole. Standard library only here (the
S3 side is cluster/aws.py, the one module that imports boto3).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from trainmaster.errors import UserError
from trainmaster.storage import RunPaths

MANIFEST = "MANIFEST.json"
_STEP = re.compile(r"^step_(\d+)$")


def checkpoints(run: RunPaths) -> dict[int, Path]:
    """The complete checkpoints of a run by step (step_N folders; .tmp-* are being written)."""
    if not run.checkpoints.is_dir():
        return {}
    found = {}
    for p in run.checkpoints.iterdir():
        m = _STEP.match(p.name)
        if m and p.is_dir():
            found[int(m.group(1))] = p
    return found


def choose(run: RunPaths, step: int | None) -> Path:
    have = checkpoints(run)
    if not have:
        raise UserError(f"no complete checkpoint in {run.checkpoints}", where="JOB")
    if step is None:
        return have[max(have)]
    if step not in have:
        steps = ", ".join(map(str, sorted(have)))
        raise UserError(f"no checkpoint of step {step} (have: {steps})", where="--step")
    return have[step]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest(job: str, ckpt: Path) -> dict[str, Any]:
    files = sorted(p for p in ckpt.rglob("*") if p.is_file())
    return {
        "job": job,
        "step": int(ckpt.name.removeprefix("step_")),
        "files": {str(p.relative_to(ckpt)): [p.stat().st_size, _sha256(p)] for p in files},
    }


def verify(folder: Path, want: dict[str, Any]) -> list[str]:
    """Files of `want` that are missing or differ in `folder` (empty: a true copy)."""
    bad = []
    for rel, (size, digest) in want["files"].items():
        p = folder / rel
        if not p.is_file() or p.stat().st_size != size or _sha256(p) != digest:
            bad.append(rel)
    return bad


def to_folder(job: str, ckpt: Path, dest: Path) -> Path:
    """Copy into dest/JOB/step_N (refused if it exists), verified before it gets its name."""
    final = dest / job / ckpt.name
    if final.exists():
        raise UserError(f"{final} exists; choose another DEST or remove it", where="DEST")
    want = manifest(job, ckpt)
    tmp = final.with_name(f".tmp-{ckpt.name}-{os.getpid()}")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(ckpt, tmp)
        bad = verify(tmp, want)
        if bad:
            raise UserError(
                f"the copy differs from the checkpoint in {', '.join(bad)}", where="DEST"
            )
        (tmp / MANIFEST).write_text(json.dumps(want, indent=1), encoding="utf-8")
        os.rename(tmp, final)
    except OSError as exc:
        raise UserError(f"cannot write the copy ({exc.strerror})", where=str(dest)) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
