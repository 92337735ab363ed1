"""The client layer through the real `kubernetes` client against the in-process fake API."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.backends.kubernetes.fake_api import FakeCluster
from tests.backends.kubernetes.test_volcano import job_cfg
from trainmaster.backends.kubernetes import jobs as kubernetes
from trainmaster.backends.kubernetes import volcano
from trainmaster.errors import UserError

NS = "default"


def objs(case: str = "trn1-32xl", extra: list[str] | None = None) -> list[dict[str, Any]]:
    return volcano.objects(job_cfg(case, extra))


def job_labels(name: str) -> dict[str, str]:
    return volcano.labels(name, "train") | {"volcano.sh/job-name": name}


def calls(
    fake: FakeCluster, method: str, fragment: str
) -> list[tuple[str, str, dict[str, list[str]], Any]]:
    return [r for r in fake.requests if r[0] == method and fragment in r[1]]


# --- connecting -------------------------------------------------------------------------------
def test_connect_errors_and_namespace(fake: FakeCluster, tmp_path: Path) -> None:
    with pytest.raises(
        UserError, match=r"--kubeconfig: no kubeconfig at .*aws eks update-kubeconfig"
    ):
        kubernetes.connect(str(tmp_path / "missing"))
    with pytest.raises(UserError, match=r"--context: no context 'prod' .*contexts: fake, other"):
        kubernetes.connect(str(fake.kubeconfig()), context="prod")
    assert kubernetes.connect(str(fake.kubeconfig(namespace="ml"))).namespace == "ml"
    assert kubernetes.connect(str(fake.kubeconfig(namespace="ml")), namespace="x").namespace == "x"
    assert kubernetes.connect(str(fake.kubeconfig()), context="other").context == "other"


def test_unreachable_api_server(fake: FakeCluster) -> None:
    cluster = kubernetes.connect(str(fake.kubeconfig()))
    fake.close()
    cluster.api.configuration.retries = 0
    with pytest.raises(UserError, match="cannot reach the API server at http://127.0.0.1"):
        kubernetes.list_jobs(cluster)


# --- submit -----------------------------------------------------------------------------------
def test_submit_creates_configmap_then_job(fake: FakeCluster, cluster: kubernetes.Cluster) -> None:
    cm, progress, job = objs()
    created = kubernetes.submit(cluster, [cm, progress, job])
    stored = fake.jobs[(NS, "bert-large-trn1")]
    assert stored["spec"] == job["spec"] and created["metadata"]["uid"] == stored["metadata"]["uid"]
    assert fake.configmaps[(NS, "bert-large-trn1-config")]["data"] == cm["data"]
    assert fake.configmaps[(NS, "bert-large-trn1-progress")]["data"] == {"progress.json": ""}
    order = [r[1].rsplit("/", 1)[-1] for r in fake.requests if r[0] == "POST"]
    assert order == ["configmaps", "configmaps", "jobs"]
    assert all(r[2].get("fieldValidation") == ["Strict"] for r in fake.requests if r[0] == "POST")
    for name in ("bert-large-trn1-config", "bert-large-trn1-progress"):  # both go with the job
        owner = fake.configmaps[(NS, name)]["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "Job" and owner["uid"] == stored["metadata"]["uid"]


def test_server_dry_run_persists_nothing(fake: FakeCluster, cluster: kubernetes.Cluster) -> None:
    kubernetes.submit(cluster, objs(), dry_run=True)
    posts = [r for r in fake.requests if r[0] == "POST"]
    assert len(posts) == 3 and all(r[2].get("dryRun") == ["All"] for r in posts)
    assert not fake.jobs and not fake.configmaps and not calls(fake, "PATCH", "")


def test_name_clash_is_a_clear_error(fake: FakeCluster, cluster: kubernetes.Cluster) -> None:
    kubernetes.submit(cluster, objs())
    before = json.dumps(list(fake.configmaps.values()), sort_keys=True)
    with pytest.raises(UserError) as err:
        kubernetes.submit(cluster, objs(extra=["train.lr=1e-4"]))
    assert str(err.value) == (
        "job.name: job bert-large-trn1 exists in namespace default; cancel it "
        "(`trainmaster cancel bert-large-trn1`) or choose another job.name"
    )
    assert (
        json.dumps(list(fake.configmaps.values()), sort_keys=True) == before
    )  # the running job's file is untouched


def test_leftover_configmap_is_replaced(fake: FakeCluster, cluster: kubernetes.Cluster) -> None:
    cm, progress, job = objs()
    stale = json.loads(json.dumps(cm))
    stale["data"]["job.toml"] = "# stale\n"
    fake.configmaps[(NS, cm["metadata"]["name"])] = stale
    kubernetes.submit(cluster, [cm, progress, job])
    assert fake.configmaps[(NS, cm["metadata"]["name"])]["data"] == cm["data"]
    assert (NS, "bert-large-trn1") in fake.jobs


def test_401(fake: FakeCluster) -> None:
    cluster = kubernetes.connect(str(fake.kubeconfig(token="expired")))
    with pytest.raises(UserError, match=r"401 Unauthorized.*aws eks update-kubeconfig"):
        kubernetes.submit(cluster, objs())
    with pytest.raises(UserError, match="401"):
        kubernetes.status(cluster, "bert-large-trn1")


def test_403_names_verb_and_resource_and_cleans_up(
    fake: FakeCluster, cluster: kubernetes.Cluster
) -> None:
    fake.forbid.add(("create", "jobs"))
    with pytest.raises(UserError) as err:
        kubernetes.submit(cluster, objs())
    msg = str(err.value)
    assert "not allowed to create jobs.batch.volcano.sh in namespace default (403 Forbidden" in msg
    assert (
        'User "tester" cannot create resource "jobs"' in msg
        and "grants create on jobs.batch.volcano.sh" in msg
    )
    assert not fake.configmaps and calls(fake, "DELETE", "configmaps/bert-large-trn1-config")
    assert calls(fake, "DELETE", "configmaps/bert-large-trn1-progress")


def test_403_on_logs(fake: FakeCluster, cluster: kubernetes.Cluster) -> None:
    kubernetes.submit(cluster, objs())
    fake.add_pod(NS, "bert-large-trn1-worker-0", job_labels("bert-large-trn1"), log=["hello"])
    fake.forbid.add(("get", "pods/log"))
    with pytest.raises(UserError, match="not allowed to read log of pods in namespace default"):
        _, lines = kubernetes.logs(cluster, "bert-large-trn1", node=0)


def test_admission_webhook_refusal(fake: FakeCluster, cluster: kubernetes.Cluster) -> None:
    fake.deny_jobs = (
        'unable to find job queue: queues.scheduling.volcano.sh "trainmaster" not found'
    )
    with pytest.raises(UserError, match=r"Volcano refused the job: .*queue.*not found.*cluster up"):
        kubernetes.submit(cluster, objs())
    assert not fake.configmaps


def test_volcano_missing(fake: FakeCluster, cluster: kubernetes.Cluster) -> None:
    fake.volcano_installed = False
    with pytest.raises(UserError, match="no jobs.batch.volcano.sh .*is Volcano installed"):
        kubernetes.submit(cluster, objs())
    with pytest.raises(UserError, match="is Volcano installed"):
        kubernetes.list_jobs(cluster)


# --- status, logs, rank 0 -----------------------------------------------------------------------
def running_job(
    fake: FakeCluster, cluster: kubernetes.Cluster, name: str = "bert-large-trn1"
) -> None:
    kubernetes.submit(cluster, objs())
    fake.jobs[(NS, name)]["status"] = {"state": {"phase": "Running"}, "retryCount": 1, "running": 2}
    fake.add_pod(
        NS, f"{name}-worker-0", job_labels(name), log=["[default0]:starting", "[default0]:step 1"]
    )
    fake.add_pod(
        NS,
        f"{name}-worker-1",
        job_labels(name),
        log=[
            "[default0]:starting",
            f"[default0]:trainmaster: rank 0 on pod {name}-worker-1",
            "[default0]:step 1 loss 11.2",
        ],
    )
    fake.add_pod(NS, "someone-else-0", {"app": "x"})


def test_status(fake: FakeCluster, cluster: kubernetes.Cluster) -> None:
    running_job(fake, cluster)
    st = kubernetes.status(cluster, "bert-large-trn1")
    assert (st.phase, st.volcano_phase, st.retries, st.replicas, st.min_available) == (
        "running",
        "Running",
        1,
        2,
        2,
    )
    assert [(p.name, p.index, p.phase) for p in st.pods] == [
        ("bert-large-trn1-worker-0", 0, "Running"),
        ("bert-large-trn1-worker-1", 1, "Running"),
    ]
    assert st.rank0_pod == "bert-large-trn1-worker-1"
    assert st.storage == "/data" and len(st.config_hash) == 16
    run = kubernetes.as_run_state(st)
    assert (
        run.backend == "kubernetes"
        and run.phase == "running"
        and [n.log for n in run.nodes] == ["bert-large-trn1-worker-0", "bert-large-trn1-worker-1"]
    )
    fake.jobs[(NS, "bert-large-trn1")]["status"]["state"]["phase"] = "Completed"
    assert kubernetes.status(cluster, "bert-large-trn1", find_rank0=False).phase == "succeeded"


def test_rank0_moves_after_a_restart(fake: FakeCluster, cluster: kubernetes.Cluster) -> None:
    running_job(fake, cluster)
    # torchrun restarted the workers and the new rendezvous made worker-0 rank 0 (a later line).
    fake.append_log(
        NS,
        "bert-large-trn1-worker-0",
        "[default0]:trainmaster: rank 0 on pod bert-large-trn1-worker-0",
    )
    assert kubernetes.status(cluster, "bert-large-trn1").rank0_pod == "bert-large-trn1-worker-0"
    # A line naming another pod (e.g. echoed into this log) does not count.
    fake.add_pod(
        NS,
        "bert-large-trn1-worker-2",
        job_labels("bert-large-trn1"),
        log=["[default0]:trainmaster: rank 0 on pod bert-large-trn1-worker-9"],
    )
    assert kubernetes.status(cluster, "bert-large-trn1").rank0_pod == "bert-large-trn1-worker-0"
    assert all(r[2]["timestamps"][0] in ("true", "True") for r in calls(fake, "GET", "/log"))


def test_404_names_job_and_namespace(fake: FakeCluster, cluster: kubernetes.Cluster) -> None:
    with pytest.raises(UserError) as err:
        kubernetes.status(cluster, "nope")
    assert str(err.value) == "JOB: no job nope in namespace default"
    with pytest.raises(UserError, match="no job nope in namespace default"):
        kubernetes.cancel(cluster, "nope")
    with pytest.raises(UserError, match="no job nope in namespace default"):
        kubernetes.logs(cluster, "nope")


def test_logs_default_to_rank0(fake: FakeCluster, cluster: kubernetes.Cluster) -> None:
    running_job(fake, cluster)
    pod, lines = kubernetes.logs(cluster, "bert-large-trn1")
    assert pod == "bert-large-trn1-worker-1" and list(lines)[-1] == "[default0]:step 1 loss 11.2\n"
    pod, lines = kubernetes.logs(cluster, "bert-large-trn1", node=0, tail_lines=1)
    assert pod == "bert-large-trn1-worker-0" and list(lines) == ["[default0]:step 1\n"]
    with pytest.raises(UserError, match=r"--node: no pod bert-large-trn1-worker-5 \(pods: "):
        kubernetes.logs(cluster, "bert-large-trn1", node=5)


def test_logs_before_rank0_is_known_and_without_pods(
    fake: FakeCluster, cluster: kubernetes.Cluster
) -> None:
    kubernetes.submit(cluster, objs())
    with pytest.raises(UserError, match="has no pods yet"):
        kubernetes.logs(cluster, "bert-large-trn1")
    fake.add_pod(NS, "bert-large-trn1-worker-0", job_labels("bert-large-trn1"), log=["compiling"])
    assert kubernetes.logs(cluster, "bert-large-trn1")[0] == "bert-large-trn1-worker-0"


def test_follow_streams_lines_as_they_come(fake: FakeCluster, cluster: kubernetes.Cluster) -> None:
    running_job(fake, cluster)
    pod, lines = kubernetes.logs(cluster, "bert-large-trn1", follow=True)
    assert pod == "bert-large-trn1-worker-1"
    seen = [next(lines) for _ in range(3)]  # what is there already
    assert seen[-1] == "[default0]:step 1 loss 11.2\n"
    # New lines arrive while the client waits on the open stream; it ends when the pod ends.
    feeder = threading.Thread(
        target=lambda: [fake.append_log(NS, pod, f"[default0]:step {s}") for s in (2, 3)]
    )
    feeder.start()
    assert next(lines) == "[default0]:step 2\n" and next(lines) == "[default0]:step 3\n"
    feeder.join()
    fake.finish(NS, pod)
    assert list(lines) == []
    follow = calls(fake, "GET", f"pods/{pod}/log")[-1]
    assert follow[2]["follow"][0] in ("true", "True")


# --- cancel and list --------------------------------------------------------------------------
def test_cancel_deletes_job_foreground_and_its_configmap(
    fake: FakeCluster, cluster: kubernetes.Cluster
) -> None:
    kubernetes.submit(cluster, objs())
    kubernetes.cancel(cluster, "bert-large-trn1")
    delete = calls(fake, "DELETE", "jobs/bert-large-trn1")[0]
    assert delete[2].get("propagationPolicy") == ["Foreground"]
    assert not fake.jobs and not fake.configmaps
    with pytest.raises(UserError, match="no job bert-large-trn1"):
        kubernetes.status(cluster, "bert-large-trn1")


def test_list_only_our_jobs(fake: FakeCluster, cluster: kubernetes.Cluster) -> None:
    kubernetes.submit(cluster, objs())
    kubernetes.submit(cluster, objs("p5-48xl"))
    kubernetes.submit(cluster, volcano.objects(job_cfg("p5-48xl", ["kubernetes.namespace=ml"])))
    fake.jobs[(NS, "foreign")] = {
        "metadata": {"name": "foreign", "namespace": NS, "labels": {}},
        "spec": {},
    }
    fake.jobs[(NS, "bert-large-p5")]["status"] = {"state": {"phase": "Failed"}}
    jobs = {j.name: j for j in kubernetes.list_jobs(cluster)}
    assert set(jobs) == {"bert-large-trn1", "bert-large-p5"}
    assert (
        jobs["bert-large-p5"].phase,
        jobs["bert-large-trn1"].phase,
        jobs["bert-large-trn1"].nodes,
    ) == ("failed", "pending", 2)
    (listed,) = [c for c in calls(fake, "GET", "/jobs") if c[1].endswith("/jobs")]
    assert listed[2]["labelSelector"] == ["app.kubernetes.io/managed-by=trainmaster"]
    everywhere = {(j.namespace, j.name) for j in kubernetes.list_jobs(cluster, all_namespaces=True)}
    assert ("ml", "bert-large-p5") in everywhere and len(everywhere) == 3
