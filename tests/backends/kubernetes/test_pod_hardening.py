"""The pod scripts and pod specs against real-cluster defects (issues 12.1, 12.2, 12.6, 17.9, 17.10).

The scripts are run by a real /bin/sh with harmless stubs (python3, getent, aws, cp) on PATH;
the pod specs are checked against the published Kubernetes schemas.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.backends.kubernetes.schemas import (
    validate_k8s,
    validate_pod_templates,
    validate_volcano_job,
)
from tests.backends.kubernetes.test_volcano import job_cfg, pod_spec, script_of
from tests.conftest import assert_user_error, run_cli
from trainmaster import api
from trainmaster.backends.kubernetes import stage, volcano
from trainmaster.compile import lock
from trainmaster.errors import UserError
from trainmaster.launch.torchrun import Rendezvous

HOSTILE = [
    "$(touch {canary})",
    "`touch {canary}`",
    "x'; touch {canary}; '",
    'x"; touch {canary}; "',
    "x\ntouch {canary}\n",
]


def stub_bin(tmp: Path, **scripts: str) -> Path:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
    return bin_dir


def sh(script: str, bin_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env}
    return subprocess.run(
        ["/bin/sh", "-c", script], env=full, capture_output=True, text=True, timeout=30
    )


# --- 12.1: the rendezvous id, per submission and per Volcano retry, equal within an attempt ---
def rdzv_id(tmp: Path, podgroup: str, version: str) -> subprocess.CompletedProcess[str]:
    script = script_of(volcano.build_job(job_cfg("p5-48xl")))
    part = script[script.index(volcano.RDZV_ID_BEGIN) : script.index(volcano.RDZV_ID_END)]
    return sh(
        "set -eu\n" + part + 'printf "%s" "$rdzv_id"\n',
        stub_bin(tmp),
        **{volcano.ENV_PODGROUP: podgroup, volcano.ENV_JOB_VERSION: version},
    )


def test_rendezvous_id_changes_with_each_retry_and_submission(tmp_path: Path) -> None:
    uid_a, uid_b = (
        "bert-large-p5-6f1c2d1e-0000-4a5b-8c9d-000000000001",
        "bert-large-p5-6f1c2d1e-0000-4a5b-8c9d-000000000002",
    )
    pod0, pod1 = rdzv_id(tmp_path, uid_a, "0"), rdzv_id(tmp_path, uid_a, "0")  # one attempt
    retry = rdzv_id(tmp_path, uid_a, "1")  # after a RestartJob
    again = rdzv_id(tmp_path, uid_b, "0")  # the job deleted and submitted again
    assert {r.returncode for r in (pod0, pod1, retry, again)} == {0}
    assert pod0.stdout == pod1.stdout == f"{uid_a}-v0"
    assert len({pod0.stdout, retry.stdout, again.stdout}) == 3
    assert "warning" not in pod0.stderr
    old = rdzv_id(tmp_path, "bert-large-p5", "0")  # Volcano < 1.6: the PodGroup is the job's name
    assert old.returncode == 0 and "older than v1.6" in old.stderr
    missing = rdzv_id(tmp_path, "", "0")  # a pod not created by Volcano's job controller
    assert missing.returncode == 1 and "scheduling.k8s.io/group-name" in missing.stderr


def test_torchrun_gets_the_shell_expanded_id_from_the_downward_api(tmp_path: Path) -> None:
    job = volcano.build_job(job_cfg("p5-48xl"))
    env = {e["name"]: e for e in pod_spec(job)["containers"][0]["env"]}
    assert (
        env[volcano.ENV_PODGROUP]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.annotations['scheduling.k8s.io/group-name']"
    )
    assert (
        env[volcano.ENV_JOB_VERSION]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.annotations['volcano.sh/job-version']"
    )
    mount = tmp_path / "data"
    cfg = job_cfg(
        "cpu",
        [
            "rendezvous.backend=etcd",
            "rendezvous.endpoint=localhost:2379",
            "job.nnodes=1",
            f"kubernetes.mount={mount}",
        ],
    )
    script = script_of(volcano.build_job(cfg)).replace("/etc/trainmaster", str(tmp_path))
    (tmp_path / "job.toml").write_text("# resolved\n")
    bin_dir = stub_bin(tmp_path, python3='for a in "$@"; do echo "arg:$a"; done\n')
    runs = [
        sh(
            script,
            bin_dir,
            POD_NAME="demo-worker-0",
            POD_IP="127.0.0.1",
            **{volcano.ENV_PODGROUP: "demo-1234", volcano.ENV_JOB_VERSION: v},
        )
        for v in ("2", "3")
    ]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr
    ids = [
        [line for line in r.stdout.splitlines() if line.startswith("arg:--rdzv-id=")] for r in runs
    ]
    assert ids == [["arg:--rdzv-id=demo-1234-v2"], ["arg:--rdzv-id=demo-1234-v3"]]


# --- 12.2: c10d by default on Kubernetes; etcd's versions said plainly ------------------------
def test_kubernetes_presets_use_c10d_and_etcd_lives_in_its_namespace() -> None:
    for preset in ("trn1-bert-large", "p5-bert-large"):
        cfg = api.preset_job(preset, ["kubernetes.image=x.dkr.ecr.us-west-2.amazonaws.com/t:1"])
        assert cfg.rendezvous.backend == "c10d" and cfg.rendezvous.endpoint is None, preset
        assert volcano.rendezvous(cfg).endpoint == f"{cfg.job.name}-worker-0.{cfg.job.name}:29400"
    assert volcano.DEFAULT_ETCD == "etcd-server.trainmaster-etcd.svc:2379"


def test_config_validate_names_the_etcd_versions_that_work(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(api.init_job("trn1-bert-large", None), encoding="utf-8")
    etcd = run_cli("config", "validate", str(job), "--set", "rendezvous.backend=etcd")
    assert etcd.returncode == 0, etcd.stderr
    assert "etcd 3.4 or 3.5 started with --enable-v2" in etcd.stdout and "3.6" in etcd.stdout
    c10d = run_cli("config", "validate", str(job))
    assert c10d.returncode == 0 and "etcd" not in c10d.stdout


# --- 17.9: nothing from the config is executed by the pod's shell -------------------------
@pytest.mark.parametrize(
    "endpoint", [*HOSTILE, "host:2379; touch x", "host", "host:0", "host:65536", "a b:1"]
)
def test_hostile_endpoints_are_refused(endpoint: str, tmp_path: Path) -> None:
    cfg = job_cfg("trn1-32xl", ["rendezvous.backend=etcd"])
    bad = cfg.model_copy(
        update={
            "rendezvous": cfg.rendezvous.model_copy(
                update={"endpoint": endpoint.format(canary=tmp_path / "x")}
            )
        }
    )
    with pytest.raises(UserError) as err:
        volcano.objects(bad)
    assert "rendezvous.endpoint" in str(err.value) and "host:port" in str(err.value)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_pod_script_quotes_the_endpoint(hostile: str, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    endpoint = hostile.format(canary=canary) + ":2379"
    cfg = job_cfg(
        "cpu",
        [
            "rendezvous.backend=etcd",
            "rendezvous.timeout=1",
            "job.nnodes=1",
            f"kubernetes.mount={tmp_path / 'data'}",
        ],
    )
    script = volcano.container_script(cfg, Rendezvous("etcd", endpoint), []).replace(
        "/etc/trainmaster", str(tmp_path)
    )
    (tmp_path / "job.toml").write_text("# resolved\n")
    env = {
        "POD_NAME": "demo-worker-1",
        "POD_IP": "10.0.0.2",
        volcano.ENV_PODGROUP: "demo-1",
        volcano.ENV_JOB_VERSION: "0",
    }
    log = tmp_path / "getent.log"
    unresolved = sh(
        script, stub_bin(tmp_path, getent=f'printf "%s\\n" "$2" >> {log}; exit 2\n'), **env
    )
    assert unresolved.returncode == 1 and hostile.format(canary=canary) in unresolved.stderr
    assert log.read_text() == hostile.format(canary=canary) + "\n"  # one argument, as written
    args = tmp_path / "args"
    resolved = sh(
        script,
        stub_bin(
            tmp_path,
            getent='echo "10.0.0.1 x"\n',
            python3=f'for a in "$@"; do printf "%s\\0" "$a"; done > {args}\n',
        ),
        **env,
    )
    assert resolved.returncode == 0, resolved.stderr
    assert f"--rdzv-endpoint={endpoint}" in args.read_text().split("\0")  # one argument, as written
    assert not canary.exists()


@pytest.mark.parametrize(
    "url",
    [
        "s3://bucket/$(touch x).tar",
        "s3://bucket/a`touch x`",
        "s3://bucket/a'b\nc",
        "s3://$(touch x)/k",
        "s3://Bad_Bucket/k",
        "s3://bucket/a b.tar",
        's3://bucket/a";touch x;".tar',
    ],
)
def test_hostile_s3_urls_are_refused(url: str) -> None:
    with pytest.raises(UserError) as err:
        stage.build_stage_pod(job_cfg("trn1-32xl"), url, "wiki")
    assert "SRC" in str(err.value)


@pytest.mark.parametrize("hostile", HOSTILE)
@pytest.mark.parametrize("kind", ["s3-prefix", "s3-archive"])
def test_stage_script_quotes_the_s3_url(hostile: str, kind: str, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    url = "s3://bucket/" + hostile.format(canary=canary) + ("/" if kind == "s3-prefix" else "")
    calls = tmp_path / "calls"
    # aws records its arguments and fails: the script must report the URL, never run it
    bin_dir = stub_bin(
        tmp_path, aws=f'for a in "$@"; do printf "%s|" "$a" >> {calls}; done; exit 1\n'
    )
    script = stage.script(
        stage.Source(kind, url),
        str(tmp_path / "dest"),
        str(tmp_path / "tmp"),  # type: ignore[arg-type]
        verify=["true"],
        s3=["aws", "s3"],  # the stub stands for `python3 -m trainmaster.cluster.aws s3` (30.3)
    )
    result = sh(script, bin_dir)
    assert result.returncode != 0 and not canary.exists()
    assert f"|{url}|" in "|" + calls.read_text()
    if kind == "s3-archive":
        assert url in result.stderr


# --- 12.6 + 17.10: node-local scratch, no privileges, schema-valid --------------------------
def containers(objs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, its container) of every Volcano job and pod among objs."""
    specs = [
        pod_spec(o) if o["kind"] == "Job" else o["spec"]
        for o in objs
        if o["kind"] in ("Job", "Pod")
    ]
    return [(spec, spec["containers"][0]) for spec in specs]


@pytest.mark.parametrize("case", ["trn1-32xl", "p5-48xl", "cpu"])
def test_pods_are_unprivileged_with_node_local_scratch(case: str) -> None:
    cfg = job_cfg(case)
    objs = [
        *volcano.objects(cfg),
        *volcano.objects(cfg, precompile=True),
        stage.build_stage_pod(cfg, "s3://neuron-s3/training_datasets/x.tar", "wiki"),
    ]
    for obj in objs:
        if obj["kind"] == "Job":
            validate_volcano_job(obj)
            validate_pod_templates(obj)
        elif obj["kind"] == "Pod":
            validate_k8s(obj)
    for spec, container in containers(objs):
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
        assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
        efa = "vpc.amazonaws.com/efa" in container["resources"]["limits"]
        assert sc["capabilities"].get("add", []) == (["IPC_LOCK"] if efa else [])
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["TMPDIR"] == "/tmp" and env["HOME"] == "/tmp"
        assert (
            container["workingDir"] == "/tmp"
        )  # relative writes (neuronx-cc's log) land on scratch
        assert not any(
            v and v.startswith(cfg.kubernetes.mount) and "TMP" in k for k, v in env.items()
        )
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        scratch = next(v for v in spec["volumes"] if v["name"] == mounts["/tmp"])
        assert scratch["emptyDir"] == {}  # the node's ephemeral storage, not memory, not FSx


# --- 17.3: the cache lock is held around the whole command, by the job, on any rank-0 pod ----
def precompile_pod(
    tmp: Path, pod: str, extra: list[str] | None = None, build: Any = volcano.build_precompile_job
) -> subprocess.CompletedProcess[str]:
    """Pod `pod` of the trn1 precompile job, with the real lock holder and a stub compiler that
    reports, after "compiling", who holds the lock and the token its environment carries."""
    mount = tmp / "data"
    job = build(job_cfg("trn1-32xl", [f"kubernetes.mount={mount}", *(extra or [])]))
    (tmp / "job.toml").write_text("# resolved\n")
    report = 'cat "$LOCKFILE" > "$OUT.lock" 2>/dev/null || true; printf "%s" "$TRAINMASTER_CACHE_LOCK" > "$OUT.env"\n'
    bin_dir = stub_bin(
        tmp,
        getent='echo "10.0.0.1 x"\n',
        neuron_parallel_compile=report,
        python3=f'exec {Path(sys.executable)} "$@"\n',
    )
    (bin_dir / "torchrun-stub").write_text(report)
    script = script_of(job).replace("/etc/trainmaster", str(tmp))
    if build is volcano.build_job:  # no wrapper: the trainer itself is the command
        script = script.replace('-- "$@" python3 ', f'-- "$@" sh {bin_dir / "torchrun-stub"} ')
    return sh(
        script,
        bin_dir,
        POD_NAME=pod,
        POD_IP="10.0.0.1",
        LOCKFILE=str(mount / "cache" / "bert-large" / ".lock"),
        OUT=str(tmp / pod),
        **{volcano.ENV_PODGROUP: "pg-1", volcano.ENV_JOB_VERSION: "4"},
    )


def test_pod0_holds_the_lock_until_the_precompile_command_has_ended(tmp_path: Path) -> None:
    result = precompile_pod(tmp_path, "bert-large-trn1-precompile-worker-0")
    assert result.returncode == 0, result.stderr
    held = json.loads((tmp_path / "bert-large-trn1-precompile-worker-0.lock").read_text())
    assert held["token"] == "pg-1-v4" and held["job"] == "bert-large-trn1-precompile"
    assert held["purpose"] == "precompile"
    assert (tmp_path / "bert-large-trn1-precompile-worker-0.env").read_text() == "pg-1-v4"
    assert not (tmp_path / "data" / "cache" / "bert-large" / ".lock").exists()  # released after
    other = precompile_pod(
        tmp_path, "bert-large-trn1-precompile-worker-1"
    )  # knows the token, takes nothing
    assert (
        other.returncode == 0
        and (tmp_path / "bert-large-trn1-precompile-worker-1.env").read_text() == "pg-1-v4"
    )
    assert not (tmp_path / "bert-large-trn1-precompile-worker-1.lock").read_text()


def test_pod0_waits_for_another_jobs_lock_and_runs_nothing(tmp_path: Path) -> None:
    cache_dir = tmp_path / "data" / "cache" / "bert-large"
    theirs = lock.acquire(cache_dir, job="someone-else", purpose="train")
    try:
        src = script_of(volcano.build_precompile_job(job_cfg("trn1-32xl")))
        assert "--wait 600" in src
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                volcano.CACHE_HOLD,
                "--cache",
                str(cache_dir),
                "--job",
                "mine",
                "--token",
                "t1",
                "--wait",
                "0",
                "--",
                "touch",
                str(tmp_path / "ran"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        theirs.release()
    assert_user_error(result, "someone-else")
    assert not (tmp_path / "ran").exists()


def test_neuron_training_without_compile_takes_the_lock_too(tmp_path: Path) -> None:
    result = precompile_pod(
        tmp_path, "bert-large-trn1-worker-0", ["train.compile=false"], build=volcano.build_job
    )
    assert result.returncode == 0, result.stderr
    held = json.loads((tmp_path / "bert-large-trn1-worker-0.lock").read_text())
    assert held["token"] == "pg-1-v4" and held["purpose"] == "train"
    gpu = script_of(
        volcano.build_job(job_cfg("p5-48xl"))
    )  # no shared cache without compile: no lock
    assert volcano.CACHE_HOLD not in gpu and "TRAINMASTER_CACHE_LOCK" not in gpu
