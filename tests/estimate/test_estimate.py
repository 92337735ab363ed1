"""`trainmaster estimate`: the arithmetic against hand-computed values, the figures' labels,
reading a run's rate, bad input, and the command itself (in process, and one real --measure /
--from-run each).

Hand computations (the tutorial's recipe: 28,125 steps x global batch 16,384 on trn1.32xlarge):
  sequences      28,125 x 16,384 = 460,800,000
  one node       3,826.6103 seq/s (Neuron 2.28.0, published)
  16 nodes       57,407.9207 seq/s published -> efficiency 57,407.9207 / (16 x 3,826.6103)
                 = 0.937643; time 460,800,000 / 57,407.9207 = 8,026.77 s; node-hours
                 16 x 8,026.77 / 3600 = 35.6745; cost x $21.50 = $767.00
  2 nodes        efficiency 0.937643 ** (1/4) = 0.984032 (one of four doublings to 16);
                 rate 2 x 3,826.6103 x 0.984032 = 7,531.02; time 61,186.95 s; 33.9928
                 node-hours; $730.84
  64 nodes       0.937643 ** (6/4) = 0.907938; rate 222,356.90; time 2,072.34 s; 36.8417
                 node-hours; $792.10
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cluster.conftest import _shared_moto, aws_read_only, no_credentials  # noqa: F401
from tests.conftest import run_cli
from tests.monitor.conftest import job_file
from trainmaster import catalog
from trainmaster.cli.app import main
from trainmaster.config import JobConfig, jobfile
from trainmaster.errors import UserError
from trainmaster.estimate import figures, rates
from trainmaster.estimate.spot import SpotPrice
from trainmaster.storage import Storage

TUTORIAL = ["train.global_batch_size=16384"]


def trn1(*sets: str) -> JobConfig:
    return jobfile.preset("trn1-bert-large", [*TUTORIAL, *sets])


def rows(cfg: JobConfig, rate: figures.Rate, nodes: str) -> dict[int, figures.Row]:
    return {r.nodes: r for r in figures.estimate(cfg, rate, figures.parse_nodes(nodes)).rows}


def test_published_trn1_rate_against_hand_computed_values() -> None:
    cfg = trn1()
    rate = rates.published_rate(cfg)
    assert (rate.per_node, rate.basis) == (3826.6103, "published")
    assert "training_data_encoder.csv" in rate.source and "2.28.0" in rate.source
    result = figures.estimate(cfg, rate, [2, 16, 64])
    assert result.sequences == 460_800_000
    by = {r.nodes: r for r in result.rows}
    r16 = by[16]
    assert (r16.efficiency, r16.efficiency_basis) == (
        pytest.approx(0.937643, abs=1e-6),
        "published",
    )
    assert r16.seq_per_s == pytest.approx(57407.9207)  # the published 16-node figure itself
    assert r16.time_s == pytest.approx(8026.77, abs=0.01)
    assert r16.node_hours == pytest.approx(35.6745, abs=1e-4)
    assert r16.cost == pytest.approx(767.00, abs=0.01)
    assert (r16.workers, r16.grad_accum, r16.per_worker) == (512, 2, 32)
    r2 = by[2]
    assert (r2.efficiency, r2.efficiency_basis) == (
        pytest.approx(0.984032, abs=1e-6),
        "interpolated",
    )
    assert r2.seq_per_s == pytest.approx(7531.02, abs=0.01)
    assert r2.time_s == pytest.approx(61186.95, abs=0.01)
    assert (r2.node_hours, r2.cost) == (
        pytest.approx(33.9928, abs=1e-4),
        pytest.approx(730.84, abs=0.01),
    )
    r64 = by[64]
    assert (r64.efficiency, r64.efficiency_basis) == (
        pytest.approx(0.907938, abs=1e-6),
        "extrapolated",
    )
    assert r64.seq_per_s == pytest.approx(222356.90, abs=0.01)
    assert (r64.time_s, r64.node_hours) == (
        pytest.approx(2072.34, abs=0.01),
        pytest.approx(36.8417, abs=1e-4),
    )
    assert r64.cost == pytest.approx(792.10, abs=0.01)
    assert result.price_per_node_hour == 21.50 and "us-east-1" in result.price_source


def test_p4d_interpolates_between_the_published_dle_points() -> None:
    sc = catalog.SCALING["p4d.24xlarge"]
    assert figures.efficiency(sc, 8) == (pytest.approx(7.86 / 8), "published")
    # between 8 (0.9825) and 16 (0.96875): 0.9825 x (0.96875 / 0.9825) ** (log 1.5 / log 2)
    assert figures.efficiency(sc, 12) == (pytest.approx(0.974433, abs=1e-6), "interpolated")
    # past 32 (0.9490625): 0.9490625 ** (log 64 / log 32) = 0.9490625 ** 1.2
    assert figures.efficiency(sc, 64) == (pytest.approx(0.939191, abs=1e-6), "extrapolated")
    assert figures.efficiency(sc, 1) == (1.0, "1 node")
    # strong scaling at 65,536: the published run had 65,536 / (8 x 16) = 512 per GPU at 16 nodes
    assert sc.reference_per_worker(16) == 512


def test_given_rate_and_the_price_override() -> None:
    """10 seq/s on one node, 100 steps x 32 = 3,200 sequences: 320 s, 0.08889 node-hours,
    x $1.61 (the catalog's CPU host) = $0.1431; with price_per_hour 2.0, $0.1778."""
    cfg = jobfile.preset("local-cpu", ["train.max_steps=100"])
    one = figures.Rate(10.0, "given", "--rate")
    r = rows(cfg, one, "1")[1]
    assert (r.time_s, r.node_hours, r.cost) == (
        320.0,
        pytest.approx(0.088889, abs=1e-6),
        pytest.approx(0.1431, abs=1e-4),
    )
    priced = figures.estimate(
        jobfile.preset("local-cpu", ["train.max_steps=100", "cluster.price_per_hour=2.0"]), one, [1]
    )
    assert priced.rows[0].cost == pytest.approx(0.1778, abs=1e-4)
    assert "price_per_hour" in priced.price_source


def test_a_type_without_published_scaling_borrows_trn1s_and_says_assumed() -> None:
    cfg = jobfile.preset("local-cpu")
    r = rows(cfg, figures.Rate(50.0, "given", "--rate"), "1,2")
    assert (r[2].efficiency, r[2].efficiency_basis) == (
        pytest.approx(0.984032, abs=1e-6),
        "assumed",
    )
    assert r[1].efficiency_basis == "1 node"
    assert (
        "assumed: no published multi-node figure for cpu"
        in figures.estimate(cfg, figures.Rate(50.0, "given", "--rate"), [2]).scaling
    )
    # 100 seq/s measured on 2 nodes is 100 / (2 x 0.984032) = 50.8113 for one node
    assert figures.per_node(100.0, 2, "cpu") == pytest.approx(50.8113, abs=1e-4)


def test_rows_that_do_not_run_or_run_below_the_published_batch() -> None:
    by = rows(trn1(), figures.Rate(3826.6103, "published", "x"), "1,2,32,64")
    # 16,384 over 64 x 32 workers x 16 is not a whole accumulation: 2,048 workers, 8 per worker
    assert by[64].grad_accum is None and "does not run as is" in by[64].notes[0]
    assert by[32].grad_accum == 1 and by[32].notes == ()
    assert [by[n].below_published for n in (1, 2, 32)] == [False, True, True]  # < 2,048 / worker


@pytest.mark.parametrize(
    ("text", "expected"), [("64,2,2", [2, 64]), ("16", [16]), (" 4, 8 ", [4, 8])]
)
def test_node_lists(text: str, expected: list[int]) -> None:
    assert figures.parse_nodes(text) == expected


@pytest.mark.parametrize("text", ["2,x", "0", "", "2,,4", "-1", "1.5", "100001"])
def test_bad_node_lists(text: str) -> None:
    with pytest.raises(UserError, match=r"^--nodes: .* is not a node count"):
        figures.parse_nodes(text)


@pytest.mark.parametrize(
    ("preset", "sets", "says"),
    [
        ("p5-bert-large", [], "no published training rate for p5.48xlarge"),
        ("trn1-bert-large", ['model.preset="bert-base"'], "trains bert-base at seq 128"),
        (
            "trn1-bert-large",
            ['train.precision="fp32"'],
            "is for bf16 training; this job trains in fp32",
        ),
        ("local-cpu", [], "no published training rate for cpu"),
    ],
)
def test_no_published_rate_applies(preset: str, sets: list[str], says: str) -> None:
    with pytest.raises(UserError, match=r"^--rate: .*--from-run JOB or --measure") as info:
        rates.published_rate(jobfile.preset(preset, sets))
    assert says in str(info.value)


def fake_run(root: Path, cfg: JobConfig, summary: dict[str, object] | None) -> Storage:
    """A run folder as a finished run leaves it: job.toml and summary.json."""
    run = root / "runs" / cfg.job.name
    run.mkdir(parents=True)
    (run / "job.toml").write_text(jobfile.render(cfg, "test"), encoding="utf-8")
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return Storage(root)


def test_rate_of_a_finished_run(tmp_path: Path) -> None:
    cfg = jobfile.preset("local-cpu")
    store = fake_run(tmp_path, cfg, {"avg_seq_per_s": 100.0, "world_size": 2, "steps_this_run": 12})
    rate = rates.rate_of_run(store, "demo", cfg)
    assert rate.per_node == pytest.approx(50.8113, abs=1e-4) and rate.basis == "measured"
    assert "100.00 seq/s average over 12 steps" in rate.source and "2 node(s) x 1" in rate.source


def test_runs_whose_rate_does_not_apply(tmp_path: Path) -> None:
    cfg = jobfile.preset("local-cpu")
    with pytest.raises(UserError, match=r"^--from-run: no job 'nope' under .*runs \(jobs: demo\)"):
        rates.rate_of_run(fake_run(tmp_path / "a", cfg, None), "nope", cfg)
    with pytest.raises(UserError, match=r"^--from-run: run demo has no summary.json with a rate"):
        rates.rate_of_run(fake_run(tmp_path / "b", cfg, None), "demo", cfg)
    other = jobfile.preset("local-cpu", ['model.preset="bert-mini"', "train.batch_size=8"])
    store = fake_run(tmp_path / "c", other, {"avg_seq_per_s": 9.0, "world_size": 2})
    with pytest.raises(
        UserError,
        match=r"^--from-run: run demo is shaped differently .*"
        r"model \(4, 256, 4, 1024\) vs \(2, 128, 2, 512\); "
        r"train.batch_size 8 vs 16",
    ):
        rates.rate_of_run(store, "demo", cfg)


def test_measure_refuses_a_cluster_job(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"^--measure: .*kubernetes job on trn1.32xlarge"):
        rates.measure(tmp_path / "x.toml", [], trn1(), Storage(tmp_path), 5)


# --- the command, in process (trainmaster.cli.app.main) ---


def tutorial_file(tmp_path: Path) -> Path:
    path = tmp_path / "trn1.toml"
    path.write_text(jobfile.render(trn1(), "test"), encoding="utf-8")
    return path


def test_command_prints_the_table_and_the_sources(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["estimate", str(tutorial_file(tmp_path)), "--nodes", "16,2"]) == 0
    text = capsys.readouterr().out
    assert "460,800,000 sequences on trn1.32xlarge (rate: published)" in text
    line16 = next(line for line in text.splitlines() if line.startswith("│ 16 "))
    for cell in ("512", "93.8% (published)", "57,407.9", "2h13m47s", "35.7", "$767.00"):
        assert cell in line16, (cell, line16)
    assert text.index("│ 2 ") < text.index("│ 16 ")  # sorted
    assert "one node: 3,826.61 seq/s, published" in text and "training_data_encoder.csv" in text
    assert "price: $21.50/node-hour (catalog" in text and "assumed: sequences to train" in text


def test_command_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            ["estimate", str(tutorial_file(tmp_path)), "--nodes", "16", "--rate", "1000", "--json"]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["rate"] == {"per_node": 1000.0, "basis": "given", "source": "--rate"}
    row = data["rows"][0]
    # 16 x 1,000 x 0.937643 = 15,002.29 seq/s; 460,800,000 / 15,002.29 = 30,715.3 s
    assert row["seq_per_s"] == pytest.approx(15002.29, abs=0.01)
    assert row["time_s"] == pytest.approx(30715.3, abs=0.1)
    assert data["sequences"] == 460_800_000 and data["instance"] == "trn1.32xlarge"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--nodes", "2,four"], "--nodes: 'four' is not a node count"),
        (["--rate", "0"], "--rate: 0.0 is not a rate"),
        (["--rate", "-3"], "--rate: -3.0 is not a rate"),
        (["--rate", "inf"], "--rate: inf is not a rate"),
        (["--rate", "5", "--measure"], "--rate: give one of --rate, --from-run and --measure"),
        (["--from-run", "gone"], "--from-run: no job 'gone'"),
        (
            ["--set", 'model.preset="bert-base"'],
            "--rate: the published trn1.32xlarge rate is BERT-large",
        ),
    ],
)
def test_command_bad_input_is_one_line_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    says: str,
) -> None:
    monkeypatch.setenv("TRAINMASTER_STORAGE", str(tmp_path / "store"))
    path = tutorial_file(tmp_path)
    # the job file names /data as its storage: use one that has no runs
    path.write_text(path.read_text().replace('storage = "/data"', f'storage = "{tmp_path}"'))
    assert main(["estimate", str(path), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0], err


# --- real runs: --measure runs the job here; --from-run reads a finished one ---


@pytest.mark.slow
def test_measure_runs_the_job_here(pydoc_storage: Path, tmp_path: Path) -> None:
    path = job_file(tmp_path, "measured")
    result = run_cli(
        "estimate",
        str(path),
        "--measure",
        "--measure-steps",
        "4",
        "--nodes",
        "2,4",
        "--json",
        env={"TRAINMASTER_STORAGE": str(pydoc_storage)},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["rate"]["basis"] == "measured here" and data["rate"]["per_node"] > 0
    assert data["rate"]["source"].startswith("a run here: ")
    assert [r["efficiency_basis"] for r in data["rows"]] == ["assumed", "assumed"]
    assert not (pydoc_storage / "runs" / "measured").exists()  # ran in a temporary storage


@pytest.mark.slow
def test_from_run_uses_its_summary(finished_run: tuple[Path, str], tmp_path: Path) -> None:
    store, job = finished_run
    summary = json.loads((store / "runs" / job / "summary.json").read_text())
    path = job_file(tmp_path, "next")
    result = run_cli(
        "estimate",
        str(path),
        "--from-run",
        job,
        "--nodes",
        "2",
        "--json",
        env={"TRAINMASTER_STORAGE": str(store)},
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    # measured on 2 local nodes: one node's rate is avg / (2 x 0.984032); 2 nodes give avg back
    assert data["rows"][0]["seq_per_s"] == pytest.approx(summary["avg_seq_per_s"])
    assert data["rate"]["basis"] == "measured" and f"run {job}:" in data["rate"]["source"]


def test_measure_without_shards_says_so_before_launching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRAINMASTER_STORAGE", str(tmp_path / "empty"))
    path = tmp_path / "demo.toml"
    path.write_text(jobfile.render(jobfile.preset("local-cpu"), "test"), encoding="utf-8")
    assert main(["estimate", str(path), "--measure", "--measure-steps", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "error: data.dataset: no *_training_*.hdf5 shards in "
        f"{tmp_path / 'empty' / 'datasets' / 'pydoc'}"
    ), err


def test_measure_of_a_job_that_cannot_start_is_one_line(
    tmp_path: Path,
    pydoc_storage: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The measuring launch (a real subprocess) refuses the job (here: 2 x 3 workers need 6
    shards, the storage has 4); its one line comes back, and nothing is left running."""
    monkeypatch.setenv("TRAINMASTER_STORAGE", str(pydoc_storage))
    path = tmp_path / "demo.toml"
    cfg = jobfile.preset("local-cpu", ["job.nproc_per_node=3", "train.global_batch_size=96"])
    path.write_text(jobfile.render(cfg, "test"), encoding="utf-8")
    assert main(["estimate", str(path), "--measure", "--measure-steps", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("measuring: 3 steps of demo here")
    assert len(err) == 2 and err[1].startswith(
        "error: --measure: the measuring run refused the job: "
    )
    assert "4 shards in" in err[1] and "for 6 workers" in err[1], err


# --- Spot: EC2's price now (estimate/spot.py), never a list price ---


def test_a_spot_price_prices_the_node_hours_and_says_where_it_came_from() -> None:
    spot = SpotPrice(6.45, "EC2 Spot price of trn1.32xlarge now, the highest of us-west-2's zones")
    rate = figures.Rate(1000.0, "given", "--rate")
    cfg = trn1()
    on_demand = figures.estimate(cfg, rate, [16])
    priced = figures.estimate(cfg, rate, [16], spot)
    assert priced.price_per_node_hour == 6.45 and priced.price_source == spot.source
    row, base = priced.rows[0], on_demand.rows[0]
    assert row.node_hours == base.node_hours  # the same hours, another price
    assert row.cost == pytest.approx(base.cost * 6.45 / 21.50)
    assert any("Spot price now x node-hours" in a for a in priced.assumptions)
    # the job file's own price wins over a looked-up one
    own = figures.estimate(trn1("cluster.price_per_hour=12.0"), rate, [16], spot)
    assert own.price_per_node_hour == 12.0 and "price_per_hour" in own.price_source


@pytest.mark.usefixtures("aws_read_only")
def test_command_spot_asks_ec2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tutorial_file(tmp_path)
    assert main(["estimate", str(path), "--nodes", "16", "--spot", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["price_source"].startswith("EC2 Spot price of trn1.32xlarge now")
    assert "us-west-2" in data["price_source"] and data["price_per_node_hour"] > 0
    assert data["price_per_node_hour"] != 21.50


@pytest.mark.usefixtures("no_credentials")
def test_command_spot_without_credentials_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["estimate", str(tutorial_file(tmp_path)), "--spot"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no AWS credentials for ec2:DescribeSpotPriceHistory" in err[0], err
