"""The Volcano Job builder: golden YAML, the published schemas, and what the job must carry."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.backends.kubernetes.schemas import (
    validate_k8s,
    validate_pod_templates,
    validate_volcano_job,
)
from tests.golden import check
from trainmaster import api
from trainmaster.backends.kubernetes import names as k8s_names
from trainmaster.backends.kubernetes import podspec, volcano
from trainmaster.config import JobConfig
from trainmaster.launch.torchrun import Rendezvous, command

GOLDEN = Path(__file__).parent / "golden"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/trainmaster:0.1.0"
CASES: dict[str, tuple[str, list[str]]] = {
    "trn1-32xl": ("trn1-bert-large", []),  # the tutorial's job
    "trn1n-32xl": (
        "trn1-bert-large",
        ["kubernetes.instance_type=trn1n.32xlarge", "job.name=bert-large-trn1n"],
    ),
    "p5-48xl": ("p5-bert-large", []),
    "cpu": (
        "local-cpu",
        [
            "job.backend=kubernetes",
            "kubernetes.instance_type=cpu",
            "train.compile=true",
            'kubernetes.node_selector={ "eks.amazonaws.com/nodegroup" = "cpu" }',
        ],
    ),
}


def job_cfg(case: str, extra: list[str] | None = None) -> JobConfig:
    preset, overrides = CASES[case]
    return api.preset_job(preset, [f"kubernetes.image={IMAGE}", *overrides, *(extra or [])])


def pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["tasks"][0]["template"]["spec"]
    return spec


def env_of(job: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "<ref>") for e in pod_spec(job)["containers"][0]["env"]}


def script_of(job: dict[str, Any]) -> str:
    cmd = pod_spec(job)["containers"][0]["command"]
    assert cmd[:2] == ["/bin/sh", "-c"]
    return str(cmd[2])


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str) -> None:
    check(GOLDEN / f"volcano-{case}.yaml", volcano.render_yaml(volcano.objects(job_cfg(case))))


def test_golden_precompile() -> None:
    objs = volcano.objects(job_cfg("trn1-32xl"), precompile=True)
    check(GOLDEN / "volcano-trn1-32xl-precompile.yaml", volcano.render_yaml(objs))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("precompile", [False, True])
def test_validates_against_the_published_schemas(case: str, precompile: bool) -> None:
    cm, _, job = volcano.objects(job_cfg(case), precompile=precompile)
    validate_volcano_job(job)
    validate_pod_templates(job)
    validate_k8s(cm)
    assert k8s_names.webhook_problems(job) == []


def test_the_schema_checks_can_fail() -> None:
    """The validators are not vacuous: misspelt fields are caught by both."""
    *_, job = volcano.objects(job_cfg("trn1-32xl"))
    job["spec"]["minAvailible"] = 2
    with pytest.raises(AssertionError, match="minAvailible"):
        validate_volcano_job(job)
    *_, job = volcano.objects(job_cfg("trn1-32xl"))
    pod_spec(job)["containers"][0]["volumeMount"] = []
    with pytest.raises(Exception, match="volumeMount"):
        validate_pod_templates(job)


def test_round_trips_through_yaml() -> None:
    objs = volcano.objects(job_cfg("p5-48xl"))
    assert list(yaml.safe_load_all(volcano.render_yaml(objs))) == objs


def test_tutorial_job_with_our_corrections() -> None:
    *_, job = volcano.objects(job_cfg("trn1-32xl"))
    spec, pod = job["spec"], pod_spec(job)
    assert spec["schedulerName"] == "volcano" and spec["queue"] == "trainmaster"
    assert spec["minAvailable"] == 2 and spec["tasks"][0]["replicas"] == 2
    assert spec["maxRetry"] == 4  # 3 restarts (30.9)
    assert {(p["event"], p["action"]) for p in spec["policies"]} == {
        ("PodEvicted", "RestartJob"),
        ("PodFailed", "RestartJob"),
    }
    res = pod["containers"][0]["resources"]
    assert res["requests"] == res["limits"]  # Guaranteed, never BestEffort
    assert (
        res["limits"]["aws.amazon.com/neuron"] == "16"
        and res["limits"]["vpc.amazonaws.com/efa"] == "8"
    )
    assert {"cpu", "memory"} <= set(res["limits"]) and "neurondevice" not in str(job)
    assert int(res["limits"]["cpu"]) < 128 and int(res["limits"]["memory"].removesuffix("Gi")) < 512
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory" and shm["emptyDir"]["sizeLimit"].endswith("Gi")
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "trn1.32xlarge"}
    assert {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["restartPolicy"] == "Never"
    env = env_of(job)
    for key, value in {
        "FI_PROVIDER": "efa",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "FI_EFA_FORK_SAFE": "1",
        "CCOM_SOCKET_IFNAME": "eth0",
        "NEURON_RT_RESET_CORES": "1",
        "NEURON_RT_STOCHASTIC_ROUNDING_EN": "1",
        "TRAINMASTER_STORAGE": "/data",
        "NEURON_CC_FLAGS": "--model-type=transformer --retry_failed_compilation "
        "--cache_dir=/data/cache/bert-large/neuron",
    }.items():
        assert env[key] == value, key
    assert env["POD_NAME"] == "<ref>"
    script = script_of(job)
    # c10d through pod 0's stable name (etcd 3.6 has no v2 API for torch's etcd rendezvous)
    assert "--rdzv-endpoint=bert-large-trn1-worker-0.bert-large-trn1:29400" in script
    assert "--rdzv-backend=c10d" in script and "--nproc-per-node=32" in script
    etcd = script_of(volcano.build_job(job_cfg("trn1-32xl", ["rendezvous.backend=etcd"])))
    assert "--rdzv-endpoint=etcd-server.trainmaster-etcd.svc:2379" in etcd
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["/data"] == "storage" and "/etc/trainmaster" in mounts
    claim = next(v for v in pod["volumes"] if v["name"] == "storage")["persistentVolumeClaim"]
    assert claim == {"claimName": "fsx-claim"}


def test_every_pod_runs_the_local_backends_command_line() -> None:
    cfg = job_cfg("p5-48xl")
    *_, job = volcano.objects(cfg)
    rdzv = Rendezvous("c10d", "bert-large-p5-worker-0.bert-large-p5:29400", run_id="$rdzv_id")
    expected = command(cfg, rdzv, job_file="/data/runs/bert-large-p5/job.toml", storage="/data")
    last = script_of(job).strip().splitlines()[-1]
    publisher = ["python3", "-m", volcano.PUBLISH, "--run", "/data/runs/bert-large-p5"]
    publisher += ["--job", "bert-large-p5", "--namespace", "default"]
    # the peer watch: the job's nodes and kubernetes.peer_lost_after_s (podpeers.py)
    publisher += ["--nodes", str(cfg.job.nnodes), "--peer-lost-after-s", "10", "--"]
    # "$@": pod 0's cache lock holder, if any
    assert shlex.split(last) == ["exec", *publisher, "$@", *expected]


def test_resources_per_node_type() -> None:
    limits = {
        case: pod_spec(volcano.build_job(job_cfg(case)))["containers"][0]["resources"]["limits"]
        for case in CASES
    }
    assert limits["trn1n-32xl"]["vpc.amazonaws.com/efa"] == "16"
    assert (
        limits["p5-48xl"]["nvidia.com/gpu"] == "8"
        and limits["p5-48xl"]["vpc.amazonaws.com/efa"] == "32"
    )
    assert set(limits["cpu"]) == {"cpu", "memory"}
    env = env_of(volcano.build_job(job_cfg("p5-48xl")))
    assert (
        env["NCCL_SOCKET_IFNAME"] == "eth0"
        and env["FI_PROVIDER"] == "efa"
        and "CCOM_SOCKET_IFNAME" not in env
    )
    cpu = volcano.build_job(job_cfg("cpu"))
    assert pod_spec(cpu)["nodeSelector"] == {"eks.amazonaws.com/nodegroup": "cpu"}
    # no device taints to tolerate on CPU nodes: only the lost-node ones (node_lost_after_s)
    assert {t["key"] for t in pod_spec(cpu)["tolerations"]} == set(podspec.NODE_LOST_TAINTS)


def test_a_small_node_sizes_the_container_by_the_job() -> None:
    """kubernetes.cpu / memory_gib replace the catalog's whole-node figures (a CPU node smaller
    than the generic `cpu` type's 32 vCPU, as the local cluster's real nodes are)."""
    whole = pod_spec(volcano.build_job(job_cfg("cpu")))
    small = pod_spec(
        volcano.build_job(job_cfg("cpu", ["kubernetes.cpu=0.5", "kubernetes.memory_gib=3"]))
    )
    res = small["containers"][0]["resources"]
    assert res["requests"] == res["limits"] == {"cpu": "0.5", "memory": "3Gi"}
    assert whole["containers"][0]["resources"]["limits"] == {"cpu": "30", "memory": "115Gi"}
    shm = {v["name"]: v for v in small["volumes"]}[podspec.SHM_VOLUME]
    assert shm["emptyDir"]["sizeLimit"] == "1Gi"  # an eighth, at least 1


def test_c10d_goes_through_the_jobs_own_service() -> None:
    *_, job = volcano.objects(job_cfg("p5-48xl"))
    assert job["spec"]["plugins"]["svc"] == ["--publish-not-ready-addresses"]
    script = script_of(job)
    assert "getent hosts bert-large-p5-worker-0.bert-large-p5" in script
    assert '[ "$ip" = "$POD_IP" ]' in script  # pod 0 waits for its own address
    assert volcano.config_map_name("x") != "x-svc"  # the svc plugin's own ConfigMap


def test_elastic_and_no_restarts() -> None:
    *_, job = volcano.objects(job_cfg("cpu", ["job.min_nnodes=1", "job.max_restarts=0"]))
    assert job["spec"]["minAvailable"] == 1 and job["spec"]["tasks"][0]["minAvailable"] == 1
    assert job["spec"]["tasks"][0]["replicas"] == 2 and "--nnodes=1:2" in script_of(job)
    # Volcano turns maxRetry 0 into 3: without restarts a failure terminates the job.
    assert {p["action"] for p in job["spec"]["policies"]} == {"TerminateJob"}
    assert k8s_names.webhook_problems(job) == []


def test_an_elastic_gang_replaces_a_lost_pod_alone() -> None:
    """min_nnodes < nnodes: Volcano's RestartPod keeps the job version (the rendezvous id), so
    the survivors train on and the new pod's agent joins them; the pods watch as elastic."""
    *_, job = volcano.objects(job_cfg("cpu", ["job.min_nnodes=1"]))
    assert {p["action"] for p in job["spec"]["policies"]} == {"RestartPod"}
    assert "--nodes 2 --peer-lost-after-s 10 --elastic --" in script_of(job)
    validate_volcano_job(job)
    assert k8s_names.webhook_problems(job) == []
    *_, fixed = volcano.objects(job_cfg("cpu"))
    assert {p["action"] for p in fixed["spec"]["policies"]} == {"RestartJob"}
    assert "--elastic" not in script_of(fixed)


def test_precompile_job() -> None:
    cm, _, job = volcano.objects(job_cfg("trn1-32xl"), precompile=True)
    assert job["metadata"]["name"] == "bert-large-trn1-precompile"
    assert job["metadata"]["labels"]["trainmaster.io/kind"] == "precompile"
    assert '-- "$@" neuron_parallel_compile python3 -m torch.distributed.run' in script_of(job)
    assert "--job /data/runs/bert-large-trn1-precompile/job.toml" in script_of(job)
    assert "steps_this_run = 10" in cm["data"]["job.toml"]
    train = volcano.build_job(job_cfg("trn1-32xl"))
    assert env_of(job)["NEURON_CC_FLAGS"] == env_of(train)["NEURON_CC_FLAGS"]  # one cache
    gpu = volcano.build_precompile_job(job_cfg("p5-48xl"))
    assert '-- "$@" python3 -m torch.distributed.run' in script_of(gpu)


def test_options_reach_the_pod() -> None:
    cfg = job_cfg(
        "trn1-32xl",
        [
            "kubernetes.service_account=trainer",
            "kubernetes.namespace=ml",
            'kubernetes.tolerations=[{ key = "team", operator = "Equal", value = "nlp", effect = "NoSchedule" }]',
            'kubernetes.node_selector={ "topology.kubernetes.io/zone" = "us-west-2d" }',
        ],
    )
    job = volcano.build_job(cfg, priority_class="high")
    pod = pod_spec(job)
    assert pod["serviceAccountName"] == "trainer" and job["metadata"]["namespace"] == "ml"
    assert job["spec"]["priorityClassName"] == "high"
    assert {"key": "team", "operator": "Equal", "value": "nlp", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["nodeSelector"]["topology.kubernetes.io/zone"] == "us-west-2d"
    labels = job["spec"]["tasks"][0]["template"]["metadata"]["labels"]
    assert labels["trainmaster.io/job"] == "bert-large-trn1"
    assert labels["app.kubernetes.io/managed-by"] == "trainmaster"
    validate_volcano_job(job)
    validate_pod_templates(job)


# --- the pod's shell script, run for real (with python3 replaced by a stub) -------------------
def run_script(
    job: dict[str, Any], tmp: Path, pod: str, pod_ip: str, host: str | None = None
) -> subprocess.CompletedProcess[str]:
    conf, bin_dir = tmp / "etc", tmp / "bin"
    conf.mkdir(exist_ok=True)
    bin_dir.mkdir(exist_ok=True)
    (conf / "job.toml").write_text("# resolved\n")
    stub = bin_dir / "python3"
    stub.write_text('#!/bin/sh\necho "torchrun $*"\n')
    stub.chmod(0o755)
    script = script_of(job).replace("/etc/trainmaster", str(conf))
    if host:
        script = script.replace(host, "localhost")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "POD_NAME": pod,
        "POD_IP": pod_ip,
        volcano.ENV_PODGROUP: "demo-0f2c",
        volcano.ENV_JOB_VERSION: "0",
    }
    return subprocess.run(
        ["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=30
    )


def test_script_writes_the_job_file_and_execs_torchrun(tmp_path: Path) -> None:
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
    result = run_script(volcano.build_job(cfg), tmp_path, "demo-worker-1", "10.0.0.7")
    assert result.returncode == 0, result.stderr
    assert (mount / "runs" / "demo" / "job.toml").read_text() == "# resolved\n"
    assert not list((mount / "runs" / "demo").glob(".job.toml.*"))  # the temporary file was renamed
    # the pod's first process publishes the progress (publish.py) and runs torchrun under it
    assert result.stdout.startswith(
        f"torchrun -m {volcano.PUBLISH} --run {mount}/runs/demo --job demo --namespace default "
        "--nodes 1 --peer-lost-after-s 10 -- python3 -m torch.distributed.run --nnodes=1 --nproc-per-node=1"
    )
    assert f"--job {mount}/runs/demo/job.toml --storage {mount}" in result.stdout


def test_script_pod0_waits_until_the_name_is_its_own(tmp_path: Path) -> None:
    cfg = job_cfg("cpu", ["rendezvous.timeout=2", f"kubernetes.mount={tmp_path / 'data'}"])
    job = volcano.build_job(cfg)
    host = "demo-worker-0.demo"
    ok = run_script(job, tmp_path, "demo-worker-0", "127.0.0.1", host)
    assert ok.returncode == 0, ok.stderr
    other = run_script(job, tmp_path, "demo-worker-1", "10.1.1.1", host)  # any address will do
    assert other.returncode == 0, other.stderr
    stale = run_script(job, tmp_path, "demo-worker-0", "10.1.1.1", host)  # a stale record
    assert (
        stale.returncode == 1
        and "did not resolve to the rendezvous host within 2 s" in stale.stderr
    )
    assert "torchrun" not in stale.stdout


def test_max_restarts_counts_restarts() -> None:
    """30.9: Volcano fails the job once RetryCount >= maxRetry, RetryCount counting the restart
    being asked for (pkg/controllers/job/state/running.go, restarting.go)."""
    for restarts in (1, 3):
        *_, job = volcano.objects(job_cfg("trn1-32xl", [f"job.max_restarts={restarts}"]))
        assert job["spec"]["maxRetry"] == restarts + 1


def test_efa_pods_request_hugepages_within_the_nodes_memory() -> None:
    """30.7: AWS's EKS EFA manifests request hugepages-2Mi 5120Mi (awsome-distributed-training
    micro-benchmarks/nccl-tests/kubernetes/nccl-tests.yaml); pre-allocated huge pages leave the
    node's allocatable memory, so memory + hugepages stay within what the pod had before."""
    for case in ("trn1-32xl", "trn1n-32xl", "p5-48xl"):
        res = pod_spec(volcano.build_job(job_cfg(case)))["containers"][0]["resources"]
        assert res["requests"]["hugepages-2Mi"] == res["limits"]["hugepages-2Mi"] == "5120Mi"
        inst = job_cfg(case).derived.instance
        memory = int(res["limits"]["memory"].removesuffix("Gi"))
        assert memory + 5 <= int(inst.memory_gib * 0.9)
    cpu = pod_spec(volcano.build_job(job_cfg("cpu")))["containers"][0]["resources"]
    assert "hugepages-2Mi" not in cpu["limits"]


def test_the_priority_class_comes_from_the_job_file() -> None:
    """kubernetes.priority_class orders jobs: on the Volcano Job (its scheduler) and its pods."""
    job = volcano.build_job(job_cfg("trn1-32xl", ['kubernetes.priority_class="team-high"']))
    assert job["spec"]["priorityClassName"] == "team-high"
    assert pod_spec(job)["priorityClassName"] == "team-high"
    validate_volcano_job(job)
    validate_pod_templates(job)
    plain = volcano.build_job(job_cfg("trn1-32xl"))
    assert "priorityClassName" not in plain["spec"] and "priorityClassName" not in pod_spec(plain)
