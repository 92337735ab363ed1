"""A local job on a GPU: MFU from the catalog by the GPU's name, and the GPU named in the cost line.

The names are those the driver reports (torch.cuda.get_device_name); no GPU is needed to check
what is done with them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT
from trainmaster import catalog
from trainmaster.monitor import cost, history
from trainmaster.run import state
from trainmaster.storage import RunPaths
from trainmaster.train import metrics


@pytest.mark.parametrize(
    ("name", "instance"),
    [
        ("NVIDIA H200", "p5e.48xlarge"),
        ("NVIDIA H100 80GB HBM3", "p5.48xlarge"),
        ("NVIDIA A100-SXM4-80GB", "p4d.24xlarge"),
    ],
)
def test_a_known_gpu_gets_its_instance_types_peak(
    name: str, instance: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(metrics.PEAK_ENV, raising=False)  # it would win
    peak, source = catalog.peak_for_device(name) or (0.0, "")
    assert source == instance and peak == catalog.get(instance).peak_tflops_per_worker > 0
    assert metrics.peak_tflops_per_worker(0.0, name) == peak  # a local job: its instance has none


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA GeForce RTX 4090",
        "NVIDIA H100 PCIe",  # 756 TFLOP/s, not the SXM part's 989
        "NVIDIA H100 NVL",
        "NVIDIA H200 NVL",
        "NVIDIA A100 80GB PCIe",
        "NVIDIA GH200 480GB",  # not an H200
    ],
)
def test_a_card_the_catalog_does_not_carry_has_no_peak_and_no_price(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(metrics.PEAK_ENV, raising=False)
    assert catalog.instance_for_device(name) is None and catalog.peak_for_device(name) is None
    assert metrics.peak_tflops_per_worker(0.0, name) == 0.0  # MFU n/a, until you give the peak


def test_the_environments_peak_wins_over_every_catalog_figure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(metrics.PEAK_ENV, raising=False)
    assert metrics.peak_tflops_per_worker(95.0, "NVIDIA H200") == 95.0  # the node type's first
    monkeypatch.setenv(metrics.PEAK_ENV, "756")
    assert metrics.peak_tflops_per_worker(0.0, "NVIDIA H100 PCIe") == 756.0
    assert metrics.peak_tflops_per_worker(0.0, "NVIDIA H200") == 756.0
    assert metrics.peak_tflops_per_worker(95.0, "NVIDIA H200") == 756.0
    monkeypatch.setenv(metrics.PEAK_ENV, "not a number")
    assert metrics.peak_tflops_per_worker(95.0, "NVIDIA H200") == 95.0


def test_the_cost_line_names_the_gpu_rank_0_ran_on(tmp_path: Path) -> None:
    run = RunPaths(tmp_path / "runs" / "gpu")
    run.dir.mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "local-cpu.toml", run.job_toml)
    rows = [{"step": s, "loss": 5.0, "elapsed_s": float(s)} for s in (1, 2, 3)]
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run.rank0.write_text(json.dumps({"node_rank": 0, "device": "NVIDIA H200"}))
    st = state.RunState(job="gpu", phase="running", nnodes=1)
    line = cost.render(cost.progress_of_run(run, st, 10) or pytest.fail("no progress"))
    # priced as the same GPU on AWS: one of a p5e.48xlarge's eight, not the CPU host's rate
    share = catalog.get("p5e.48xlarge").price_per_hour / 8
    assert f"1 x 1/8 of p5e.48xlarge with NVIDIA H200 at ${share:.2f}/node-hour" in line
    run.rank0.write_text(json.dumps({"node_rank": 0, "device": ""}))  # a CPU run says nothing
    price = history.price_of(history.read_config(run), 1, history.device_of(run))
    assert price is not None and price.basis() == "1 x cpu at $1.61/node-hour (catalog)"


def test_a_local_gpu_job_is_priced_by_its_gpus_share_unless_the_cluster_says(
    tmp_path: Path,
) -> None:
    from trainmaster.config import jobfile

    two = jobfile.preset("local-cpu", ["job.nproc_per_node=2", "train.global_batch_size=64"])
    price = history.price_of(two, 1, "NVIDIA H100 80GB HBM3")
    p5 = catalog.get("p5.48xlarge")
    assert price is not None and price.per_hour == pytest.approx(p5.price_per_hour * 2 / 8)
    assert price.basis().startswith("1 x 2/8 of p5.48xlarge with NVIDIA H100 80GB HBM3 at $")
    unknown = history.price_of(two, 1, "NVIDIA GeForce RTX 4090")  # not in the catalog
    assert unknown is not None and unknown.per_node_hour == catalog.get("cpu").price_per_hour
    own = jobfile.preset("local-cpu", ["cluster.price_per_hour=3.5"])
    mine = history.price_of(own, 1, "NVIDIA H200")  # the user's own figure wins
    assert (
        mine is not None and mine.per_node_hour == 3.5 and mine.source == "cluster.price_per_hour"
    )
