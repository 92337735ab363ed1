"""README's "A Kubernetes control plane on your machine", as written: after `make kube-up`, its
launch of the trn1 job gives two Running pods with nothing created by hand (the queue and the
claim are laid by kube-up, controlplane/kube_objects.job_objects)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.controlplane import kubejobs as kj
from tests.controlplane.conftest import RealKube

pytestmark = [pytest.mark.kube, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]
SECTION = "## A Kubernetes control plane on your machine"
JOB, NS = "bert-large-trn1", "default"


def readme_commands() -> list[str]:
    """The section's bash block, one command per entry (continuations joined, comments off)."""
    section = (ROOT / "README.md").read_text().split(SECTION, 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    return [c for line in block.splitlines() if (c := " ".join(line.split("#", 1)[0].split()))]


def test_readmes_commands_give_two_running_pods(real_kube: RealKube) -> None:
    if real_kube.run_dir != Path("/tmp/trainmaster-kube"):
        pytest.skip("README's commands name /tmp/trainmaster-kube (TRAINMASTER_KUBE_DIR is set)")
    commands = readme_commands()
    # The session's plane is built and up, and stops at the end of the session: README's first
    # and last commands are the fixture's.
    assert commands[0] == "make kube-build" and commands[-1] == "make kube-down", commands
    assert commands[1] == "make kube-up" and commands[2].startswith("trainmaster launch ")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    try:
        for command in commands[1:-1]:
            done = subprocess.run(
                ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True,
                timeout=300,
            )  # fmt: skip
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        running = kj.bound(real_kube, NS, JOB, 2, "0", timeout=120)
        assert len({p.spec.node_name for p in running}) == 2  # one pod per node
    finally:
        kj.tm(real_kube, NS, "cancel", f"kubernetes://{NS}/{JOB}")
        real_kube.wait_for(lambda: not kj.pods(real_kube, NS, JOB), 120, "the job's pods gone")
