"""Bad job files and arguments: each exits 2 with one stderr line naming the field or file.

Table-driven through the real command in a subprocess, so a traceback would be seen.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import assert_user_error, run_cli

GOOD = """
[job]
name = "t"
nnodes = 2
nproc_per_node = 1
[train]
batch_size = 16
global_batch_size = 32
"""

K8S = GOOD.replace('name = "t"', 'name = "t"\nbackend = "kubernetes"')

# (id, job file text or None, extra args, text the error line must contain)
CASES: list[tuple[str, str | None, list[str], str]] = [
    ("missing-file", None, ["config", "validate", "nope.toml"], "nope.toml: no such job file"),
    ("malformed-toml", "[job\nname=", ["config", "validate", "{f}"], "job.toml: not valid TOML"),
    (
        "unknown-key",
        GOOD + "batchsize = 8\n",
        ["config", "validate", "{f}"],
        "train.batchsize: unknown key",
    ),
    (
        "unknown-section",
        GOOD + "[trainer]\nlr = 1.0\n",
        ["config", "validate", "{f}"],
        "trainer: unknown key",
    ),
    (
        "string-for-int",
        GOOD.replace("batch_size = 16", 'batch_size = "16"'),
        ["config", "validate", "{f}"],
        "train.batch_size: input should be a valid integer",
    ),
    (
        "negative-batch",
        GOOD.replace("batch_size = 16", "batch_size = -1"),
        ["config", "validate", "{f}"],
        "train.batch_size: input should be greater than 0 (got -1)",
    ),
    (
        "zero-nodes",
        GOOD.replace("nnodes = 2", "nnodes = 0"),
        ["config", "validate", "{f}"],
        "job.nnodes: input should be greater than 0",
    ),
    (
        "zero-lr",
        GOOD + "lr = 0.0\n",
        ["config", "validate", "{f}"],
        "train.lr: input should be greater than 0",
    ),
    (
        "negative-restarts",
        GOOD.replace('name = "t"', 'name = "t"\nmax_restarts = -1'),
        ["config", "validate", "{f}"],
        "job.max_restarts",
    ),
    (
        "accum-not-dividing",
        GOOD.replace("global_batch_size = 32", "global_batch_size = 48"),
        ["config", "validate", "{f}"],
        "train.global_batch_size: 48 is not a multiple of batch_size x world size (16 x 2 = 32)",
    ),
    (
        "global-not-multiple-of-micro",
        GOOD.replace("global_batch_size = 32", "global_batch_size = 33"),
        ["config", "validate", "{f}"],
        "global_batch_size must be a multiple of batch_size",
    ),
    (
        "nproc-above-instance",
        K8S.replace("nproc_per_node = 1", "nproc_per_node = 33").replace(
            "global_batch_size = 32", "global_batch_size = 1056"
        ),
        ["config", "validate", "{f}"],
        "job.nproc_per_node: 33 workers per node, but trn1.32xlarge has 32 cores",
    ),
    (
        "unknown-instance",
        GOOD + '[kubernetes]\ninstance_type = "trn9.large"\n',
        ["config", "validate", "{f}"],
        "kubernetes.instance_type: unknown instance type 'trn9.large'",
    ),
    (
        "unknown-job-preset",
        None,
        ["init", "--preset", "bert-huge"],
        "--preset: unknown preset 'bert-huge'",
    ),
    (
        "unknown-model-preset",
        GOOD + '[model]\npreset = "bert-huge"\n',
        ["config", "validate", "{f}"],
        "model.preset: input should be",
    ),
    (
        "bad-job-name",
        GOOD.replace('name = "t"', 'name = "My_Job"'),
        ["config", "validate", "{f}"],
        "job.name: 'My_Job' is not a DNS-1035 label",
    ),
    (
        "seq-len-too-short",
        GOOD + "[data]\nseq_len = 8\n",
        ["config", "validate", "{f}"],
        "data.seq_len: input should be greater than or equal to 16",
    ),
    (
        "max-pred-above-seq",
        GOOD + "[data]\nseq_len = 32\nmax_pred = 40\n",
        ["config", "validate", "{f}"],
        "data: max_pred must be below seq_len",
    ),
    (
        "warmup-too-long",
        GOOD + "warmup_steps = 300\n",
        ["config", "validate", "{f}"],
        "train: warmup_steps must be below max_steps",
    ),
    (
        "heads-not-dividing",
        GOOD + "[model]\nnum_heads = 3\n",
        ["config", "validate", "{f}"],
        "model: num_heads must divide hidden_size",
    ),
    (
        "unknown-rdzv",
        GOOD + '[rendezvous]\nbackend = "zookeeper"\n',
        ["config", "validate", "{f}"],
        "rendezvous.backend: input should be 'c10d', 'etcd' or 'etcd-v2'",
    ),
    ("unknown-device", GOOD + 'device = "tpu"\n', ["config", "validate", "{f}"], "train.device"),
    (
        "min-above-max-nodes",
        GOOD.replace("nnodes = 2", "nnodes = 2\nmin_nnodes = 3"),
        ["config", "validate", "{f}"],
        "job.min_nnodes: 3 is above job.nnodes 2",
    ),
    (
        "cluster-type-mismatch",
        GOOD + '[cluster]\ninstance_type = "p5.48xlarge"\n',
        ["config", "validate", "{f}"],
        "cluster.instance_type: p5.48xlarge differs from kubernetes.instance_type",
    ),
    (
        "bad-cluster-name",
        GOOD + '[cluster]\nname = "1-cluster"\n',
        ["config", "validate", "{f}"],
        "cluster.name",
    ),
    (
        "set-without-equals",
        GOOD,
        ["config", "show", "{f}", "--set", "train.batch_size"],
        "--set train.batch_size: expected section.key=value",
    ),
    (
        "set-unknown-section",
        GOOD,
        ["config", "show", "{f}", "--set", "foo.bar=1"],
        "--set foo.bar=1: unknown section 'foo'",
    ),
    (
        "set-unknown-key",
        GOOD,
        ["config", "validate", "{f}", "--set", "train.nope=1"],
        "train.nope: unknown key",
    ),
    (
        "set-bad-value",
        GOOD,
        ["config", "validate", "{f}", "--set", "train.batch_size=0"],
        "train.batch_size: input should be greater than 0",
    ),
    ("job-file-is-a-folder", None, ["config", "validate", "."], ".: cannot read the job file"),
    ("unknown-option", GOOD, ["config", "show", "{f}", "--bogus"], "no such option: --bogus"),
    ("missing-argument", None, ["config", "validate"], "missing argument 'FILE'"),
    ("init-refuses-overwrite", GOOD, ["init", "--out", "{f}"], "job.toml: exists; pass --force"),
]


@pytest.mark.parametrize(
    ("text", "args", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_one_clear_line(
    text: str | None, args: list[str], expected: str, tmp_path: Path
) -> None:
    path = tmp_path / "job.toml"
    if text is not None:
        path.write_text(text)
    result = run_cli(*[a.replace("{f}", str(path)) for a in args], cwd=tmp_path)
    line = assert_user_error(result)
    assert "Traceback" not in result.stdout
    assert expected.lower() in line.lower(), line


def test_enough_cases() -> None:
    assert len(CASES) >= 20


def test_the_good_file_is_good(tmp_path: Path) -> None:
    """The cases above fail because of their one change, not because the base is broken."""
    path = tmp_path / "job.toml"
    path.write_text(GOOD)
    result = run_cli("config", "validate", str(path))
    assert result.returncode == 0, result.stderr
    assert "gradient accumulation 1" in result.stdout
    path.write_text(K8S)
    assert run_cli("config", "validate", str(path)).returncode == 0


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = run_cli("--debug", "config", "validate", str(tmp_path / "nope.toml"))
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_a_job_name_that_is_no_dns1035_label_is_refused(tmp_path: Path) -> None:
    """30.12: the Kubernetes backend names the job's Service after the job, and a Service name
    is a DNS-1035 label (it starts with a letter); `config validate` says so, exit 2."""
    path = tmp_path / "job.toml"
    path.write_text(GOOD.replace('name = "t"', 'name = "1bert"'))
    result = run_cli("config", "validate", str(path))
    assert_user_error(result, "DNS-1035 label", "start with a letter", where="job.toml: job.name")
