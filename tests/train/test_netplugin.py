"""The NCCL network plugin a worker reports (docs/architecture.md 5: 12.3): read from a real maps
file's format."""

from __future__ import annotations

from pathlib import Path

from trainmaster.train import netplugin

# Lines as /proc/PID/maps writes them: address perms offset dev inode pathname.
MAPS = """\
55d0c0a00000-55d0c0a21000 r--p 00000000 103:01 131 /usr/bin/python3.11
7f1c00000000-7f1c00021000 rw-p 00000000 00:00 0
7f1c10000000-7f1c10100000 r-xp 00000000 103:01 99 /usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5
7f1c20000000-7f1c20080000 r--p 00000000 103:01 77 /opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net-ofi.so
7f1c20080000-7f1c20100000 r-xp 00080000 103:01 77 /opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net-ofi.so
7f1c30000000-7f1c30010000 r-xp 00000000 103:01 78 /opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-ofi-tuner.so
7f1c40000000-7f1c40010000 r-xp 00000000 103:01 80 /opt/amazon/efa/lib/libfabric.so.1
7ffd1a000000-7ffd1a021000 rw-p 00000000 00:00 0                          [stack]
"""


def test_the_loaded_ofi_plugin_is_reported_once_and_the_tuner_is_not(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(MAPS)
    assert netplugin.loaded_plugins(MAPS) == [
        "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net-ofi.so"
    ]
    assert netplugin.describe("cuda", maps=maps, environ={}) == (
        "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net-ofi.so"
    )


def test_no_plugin_loaded_says_so_and_names_a_configured_one(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text("\n".join(line for line in MAPS.splitlines() if "libnccl-net" not in line))
    assert netplugin.describe("cuda", maps=maps, environ={}) == netplugin.BUILT_IN
    said = netplugin.describe("cuda", maps=maps, environ={"NCCL_NET_PLUGIN": "ofi"})
    assert said.startswith(netplugin.BUILT_IN) and "NCCL_NET_PLUGIN=ofi was not loaded" in said
    plain = "7f00-7f01 r-xp 0 0:0 1 /usr/lib/libnccl-net.so\n7f02-7f03 r-xp 0 0:0 2 /x/libnccl-net-aws.so (deleted)\n"
    assert netplugin.loaded_plugins(plain) == ["/usr/lib/libnccl-net.so", "/x/libnccl-net-aws.so"]


def test_not_applicable_off_cuda_and_unknown_when_unreadable(tmp_path: Path) -> None:
    assert netplugin.describe("cpu") == "n/a" and netplugin.describe("xla") == "n/a"
    assert netplugin.describe("cuda", maps=tmp_path / "missing", environ={}).startswith("unknown")


def test_this_process_maps_file_parses() -> None:
    """The real /proc/self/maps: nothing of NCCL in a CPU test process, and no error."""
    assert netplugin.loaded_plugins(netplugin.MAPS.read_text()) == []
