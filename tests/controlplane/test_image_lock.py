"""One image build at a time per cache (kube_image_base.build_lock): `make unit` starts a build in
the background and the real-node tests' own build must wait for it rather than race it in the
same buildah store. Plain processes and a temporary cache: no root, buildah or image needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.controlplane.conftest import CONTROLPLANE

HOLD = """
import sys
sys.path.insert(0, {cp!r})
import kube_image_base as kb
with kb.build_lock():
    print("held", flush=True)
    sys.stdin.readline()  # the test says when to let go
"""
WAIT = """
import sys
sys.path.insert(0, {cp!r})
import kube_image_base as kb
with kb.build_lock():
    print("got it", flush=True)
"""


def _start(code: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code.format(cp=str(CONTROLPLANE))],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_a_second_build_waits_for_the_first_and_then_goes_on(tmp_path: Path) -> None:
    env = {**os.environ, "TRAINMASTER_KUBE_CACHE": str(tmp_path)}
    holder = _start(HOLD, env)
    waiter = None
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        waiter = _start(WAIT, env)
        assert waiter.stderr is not None
        said = waiter.stderr.readline()  # printed before it blocks on the lock
        assert "another build of this cache is running: waiting for it" in said
        assert waiter.poll() is None  # still waiting while the first holds the lock
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        out, _ = waiter.communicate(timeout=60)
        assert waiter.returncode == 0 and out == "got it\n"
        assert (tmp_path / "images" / "build.lock").exists()
    finally:
        for p in (holder, waiter):
            if p is not None and p.poll() is None:
                p.kill()
            if p is not None:
                p.wait()
