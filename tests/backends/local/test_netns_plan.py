"""The netns mode's names and commands (pure): kernel-sized names, one subnet per run, node 0
hosting the c10d store, every agent told its own address."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_cli
from trainmaster.backends.local import netns
from trainmaster.launch import agent


def test_names_addresses_and_commands(tmp_path: Path) -> None:
    net = netns.plan(tmp_path / "runs" / "a", 3)
    other = netns.plan(tmp_path / "runs" / "b", 3)
    assert net.id != other.id  # two runs never share a bridge
    names = [
        net.bridge,
        *(net.namespace(i) for i in range(3)),
        *(net.host_link(i) for i in range(3)),
    ]
    assert all(len(n) <= 15 for n in names) and len(set(names)) == len(names)  # IFNAMSIZ
    assert [net.address(i) for i in range(3)] == [f"{net.subnet}.{i}" for i in (1, 2, 3)]
    cmd = ["py", "-m", "torch.distributed.run", "--rdzv-conf=timeout=9", "-m", "x"]
    assert net.wrap(0, cmd) == ["ip", "netns", "exec", net.namespace(0), "py", "-m",
                                "torch.distributed.run", f"--local-addr={net.address(0)}",
                                "--rdzv-conf=timeout=9,is_host=true", "-m", "x"]  # fmt: skip
    assert "--rdzv-conf=timeout=9,is_host=false" in net.wrap(2, cmd)


def test_the_local_agent_wrapper_is_told_its_address_too(tmp_path: Path) -> None:
    """The local backend runs torchrun through launch/agent.py: same arguments, same place."""
    net = netns.plan(tmp_path / "runs" / "a", 2)
    cmd = ["py", "-m", agent.MODULE, "--rdzv-conf=timeout=9", "-m", "x"]
    assert net.wrap(1, cmd)[4:] == ["py", "-m", agent.MODULE, f"--local-addr={net.address(1)}",
                                    "--rdzv-conf=timeout=9,is_host=false", "-m", "x"]  # fmt: skip


def test_netns_takes_c10d_only(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    bad = run_cli("launch", "train.py", "--nnodes", "2", "--dry-run", "--set", 'job.network="netns"',
                  "--set", 'rendezvous.backend="etcd"', cwd=tmp_path)  # fmt: skip
    assert bad.returncode == 2 and "\nerror: rendezvous: job.network" in bad.stderr
