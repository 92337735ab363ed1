"""What `status` takes from the progress record rank 0's pod publishes (publish.py, status.py):
the restarts, counted as the local backend counts them, and the pod holding rank 0, without
reading the pods' logs; the logs only where no record names a pod of this attempt, and then
only their head.

The record is made the way a pod makes it: publish.Publisher reading a run folder as rank 0
leaves it (rank0.json, timeline.jsonl) and patching it into the fake API server's ConfigMap.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from tests.backends.kubernetes.fake_api import FakeCluster
from tests.backends.kubernetes.test_client import NS, calls, job_labels, objs
from trainmaster.backends.base import JobStatus
from trainmaster.backends.kubernetes import jobs as kubernetes
from trainmaster.backends.kubernetes import publish, status
from trainmaster.backends.kubernetes.backend import KubernetesBackend, KubernetesOptions
from trainmaster.backends.kubernetes.pod_script import ENV_JOB_VERSION
from trainmaster.backends.local.backend import LocalBackend, LocalOptions
from trainmaster.monitor.progress import RunProgress
from trainmaster.run import goodput, state
from trainmaster.storage import RunPaths

JOB = "bert-large-trn1"
POD0, POD1 = f"{JOB}-worker-0", f"{JOB}-worker-1"
STARTED = "2026-12-04T12:00:00Z"  # the pods' status.startTime (this attempt's pods)
T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC).timestamp()


def run_folder(root: Path, starts: int, rank0_pod: str, rank0_at: float) -> RunPaths:
    """A run folder whose rank 0 trainer started `starts` times (one start event each, as
    train/trainsetup.py records it) and whose rank0.json names rank0_pod, written at rank0_at."""
    run = RunPaths(root / "runs" / JOB)
    run.dir.mkdir(parents=True)
    for i in range(starts):
        goodput.record(run.timeline, "start", t=T0 + 10 + 60 * i, step=10 * i, compiles=False)
    run.rank0.write_text(json.dumps({"pod": rank0_pod, "node_rank": 1, "started_at": rank0_at}))
    return run


def volcano_job(fake: FakeCluster, cluster: kubernetes.Cluster, retries: int = 0) -> None:
    """The job running on two pods of its attempt `retries` (Volcano bumps retryCount and the
    job version at every RestartJob); worker-0's log has the trainer's rank 0 line."""
    kubernetes.submit(cluster, objs())
    fake.jobs[(NS, JOB)]["status"] = {
        "state": {"phase": "Running"},
        "retryCount": retries,
        "version": retries,
        "running": 2,
    }
    for pod, log in ((POD0, [f"[default0]:trainmaster: rank 0 on pod {POD0}"]), (POD1, [])):
        fake.add_pod(NS, pod, job_labels(JOB), log=["[default0]:starting", *log])
        fake.pods[(NS, pod)]["status"]["startTime"] = STARTED


def published(run: RunPaths, cluster: kubernetes.Cluster, pod: str, attempt: int = 0) -> None:
    """What the pod's publisher does every PUBLISH_S (its attempt from the pod's job version)."""
    assert publish.Publisher(run, JOB, pod, lambda: cluster, attempt).once()


def k8s_status(fake: FakeCluster) -> JobStatus:
    opts = KubernetesOptions(kubeconfig=str(fake.kubeconfig()), namespace=NS)
    return KubernetesBackend(opts).status(JOB)


def test_a_torchrun_restart_inside_rank_0s_pod_is_a_restart(
    fake: FakeCluster, cluster: kubernetes.Cluster, tmp_path: Path
) -> None:
    """No Volcano retry, but torchrun restarted the workers once (--max-restarts): rank 0's
    trainer started twice. Volcano's retryCount says 0; `status` says 1."""
    volcano_job(fake, cluster, retries=0)
    run = run_folder(tmp_path, starts=2, rank0_pod=POD1, rank0_at=T0 + 70)
    published(run, cluster, POD1)
    st = k8s_status(fake)
    assert (st.restarts, st.job_retries) == (1, 0)
    assert st.to_json()["restarts"] == 1
    assert st.notes[0].endswith("restarts 1")


def test_restarts_mean_the_same_on_both_backends(
    fake: FakeCluster, cluster: kubernetes.Cluster, tmp_path: Path
) -> None:
    """Two torchrun restarts and one whole-gang restart (Volcano's RestartJob; locally the
    launcher's job retry): rank 0 started 4 times. Both backends say restarts 3, job retries 1,
    from the same run folder through the same functions (run/counters.py)."""
    run = run_folder(tmp_path, starts=4, rank0_pod=POD1, rank0_at=T0 + 190)
    rows = [{"step": s, "loss": 9.0 - s, "seq_per_s": 50.0, "note": float("nan")} for s in (1, 2)]
    run.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    volcano_job(fake, cluster, retries=1)
    published(run, cluster, POD1, attempt=publish.attempt({ENV_JOB_VERSION: "1"}))
    k8s = k8s_status(fake)
    state.write(run.state, state.RunState(job=JOB, phase="running", started_at=T0, job_retries=1))
    local = LocalBackend(LocalOptions(storage=str(tmp_path))).status(JOB)
    for st in (k8s, local):
        assert (st.restarts, st.job_retries) == (3, 1), st
        assert any(n.endswith("restarts 3") for n in st.notes), st.notes
    assert k8s.details["job retries"] == "1" and "restarts" not in k8s.details
    # the rest of what the record fills, mapped once (progress.status_fields) for both
    same = ("step", "loss", "seq_per_s", "metrics", "preemptions", "hangs", "summary")
    assert [getattr(k8s, f) for f in same] == [getattr(local, f) for f in same]
    assert (k8s.step, k8s.metrics) == (2, {"step": 2, "loss": 7.0, "seq_per_s": 50.0})


def test_rank_0s_pod_comes_from_the_record_without_reading_logs(
    fake: FakeCluster, cluster: kubernetes.Cluster, tmp_path: Path
) -> None:
    volcano_job(fake, cluster)
    run = run_folder(tmp_path, starts=1, rank0_pod=POD1, rank0_at=T0 + 10)
    published(run, cluster, POD1)
    assert kubernetes.status(cluster, JOB).rank0_pod == POD1  # not worker-0, whose log claims it
    st = k8s_status(fake)
    assert [n.name for n in st.nodes if n.rank0] == [POD1]
    assert calls(fake, "GET", "/log") == []
    pod, lines = kubernetes.logs(cluster, JOB)  # `logs` shows rank 0's pod: one log read, its
    assert pod == POD1 and list(lines) == ["[default0]:starting\n"]
    assert [r[1] for r in calls(fake, "GET", "/log")] == [
        f"/api/v1/namespaces/{NS}/pods/{POD1}/log"
    ]


def test_an_earlier_attempts_claim_is_not_taken_and_the_logs_are_read_only_at_their_head(
    fake: FakeCluster, cluster: kubernetes.Cluster, tmp_path: Path
) -> None:
    """Volcano restarted the gang: the pods have the same names, and the record still names
    the pod rank 0 held before (rank0.json older than that pod). Until the new rank 0
    publishes, status falls back to the logs, RANK0_SCAN_BYTES of each."""
    volcano_job(fake, cluster, retries=1)
    run = run_folder(tmp_path, starts=1, rank0_pod=POD1, rank0_at=T0 - 100)
    published(run, cluster, POD1, attempt=1)
    assert kubernetes.status(cluster, JOB).rank0_pod == POD0
    reads = calls(fake, "GET", "/log")
    assert len(reads) == 2 and status.RANK0_SCAN_BYTES <= 1 << 20
    assert all(r[2]["limitBytes"] == [str(status.RANK0_SCAN_BYTES)] for r in reads)


def test_a_record_that_names_no_pod_falls_back_to_the_logs(
    fake: FakeCluster, cluster: kubernetes.Cluster
) -> None:
    """Pod 0 publishes before rank 0 wrote rank0.json; a record of an older version has no
    rank0 fields at all: both read as no claim."""
    volcano_job(fake, cluster)
    infos = kubernetes.pods(cluster, JOB)
    old = RunProgress.from_json(json.dumps({"version": 1, "step": 3, "restarts": 0}))
    assert old is not None and old.rank0_pod is None
    for record in (RunProgress(step=1), old):
        assert status.claimed_rank0(infos, record) is None
    assert status.claimed_rank0(infos, RunProgress(rank0_pod=POD1, rank0_at=T0 + 1)) == POD1
    assert status.claimed_rank0(infos, RunProgress(rank0_pod="elsewhere-0", rank0_at=T0)) is None
