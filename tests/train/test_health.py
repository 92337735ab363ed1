"""Node preflight checks (docs/architecture.md 5: 14.2): the node-level ones against a fake /dev
and /sys tree, and the device ones for real on this CPU, in a world of one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainmaster.catalog import CATALOG
from trainmaster.errors import UserError
from trainmaster.train import health
from trainmaster.train.device import Runtime
from trainmaster.train.preflight import Env


def _by_name(checks: list[health.Check]) -> dict[str, health.Check]:
    return {c.name: c for c in checks}


def _fake_node(tmp_path: Path, neuron: int, efa: int, other_ib: int = 0) -> tuple[Path, Path]:
    dev, ib = tmp_path / "dev", tmp_path / "sys-ib"
    (dev / "shm").mkdir(parents=True)
    for i in range(neuron):
        (dev / f"neuron{i}").touch()
    drivers = tmp_path / "drivers"
    for name in ("efa", "mlx5_core"):
        (drivers / name).mkdir(parents=True)
    for i, driver in enumerate(["efa"] * efa + ["mlx5_core"] * other_ib):
        (ib / f"rdmap{i}s0" / "device").mkdir(parents=True)
        os.symlink(drivers / driver, ib / f"rdmap{i}s0" / "device" / "driver")
    return dev, ib


def test_a_trn1_node_needs_its_neuron_and_efa_devices(tmp_path: Path) -> None:
    trn1 = CATALOG["trn1.32xlarge"]  # 16 devices x 2 cores, 8 EFA interfaces
    dev, ib = _fake_node(tmp_path, neuron=16, efa=8)
    ok = _by_name(
        health.node_checks(
            kind="xla",
            inst=trn1,
            local_workers=32,
            checkpoints=tmp_path,
            checkpoint_mb=1,
            keep=2,
            dev=dev,
            sys_ib=ib,
            on_aws=True,
        )
    )
    assert ok["neuron"].ok and ok["efa"].ok and ok["disk"].ok and "shm" in ok
    dev, ib = _fake_node(tmp_path / "bad", neuron=15, efa=7, other_ib=2)  # non-EFA RDMA not counted
    bad = _by_name(
        health.node_checks(
            kind="xla",
            inst=trn1,
            local_workers=32,
            checkpoints=tmp_path,
            checkpoint_mb=1,
            keep=2,
            dev=dev,
            sys_ib=ib,
            on_aws=True,
        )
    )
    assert (
        not bad["neuron"].ok
        and "15 Neuron device(s)" in bad["neuron"].detail
        and "need 16" in bad["neuron"].detail
    )
    assert (
        not bad["efa"].ok
        and bad["efa"].detail.startswith("7 EFA device(s)")
        and "need 8" in bad["efa"].detail
    )


def test_a_cpu_host_is_not_asked_for_accelerators_and_disk_is_sized_by_checkpoints(
    tmp_path: Path,
) -> None:
    dev, ib = _fake_node(tmp_path, neuron=0, efa=0)
    checks = _by_name(
        health.node_checks(
            kind="cpu",
            inst=CATALOG["cpu"],
            local_workers=2,
            checkpoints=tmp_path,
            checkpoint_mb=10,
            keep=2,
            dev=dev,
            sys_ib=ib,
            on_aws=True,
        )
    )
    assert set(checks) == {"disk", "shm"}
    huge = _by_name(
        health.node_checks(
            kind="cpu",
            inst=CATALOG["cpu"],
            local_workers=2,
            checkpoints=tmp_path,
            checkpoint_mb=1e12,
            keep=2,
            dev=dev,
            sys_ib=ib,
        )
    )
    assert not huge["disk"].ok and "3 checkpoints of" in huge["disk"].detail


def test_device_checks_run_for_real_on_this_cpu(tmp_path: Path) -> None:
    rt = Runtime(Env(), "cpu", bf16=False)
    every = health.run(
        rt,
        inst=CATALOG["cpu"],
        node=0,
        local_rank=0,
        local_workers=1,
        checkpoints=tmp_path,
        params=1000,
        keep=2,
        on_aws=False,
    )
    [node] = health.per_node(every)
    names = [c["name"] for c in node["checks"]]
    assert names[:3] == ["device", "matmul", "all_reduce"] and "disk" in names
    assert all(c["ok"] for c in node["checks"])
    assert "TFLOP/s" in node["checks"][1]["detail"] and "exact" in node["checks"][2]["detail"]


def test_a_device_computing_wrong_numbers_fails_naming_node_and_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(health, "matmul_hooks", [lambda rank, out: out * 1.01])
    rt = Runtime(Env(), "cpu", bf16=False)
    with pytest.raises(UserError) as err:
        health.run(
            rt,
            inst=CATALOG["cpu"],
            node=0,
            local_rank=0,
            local_workers=1,
            checkpoints=tmp_path,
            params=1000,
            keep=2,
            on_aws=False,
        )
    assert str(err.value).startswith("node 0: preflight check matmul failed on ")
    assert "relative error 1.0e-02" in str(err.value)


@pytest.mark.parametrize("variable", ["NEURON_EXTRACT_GRAPHS_ONLY", "TRAINMASTER_PRECOMPILE"])
def test_no_value_checks_while_graphs_are_only_extracted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    """30.2: under neuron_parallel_compile the trial run's outputs are invalid (aws-neuron-sdk
    pytorch-neuron-parallel-compile.rst): the ops still run (their graphs get compiled), but
    their values are not checked, so precompile does not stop every rank before step 1."""
    monkeypatch.setenv(variable, "1")
    monkeypatch.setattr(health, "matmul_hooks", [lambda rank, out: out * 1.01])
    rt = Runtime(Env(), "cpu", bf16=False)
    every = health.run(
        rt,
        inst=CATALOG["cpu"],
        node=0,
        local_rank=0,
        local_workers=1,
        checkpoints=tmp_path,
        params=1000,
        keep=2,
        on_aws=False,
    )
    checks = {c["name"]: c for c in health.per_node(every)[0]["checks"]}
    assert checks["matmul"]["ok"] and "not checked" in checks["matmul"]["detail"]
    assert checks["all_reduce"]["ok"] and "not checked" in checks["all_reduce"]["detail"]
    assert checks["disk"]["ok"]  # the node's own checks still run


def test_the_precompile_environment_marks_the_run() -> None:
    from pathlib import PurePosixPath

    from trainmaster.compile import cache

    for kind in ("inductor", "neuron", "xla"):
        env = cache.precompile_env(kind, PurePosixPath("/c"))  # type: ignore[arg-type]
        assert (
            env[cache.PRECOMPILE_MARK] == "1" and cache.PRECOMPILE_MARK == "TRAINMASTER_PRECOMPILE"
        )
        assert cache.PRECOMPILE_MARK not in cache.env(kind, PurePosixPath("/c"))  # type: ignore[arg-type]


@pytest.mark.parametrize(("workers", "need"), [(1, 32), (2, 256), (8, 256)])
def test_a_gpu_node_needs_room_in_dev_shm_only_for_its_ranks_to_share(
    tmp_path: Path, workers: int, need: int
) -> None:
    dev, ib = _fake_node(tmp_path, neuron=0, efa=0)
    shm = _by_name(
        health.node_checks(
            kind="cuda",
            inst=CATALOG["p5.48xlarge"],
            local_workers=workers,
            checkpoints=tmp_path,
            checkpoint_mb=1,
            keep=1,
            dev=dev,
            sys_ib=ib,
        )
    )["shm"]
    assert shm.detail.endswith(f"need {need} MiB")
