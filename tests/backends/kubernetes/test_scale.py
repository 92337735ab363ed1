"""Kubernetes at scale, simulated (docs/architecture.md 5: 15.2): the Volcano job for 512 and
1,024 trn1 nodes, and `status` of a 1,024-pod job through the fake API server, with paged lists.

Sizes, not times: how fast it goes is bench/k8s_scale.py's business (no wall-time asserts).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import yaml

from tests.backends.kubernetes.fake_api import FakeCluster
from tests.backends.kubernetes.schemas import (
    validate_k8s,
    validate_pod_templates,
    validate_volcano_job,
)
from tests.backends.kubernetes.test_client import NS, job_labels
from tests.backends.kubernetes.test_volcano import job_cfg
from trainmaster.backends.kubernetes import client as k8s_client
from trainmaster.backends.kubernetes import jobs as kubernetes
from trainmaster.backends.kubernetes import names as k8s_names
from trainmaster.backends.kubernetes import volcano
from trainmaster.errors import JobFailed

# etcd refuses a request over 1.5 MiB by default (--max-request-bytes; "System limits",
# https://etcd.io/docs/v3.5/dev-guide/limit/), and every object the API server stores is one
# etcd request; a ConfigMap's data may not exceed 1 MiB
# (https://kubernetes.io/docs/concepts/configuration/configmap/).
ETCD_REQUEST_LIMIT = 3 << 19  # 1.5 MiB
CONFIGMAP_LIMIT = 1 << 20
WORKERS = 32  # trn1.32xlarge: 32 NeuronCores, one worker each (the preset)


def scale_objects(nodes: int) -> list[dict[str, Any]]:
    """The tutorial's job (preset trn1-bert-large) on `nodes` nodes, micro-batch 16, accumulation 1."""
    return volcano.objects(
        job_cfg(
            "trn1-32xl", [f"job.nnodes={nodes}", f"train.global_batch_size={16 * WORKERS * nodes}"]
        )
    )


@pytest.mark.parametrize("nodes", [512, 1024])
def test_the_job_for_512_and_1024_nodes_is_valid_and_small(nodes: int) -> None:
    cm, _, job = scale_objects(nodes)
    validate_volcano_job(job)
    validate_pod_templates(job)
    validate_k8s(cm)
    assert k8s_names.webhook_problems(job) == []
    assert (
        job["spec"]["minAvailable"] == job["spec"]["tasks"][0]["replicas"] == nodes
    )  # the whole gang
    # One pod template for all nodes: the size does not grow with the node count.
    small_cm, _, small_job = scale_objects(2)
    for big, small in ((cm, small_cm), (job, small_job)):
        size = len(json.dumps(big).encode())
        assert size < ETCD_REQUEST_LIMIT and size - len(json.dumps(small).encode()) < 16
    assert len(cm["data"]["job.toml"].encode()) < CONFIGMAP_LIMIT
    assert len(volcano.render_yaml([cm, job]).encode()) < ETCD_REQUEST_LIMIT


def test_the_1024_node_job_is_accepted(fake: FakeCluster, cluster: kubernetes.Cluster) -> None:
    objs = scale_objects(1024)
    kubernetes.submit(cluster, objs, dry_run=True)
    sent = [r for r in fake.requests if r[0] == "POST"]
    assert [r[2]["dryRun"] for r in sent] == [["All"], ["All"], ["All"]]
    assert sent[-1][3]["spec"]["tasks"][0]["replicas"] == 1024
    assert yaml.safe_load(volcano.render_yaml(objs[2:]))["spec"] == objs[2]["spec"]


def add_pods(fake: FakeCluster, job: str, n: int, rank0: int | None = None) -> None:
    for i in range(n):
        pod = f"{job}-worker-{i}"
        log = ["compiling", f"trainmaster: rank 0 on pod {pod}"] if i == rank0 else ["compiling"]
        fake.add_pod(NS, pod, job_labels(job), log=log)


def pod_lists(fake: FakeCluster) -> list[tuple[dict[str, list[str]], int, int]]:
    """(query, HTTP status, items served) of every list of pods."""
    path = f"/api/v1/namespaces/{NS}/pods"
    queries = [r[2] for r in fake.requests if r[0] == "GET" and r[1] == path]
    pages = [(code, n) for p, code, n in fake.list_pages if p == path]
    return [(q, code, n) for q, (code, n) in zip(queries, pages, strict=True)]


def test_status_of_1024_pods_is_paged_and_in_node_order(
    fake: FakeCluster, cluster: kubernetes.Cluster
) -> None:
    kubernetes.submit(cluster, scale_objects(1024))
    add_pods(fake, "bert-large-trn1", 1024, rank0=777)
    st = kubernetes.status(cluster, "bert-large-trn1")
    assert len(st.pods) == st.replicas == 1024
    # The API lists by name (worker-0, worker-1, worker-10, worker-100, ...); status by node.
    assert [p.index for p in st.pods] == list(range(1024))
    assert all(
        p.name == f"bert-large-trn1-worker-{p.index}" and p.phase == "Running" for p in st.pods
    )
    assert st.rank0_pod == "bert-large-trn1-worker-777"
    lists = pod_lists(fake)
    assert [(code, n) for _, code, n in lists] == [
        (200, 500),
        (200, 500),
        (200, 24),
    ]  # none over the limit
    assert all(q["limit"] == [str(k8s_client.PAGE)] for q, _, _ in lists)
    assert ["continue" in q for q, _, _ in lists] == [False, True, True]
    # Each pod's log read once (rank 0 is looked for in all of them): n requests, not n^2.
    logs = [r for r in fake.requests if r[1].endswith("/log")]
    assert len(logs) == 1024 and len({r[1] for r in logs}) == 1024


def test_logs_are_read_concurrently_for_rank0(
    fake: FakeCluster, cluster: kubernetes.Cluster
) -> None:
    """A log read returns only once 4 are in flight together: one after another, the barrier
    would break after its timeout instead."""
    kubernetes.submit(cluster, scale_objects(8))
    add_pods(fake, "bert-large-trn1", 8, rank0=5)
    fake.log_barrier = threading.Barrier(4)
    assert kubernetes.status(cluster, "bert-large-trn1").rank0_pod == "bert-large-trn1-worker-5"
    assert (
        not fake.log_barrier.broken
        and len([r for r in fake.requests if r[1].endswith("/log")]) == 8
    )


def test_short_pages_and_an_expired_token(
    fake: FakeCluster, cluster: kubernetes.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page may hold fewer items than the limit, even none, and a token may expire (410 Gone):
    the list goes on to the end, and starts over once after an expiry."""
    monkeypatch.setattr(k8s_client, "PAGE", 50)
    kubernetes.submit(cluster, scale_objects(128))
    add_pods(fake, "bert-large-trn1", 128)
    add_pods(fake, "another", 300)  # listed before ours (key order), filtered out by the selector
    fake.short_pages = True
    fake.expire_continues = 1
    pods = kubernetes.pods(cluster, "bert-large-trn1")
    assert [p.index for p in pods] == list(range(128))
    lists = pod_lists(fake)
    assert all(n <= 50 for _, _, n in lists) and (200, 0) in [
        (c, n) for _, c, n in lists
    ]  # empty pages
    assert [code for _, code, _ in lists].count(410) == 1
    starts = [i for i, (q, _, _) in enumerate(lists) if "continue" not in q]
    assert len(starts) == 2 and lists[starts[1] - 1][1] == 410  # the first try; again after the 410
    assert (
        sum(n for _, _, n in lists[starts[1] :]) == 128
    )  # the second try alone saw every pod once
    fake.expire_continues = 2  # expired again on the fresh start: a clear error, no loop
    with pytest.raises(JobFailed, match="list pods failed: 410"):
        kubernetes.pods(cluster, "bert-large-trn1")


def test_list_jobs_is_paged(
    fake: FakeCluster, cluster: kubernetes.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(k8s_client, "PAGE", 5)
    *_, job = scale_objects(2)
    for i in range(12):
        ns = NS if i % 3 else "ml"
        fake.jobs[(ns, f"job-{i:02d}")] = job | {
            "metadata": job["metadata"]
            | {
                "name": f"job-{i:02d}",
                "namespace": ns,
                "creationTimestamp": f"2026-01-01T00:00:{i:02d}Z",
            }
        }
    assert [j.name for j in kubernetes.list_jobs(cluster)] == [
        f"job-{i:02d}" for i in (11, 10, 8, 7, 5, 4, 2, 1)
    ]
    everywhere = kubernetes.list_jobs(cluster, all_namespaces=True)
    assert len(everywhere) == 12 and everywhere[0].name == "job-11"
    pages = [n for path, code, n in fake.list_pages if path.endswith("/jobs")]
    assert pages == [5, 3, 5, 5, 2]  # 8 in default, then 12 across namespaces, 5 at a time
