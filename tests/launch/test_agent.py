"""launch/agent.py: torchrun with its imports done without the collector, and otherwise torchrun.

Each behaviour is compared with plain `python -m torch.distributed.run` on the same arguments
(help, a usage error, SIGTERM while a worker runs); then a real 2-node local job, whose workers
write down their agent's command line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli, wait_for
from trainmaster import api
from trainmaster.backends.local import agents
from trainmaster.launch import agent
from trainmaster.launch.torchrun import AGENT_MODULES, TORCHRUN_MODULE, Rendezvous, command
from trainmaster.run import state
from trainmaster.storage import RunPaths, Storage

pytestmark = pytest.mark.slow  # every test but the first starts interpreters that import torch


def test_local_backend_runs_the_wrapper_with_torchruns_arguments(tmp_path: Path) -> None:
    """One builder: the local agents differ from the pods' torchrun only in the module."""
    assert AGENT_MODULES == (TORCHRUN_MODULE, agent.MODULE) == (agent.TORCHRUN, agent.MODULE)
    cfg = api.preset_job("local-cpu")
    rdzv = Rendezvous("c10d", "127.0.0.1:29400", run_id="r")
    run = RunPaths(tmp_path / "runs" / "j")
    cmds = agents.agent_commands(cfg, rdzv, run, tmp_path, workdir="/w")
    plain = command(cfg, rdzv, job_file=str(run.job_toml.resolve()),
                    storage=str(tmp_path.resolve()), python=sys.executable, workdir="/w")  # fmt: skip
    assert len(cmds) == cfg.job.nnodes
    for cmd in cmds:
        assert cmd[:3] == [sys.executable, "-m", agent.MODULE]
        assert cmd[3:] == plain[3:] and plain[2] == TORCHRUN_MODULE


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "100"})  # fmt: skip


@pytest.mark.parametrize(
    "args", [["--help"], ["--nnodes=2", "--no-such-option", "train.py"]], ids=["help", "usage"]
)
def test_arguments_output_and_exit_code_are_torchruns(args: list[str]) -> None:
    """sys.argv[0] as under `python -m` (the usage line names run.py), the same parser."""
    plain, ours = _run(TORCHRUN_MODULE, *args), _run(agent.MODULE, *args)
    assert (ours.returncode, ours.stdout, ours.stderr) == (
        plain.returncode,
        plain.stdout,
        plain.stderr,
    )
    assert plain.returncode == (0 if args == ["--help"] else 2)
    assert "run.py" in (plain.stdout + plain.stderr).split("\n", 1)[0]


def test_torchrun_leaves_with_the_collector_on_and_its_imports_frozen() -> None:
    """What the wrapper leaves around torchrun's main: collections on again, torch's objects
    frozen, and torch.distributed.run not under its own name (plain torchrun has it only as
    __main__)."""
    probe = (
        "import gc, json, sys\n"
        "from trainmaster.launch import agent\n"
        "sys.argv = ['agent', '--help']\n"
        "code = 0  # torchrun's main returns from --help (its @record catches the exit 0)\n"
        "try:\n"
        "    agent.main()\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        "print(json.dumps({'code': code, 'on': gc.isenabled(), 'frozen': gc.get_freeze_count(),\n"
        "                  'named': 'torch.distributed.run' in sys.modules}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.startswith("usage: run.py ")  # torchrun's help, argv[0] as under -m
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["code"] == 0 and seen["on"] is True and seen["named"] is False
    assert seen["frozen"] > 100_000  # torch's modules, functions, classes


WORKER = """import os, signal, sys
tmp = sys.argv[1] + ".tmp"
with open(tmp, "w") as f:
    f.write(str(os.getpid()))
os.replace(tmp, sys.argv[1])
signal.pause()  # until torchrun stops it
"""


def _gone(pid: int) -> bool:
    return not state.pid_alive(pid)


def test_sigterm_stops_the_workers_as_torchrun_does(tmp_path: Path) -> None:
    """The supervisor's cancel and stop paths SIGTERM the agents; torchrun's handler must be the
    one that runs: it stops the workers (in sessions of their own) and exits as torchrun does."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    codes = {}
    for module in AGENT_MODULES:
        pidfile = tmp_path / f"{module}.pid"
        proc = subprocess.Popen(
            [sys.executable, "-m", module, "--standalone", "--nproc-per-node=1",
             "--max-restarts=0", "--monitor-interval=1", str(script), str(pidfile)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        try:
            wait_for(pidfile.exists, 120, f"{module}'s worker")
            worker = int(pidfile.read_text())
            proc.send_signal(signal.SIGTERM)
            output, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        wait_for(lambda w=worker: _gone(w), 60, f"{module}'s worker to exit")
        assert "SIGTERM" in output, output
        codes[module] = proc.returncode
    assert codes[agent.MODULE] == codes[TORCHRUN_MODULE] != 0


def test_a_failed_worker_ends_the_agent_as_torchrun() -> None:
    """The exit code and the error the supervisor reads in the node log (lost_reason)."""
    args = ["--standalone", "--nproc-per-node=1", "--max-restarts=0", "--monitor-interval=1",
            "--no-python", sys.executable, "-c", "raise SystemExit(3)"]  # fmt: skip
    plain, ours = _run(TORCHRUN_MODULE, *args), _run(agent.MODULE, *args)
    assert ours.returncode == plain.returncode == 1
    assert "ChildFailedError" in plain.stderr and "ChildFailedError" in ours.stderr
    assert "exitcode  : 3" in ours.stderr


PROBE = """import os
rank = os.environ["RANK"]
with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
    line = f.read().replace(b"\\0", b" ").decode()
path = os.path.join(os.environ["TRAINMASTER_RUN_DIR"], f"agent_of_rank{rank}.txt")
with open(path, "w") as f:
    f.write(line)
"""


@pytest.mark.timeout(600)
def test_a_local_two_node_job_runs_through_the_wrapper(tmp_path: Path) -> None:
    """`trainmaster launch` of a script on 2 nodes: each worker's parent, its agent, is the
    wrapper with torchrun's arguments, and the job succeeds as under plain torchrun."""
    (tmp_path / "probe.py").write_text(PROBE)
    store = tmp_path / "store"
    result = run_cli("--storage", str(store), "launch", "probe.py", "--nnodes", "2",
                     "--name", "viaagent", "--follow", cwd=tmp_path, timeout=540)  # fmt: skip
    run = RunPaths(Storage(store).run_dir("viaagent"))
    logs = "".join(p.read_text(errors="replace") for p in sorted(run.logs.glob("*.log")))
    assert result.returncode == 0, result.stderr + logs
    st = state.read(run.state)
    assert st.phase == "succeeded" and [n.exit_code for n in st.nodes] == [0, 0]
    for rank in (0, 1):
        line = (run.dir / f"agent_of_rank{rank}.txt").read_text()
        assert line.startswith(f"{sys.executable} -m {agent.MODULE} --nnodes=2 "), line
        assert "--rdzv-backend=c10d" in line and " -m trainmaster.launch.entry " in line
