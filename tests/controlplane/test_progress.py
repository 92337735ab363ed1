"""A Kubernetes job's progress in `status`, `list` and after its pods end, on the real control plane.

3 fake trn1 nodes, the tutorial's 2-node job. kwok's nodes run no containers, so the pod-side
half runs here as real processes with the identity the pod has: the publisher
(backends/kubernetes/publish.py) with a service-account token bound to pod 0, under the plan's
Role and admission policy (cluster/progressguard.py), wrapping a command that does what a
custom script's rank 0 does in the run folder (the entry shim's rank0.json, log_metrics rows,
then summary.json) and waits for the test between its steps and its end. The publisher's
/metrics (monitor/exporter.py) is scraped too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.controlplane import kubejobs as kj
from tests.controlplane.conftest import RealKube
from trainmaster.backends.kubernetes import publish
from trainmaster.backends.kubernetes.pod_script import PUBLISH
from trainmaster.backends.local.rendezvous import free_port
from trainmaster.cluster import progressguard

pytestmark = [pytest.mark.kube, pytest.mark.timeout(900)]

RANK0 = """
import json, os, sys, time
from pathlib import Path
from typing import Any
from trainmaster.launch import entry
from trainmaster.storage import RunPaths
from trainmaster.worker import log_metrics

run = RunPaths(Path(sys.argv[1]))
entry.prepare(run, str(run.dir.parent.parent))  # rank0.json names this pod, as in the pod
for step in (1, 2, 3):
    log_metrics(step, loss=7.5 - step, seq_per_s=100.0 + step)
gate = Path(sys.argv[2])
while not gate.exists():  # the test looks at `status` while the job "runs"
    time.sleep(0.05)
run.summary.write_text(json.dumps({"status": "completed", "restarts": 0}))
"""


@pytest.fixture
def progress_rbac(real_kube: RealKube, job_ns: str) -> Iterator[None]:
    from kubernetes import dynamic

    objs = progressguard.rbac(job_ns, "default")
    for obj in objs:
        kj.apply(real_kube, obj, obj["metadata"].get("namespace"))
    yield
    client = dynamic.DynamicClient(real_kube.api)
    for obj in reversed(objs):
        client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"]).delete(
            name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace")
        )


def test_status_shows_rank_0s_progress_while_it_runs_and_the_summary_after_the_pods_end(
    real_kube: RealKube, job_ns: str, progress_rbac: None, tmp_path: Path
) -> None:
    ns = job_ns
    handle = kj.launch(real_kube, ns, kj.TRN1)
    job = handle.rsplit("/", 1)[1]
    pods = kj.bound(real_kube, ns, job, 2, "0")
    before = kj.status(real_kube, ns, handle)
    assert before["step"] is None and before["loss"] is None  # rank 0 has published nothing

    # the run folder on the "shared storage", with the job file the pod script copies there
    run = tmp_path / "fsx" / "runs" / job
    run.mkdir(parents=True)
    config = real_kube.core.read_namespaced_config_map(f"{job}-config", ns)
    (run / "job.toml").write_text(config.data["job.toml"])
    (tmp_path / "rank0.py").write_text(RANK0)
    gate = tmp_path / "gate"
    env = {
        **os.environ,
        "KUBECONFIG": str(kj.pod_kubeconfig(real_kube, pods[0], tmp_path / "pod0.kubeconfig")),
        "POD_NAME": pods[0].metadata.name,
        "RANK": "0",
        "TRAINMASTER_PUBLISH_S": "0.2",
        publish.METRICS_PORT_ENV: str(port := free_port()),
    }
    command = [sys.executable, str(tmp_path / "rank0.py"), str(run), str(gate)]
    publisher = subprocess.Popen(
        [sys.executable, "-m", PUBLISH, "--run", str(run), "--job", job, "--namespace", ns]
        + ["--", *command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        running = real_kube.wait_for(
            lambda: (s := kj.status(real_kube, ns, handle))["step"] == 3 and s,
            60,
            "status to show step 3",
        )
        assert running["phase"] == "running"
        steps = tomllib.loads(config.data["job.toml"])["train"]["max_steps"]  # the trainer's
        assert (running["loss"], running["seq_per_s"], running["max_steps"]) == (4.5, 103.0, steps)
        assert running["progress"] == pytest.approx(3 / steps) and running["eta_s"] is not None
        assert running["cost_so_far_usd"] > 0  # 2 x trn1.32xlarge at the catalog's price
        line = f"step 3/{steps}  loss 4.5  seq_per_s 103"
        assert any(n.startswith(line) for n in running["notes"]), running["notes"]
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert f'trainmaster_step{{job_name="{job}",rank="0"}} 3.0' in scraped.decode()
        listed = {j["job"]: j for j in kj.statuses(real_kube, ns)}
        assert listed[job]["step"] == 3 and listed[job]["loss"] == 4.5

        # the pod's own token writes nothing but its own job's progress
        for name, data in ((f"{job}-config", {"job.toml": "x"}), (f"{job}-progress", {"x": "y"})):
            with pytest.raises(ApiException) as refused:
                pod_api(real_kube, env["KUBECONFIG"]).patch_namespaced_config_map(
                    name, ns, {"data": data}
                )
            assert refused.value.status in (403, 422), refused.value

        gate.touch()
        out, _ = publisher.communicate(timeout=60)
        assert publisher.returncode == 0, out
    finally:  # on a failure too: the stand-in ends at the gate, then its publisher
        gate.touch()
        try:
            publisher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            publisher.kill()
            publisher.wait()
    for pod in pods:  # the containers end; Volcano completes the job
        kj.fail_pod(real_kube, ns, pod.metadata.name, exit_code=0)
    done = real_kube.wait_for(
        lambda: (s := kj.status(real_kube, ns, handle))["phase"] == "succeeded" and s,
        60,
        "the job to complete",
    )
    assert done["summary"] == {"status": "completed", "restarts": 0}
    assert done["step"] == 3 and done["eta_s"] is None
    assert any(n == "summary: completed" for n in done["notes"])


def pod_api(kube: RealKube, kubeconfig: str) -> Any:
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=kubeconfig)
    return client.CoreV1Api(api)
