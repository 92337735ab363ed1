"""The parts of taking a lost node back that need no job: whether the c10d store went with a
lost node (a real listening socket), and what `status` says while a node rejoins and after."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from tests.backends.local.test_status import fake_run
from tests.conftest import run_cli
from trainmaster.backends.local import rejoin
from trainmaster.config import JobConfig
from trainmaster.launch.torchrun import Rendezvous
from trainmaster.run import pids, state


def test_the_store_is_lost_once_nothing_listens_on_its_port() -> None:
    cfg = JobConfig.model_validate({"job": {"name": "j", "nnodes": 2, "min_nnodes": 1}})
    with socket.socket() as store:
        store.bind(("127.0.0.1", 0))
        store.listen()
        port = store.getsockname()[1]
        rdzv = Rendezvous("c10d", f"127.0.0.1:{port}")
        assert rejoin.listening(port) and not rejoin.store_lost(cfg, rdzv, 1)
    assert not rejoin.listening(port) and rejoin.store_lost(cfg, rdzv, 1)
    assert not rejoin.store_lost(cfg, Rendezvous("etcd", f"127.0.0.1:{port}"), 0)  # etcd's


def _two_nodes(root: Path, job: str, notes: tuple[str, str]) -> None:
    """A running 2-node run whose node agents are this process (alive)."""
    run = fake_run(root, job, summary=None)
    me = state.NodeState(index=0, pid=os.getpid(), start_time=pids.start_time(os.getpid()))
    nodes = [me.model_copy(update={"index": i, "note": notes[i]}) for i in (0, 1)]
    state.update(run.state, nnodes=2, nodes=nodes, message=f"node 1 {notes[1]}")


def test_status_says_the_node_rejoins_then_is_back(tmp_path: Path) -> None:
    _two_nodes(tmp_path, "rejoining", ("", "lost at step 13 (SIGKILL), rejoining"))
    _two_nodes(tmp_path, "back", ("", "lost at step 13 (SIGKILL), back at step 15"))
    rejoining = run_cli("status", "rejoining", "--storage", str(tmp_path)).stdout
    back = run_cli("status", "back", "--storage", str(tmp_path)).stdout
    assert "node 1 lost at step 13 (SIGKILL), rejoining" in rejoining
    assert "runs on 1 of 2 nodes (node 1 rejoining)" in rejoining
    assert "node 1 lost at step 13 (SIGKILL), back at step 15" in back
    assert "runs on 2 of 2 nodes" in back and "(node" not in back.split("runs on")[1]
