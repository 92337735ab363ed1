"""The one torchrun command line (golden) and what it must contain."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.golden import check
from trainmaster import api
from trainmaster.launch.torchrun import Rendezvous, command, nnodes_arg

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize(
    ("preset", "rdzv"),
    [
        ("local-cpu", Rendezvous("c10d", "127.0.0.1:29400")),
        # as the Volcano pods run it: c10d through pod 0's stable name, the attempt's id
        (
            "trn1-bert-large",
            Rendezvous(
                "c10d",
                "bert-large-trn1-worker-0.bert-large-trn1:29400",
                run_id="bert-large-trn1-7c9e6679-7425-40de-944b-e07fc1f90ae7-v1",
            ),
        ),
        ("p5-bert-large", Rendezvous("c10d", "bert-large-p5-worker-0.bert-large-p5:29400")),
    ],
)
def test_golden_command(preset: str, rdzv: Rendezvous) -> None:
    cfg = api.preset_job(preset)
    cmd = command(cfg, rdzv, job_file=f"/data/runs/{cfg.job.name}/job.toml", storage="/data")
    check(GOLDEN / f"torchrun-{preset}.txt", " \\\n  ".join(cmd) + "\n")


def test_command_carries_the_job() -> None:
    cfg = api.preset_job("trn1-bert-large")
    etcd = Rendezvous("etcd", "etcd-server.trainmaster-etcd.svc:2379")  # the tutorial's option
    cmd = command(cfg, etcd, job_file="/j.toml", storage="/data")
    assert cmd[:3] == ["python3", "-m", "torch.distributed.run"]
    for arg in (
        "--nnodes=2",
        "--nproc-per-node=32",
        "--rdzv-backend=etcd",
        "--max-restarts=3",
        "--rdzv-endpoint=etcd-server.trainmaster-etcd.svc:2379",
        "--rdzv-id=bert-large-trn1",
    ):
        assert arg in cmd
    attempt = Rendezvous(etcd.backend, etcd.endpoint, run_id="bert-large-trn1-uid-v3")
    assert "--rdzv-id=bert-large-trn1-uid-v3" in command(
        cfg, attempt, job_file="/j.toml", storage="/data"
    )
    assert cmd[-6:] == ["-m", "trainmaster.train", "--job", "/j.toml", "--storage", "/data"]


def test_elastic_range() -> None:
    assert nnodes_arg(api.preset_job("local-cpu", ["job.min_nnodes=1"])) == "1:2"
    assert nnodes_arg(api.preset_job("local-cpu")) == "2"


def test_rdzv_conf_is_built_by_name() -> None:
    """An elastic job waits 5 s for late nodes (last_call_timeout); a fixed-size one does not.
    The flag is found by its name, wherever it sits in the argument list."""
    rdzv = Rendezvous("c10d", "127.0.0.1:29400")
    conf = [
        a
        for a in command(
            api.preset_job("local-cpu", ["job.min_nnodes=1", "rendezvous.timeout=90"]),
            rdzv,
            job_file="/j.toml",
            storage="/d",
        )
        if a.startswith("--rdzv-conf=")
    ]
    assert conf == ["--rdzv-conf=join_timeout=90,timeout=90,read_timeout=90,last_call_timeout=5"]
    fixed = command(api.preset_job("local-cpu"), rdzv, job_file="/j.toml", storage="/d")
    assert "--rdzv-conf=join_timeout=600,timeout=600,read_timeout=600" in fixed


def test_c10d_store_reads_wait_as_long_as_the_rendezvous() -> None:
    """30.5: torch's c10d backend gives its TCPStore client read_timeout (default 60 s:
    c10d_rendezvous_backend.py _create_tcp_store); pod 0 may take longer to host the store."""
    rdzv = Rendezvous("c10d", "127.0.0.1:29400")
    cfg = api.preset_job("local-cpu", ["rendezvous.timeout=900"])
    [conf] = [a for a in command(cfg, rdzv, job_file="/j", storage="/d") if "--rdzv-conf" in a]
    assert "read_timeout=900" in conf.split("=", 1)[1].split(",")
