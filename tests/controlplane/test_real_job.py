"""The tutorial's job, shrunk, trains in containers on real nodes and survives losing one.

On the `real_nodes` plane (three real nodes, each holding the CPU training image built from
`cluster plan`'s Dockerfile): the plan's add-ons as `cluster up` lays them (etcd behind its
Service and the node watcher, each a Deployment in a container, on the system node), the
pydoc shards on the claim, then `trainmaster launch --backend kubernetes` of bert-tiny on 2
nodes with the etcd rendezvous (controlplane/kube_job.py). After a complete checkpoint one
training node is killed (never real-6, the system node) (kubelet, containerd and containers SIGKILLed, its network gone:
controlplane/kube_job_loss.py); the job must come back on the spare from that checkpoint and
finish, with trainmaster's defaults: the surviving node notices first (run/peers.py) and the
node watcher lets the lost pod go when its kubelet's lease is stale. Then
the job again, and the node under one of its pods given a Spot notice as AWS Node Termination
Handler gives it (tainted, cordoned, its pods evicted): the trainer saves its current step and
leaves inside the notice, and the restart avoids that node.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import run_cli
from tests.controlplane.conftest import controlplane_module
from tests.controlplane.realnodes import RealNodes

pytestmark = [pytest.mark.realnodes, pytest.mark.timeout(1800)]
kube_job = controlplane_module("kube_job")
kube_job_loss = controlplane_module("kube_job_loss")
STEPS, EVERY = 60, 10
POOL = ["real-4", "real-5", "real-6"]  # 2 nodes and a spare; real-6 the system node


@pytest.fixture(scope="module")
def lost_node_run(real_nodes: RealNodes) -> dict[str, Any]:
    if real_nodes.image is None:
        pytest.skip("no training image: buildah and debootstrap are needed to build it")
    kubeconfig, run_dir = real_nodes.run_dir / "kubeconfig", real_nodes.run_dir
    pool = POOL  # not the nodes test_real_nodes.py uses (and loses), whichever runs first
    kube_job.setup(kubeconfig, run_dir, real_nodes.image, pool)
    sets = kube_job.job_sets(real_nodes.image, "tiny-real", STEPS, EVERY)
    return dict(kube_job_loss.run(kubeconfig, run_dir, sets, pool[-1]))


def test_the_job_trains_in_containers_and_status_follows_it(
    real_nodes: RealNodes, lost_node_run: dict[str, Any]
) -> None:
    """Before the loss: both pods on real nodes, rank 0's publisher gives status its step,
    loss and ETA, and the trainer's files are on the claim."""
    before, running = lost_node_run["pods_before"], lost_node_run["running"]
    real = {n["name"] for n in real_nodes.state["real_nodes"]}
    assert len(before) == 2 and {p["node"] for p in before} <= real & set(POOL)
    assert len({p["node"] for p in before}) == 2  # one pod a node: the gang's spread
    assert running["phase"] == "running" and running["step"] >= running["last_checkpoint"] >= EVERY
    assert running["loss"] is not None and running["eta_s"] is not None
    assert sum(1 for n in running["nodes"] if n["rank0"]) == 1
    starts = [e for e in lost_node_run["timeline"] if e["event"] == "start"]
    assert starts and starts[0]["step"] in (0, None)  # the first process started afresh


def test_a_lost_node_ends_in_succeeded_resumed_from_a_checkpoint_elsewhere(
    real_nodes: RealNodes, lost_node_run: dict[str, Any]
) -> None:
    final, victim = lost_node_run["final"], lost_node_run["victim"]
    assert final["phase"] == "succeeded", json.dumps(final, indent=1)
    assert final["step"] == final["max_steps"] == STEPS
    assert final["job_retries"] == 1 and final["restarts"] == 1  # one restart, the gang's
    after = lost_node_run["pods_after"]
    assert after and all(p["node"] != victim for p in after)  # never placed on the lost node
    assert {p["uid"] for p in after}.isdisjoint(p["uid"] for p in lost_node_run["pods_before"])
    # the restarted trainer resumed from a complete checkpoint at or before the kill's step
    starts = [e for e in lost_node_run["timeline"] if e["event"] == "start"]
    resumed = starts[-1]["step"]
    assert len(starts) >= 2 and resumed and resumed % EVERY == 0
    assert lost_node_run["running"]["last_checkpoint"] <= resumed < STEPS
    summary = json.loads(
        (real_nodes.run_dir / "fsx" / "runs" / "tiny-real" / "summary.json").read_text()
    )
    assert summary["status"] == "completed" and summary["resumed_from"] == resumed
    assert summary["steps"] == STEPS and summary["ranks_agree"]
    phases = lost_node_run["phases"]
    assert phases["loss_to_first_new_step_s"] and phases["loss_to_first_new_step_s"] > 0


def test_the_job_notices_the_lost_node_first_and_the_watcher_lets_its_pod_go(
    real_nodes: RealNodes, lost_node_run: dict[str, Any]
) -> None:
    """With the defaults: the surviving node's peer watch saw the lost node's heartbeat stop
    (its record in hangs.jsonl) before the node controller said NotReady, and its pod ended, so
    Volcano restarted the gang; the node watcher let the lost node's pod go once its kubelet's
    lease was stale (its mark's detail says so), not after the toleration."""
    noticed = lost_node_run["peer_lost"]
    assert noticed is not None and lost_node_run["noticed_by"] == "peers", lost_node_run["phases"]
    assert "heartbeat stopped" in noticed["where"]
    node = real_nodes.core.read_node(lost_node_run["victim"])
    detail = (node.metadata.annotations or {}).get("trainmaster.io/unhealthy-detail", "")
    assert "kubelet silent" in detail and "given up by its job" in detail, detail


def test_logs_follow_rank_0_and_report_reads_the_claim(
    real_nodes: RealNodes, lost_node_run: dict[str, Any]
) -> None:
    kubeconfig = str(real_nodes.run_dir / "kubeconfig")
    logs = run_cli("--kubeconfig", kubeconfig, "logs", lost_node_run["handle"], timeout=120)
    assert logs.returncode == 0, logs.stderr
    assert f"step {STEPS} loss" in logs.stdout  # rank 0's container, through its kubelet
    resumed = [e for e in lost_node_run["timeline"] if e["event"] == "start"][-1]["step"]
    assert f"resumed from step {resumed} " in logs.stdout  # the restarted rank 0's, not the first
    storage = str(real_nodes.run_dir / "fsx")
    report = run_cli("--storage", storage, "report", "tiny-real", timeout=120)
    assert report.returncode == 0, report.stderr
    assert "tiny-real" in report.stdout


# The taint AWS Node Termination Handler puts on a node whose Spot interruption notice came
# (its SpotInterruptionTaint); Karpenter's karpenter.sh/disrupted and EKS's own drain of a Spot
# managed node end the same way: a cordon, then every pod evicted through the Eviction API.
SPOT_NOTICE_TAINT = {"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}
NOTICE_S = 120  # EC2 reclaims a Spot instance two minutes after its notice


@pytest.fixture(scope="module")
def noticed_node_run(
    real_nodes: RealNodes, lost_node_run: dict[str, Any]
) -> Iterator[dict[str, Any]]:
    """The job again (after lost_node_run: module order) on what is left of POOL plus real-1 as
    the spare, and the node under one of its pods given a Spot notice as AWS Node Termination
    Handler gives it: the node tainted and cordoned, then its pods evicted (`kubectl drain`).
    The kubelet sends SIGTERM and gives the pod kubernetes.stop_grace_s (90 s) before SIGKILL."""
    from kubernetes import client

    kubeconfig, run_dir = real_nodes.run_dir / "kubeconfig", real_nodes.run_dir
    live = set(kube_job.live_nodes(run_dir))
    pool = ["real-1", *(n for n in POOL if n in live)]  # the last stays the system node
    kube_job.setup(kubeconfig, run_dir, real_nodes.image, pool)
    sets = kube_job.job_sets(real_nodes.image, "tiny-notice", STEPS, EVERY)
    noticed: list[tuple[str, float]] = []

    def notice(node: str) -> None:
        noticed.append((node, time.time()))
        taints = real_nodes.core.read_node(node).spec.taints or []
        body = {"spec": {"unschedulable": True, "taints": [*taints, SPOT_NOTICE_TAINT]}}
        real_nodes.core.patch_node(node, body)
        for pod in kube_job.pods(kubeconfig, "tiny-notice"):
            if pod.spec.node_name == node:
                meta = client.V1ObjectMeta(name=pod.metadata.name, namespace=kube_job.NAMESPACE)
                real_nodes.core.create_namespaced_pod_eviction(
                    pod.metadata.name, kube_job.NAMESPACE, client.V1Eviction(metadata=meta)
                )

    try:
        out = kube_job_loss.run(kubeconfig, run_dir, sets, pool[-1], kill=notice)
    finally:  # the node back to the tests after this (elastic_run, test_real_nodes.py)
        for node, _ in noticed:
            taints = real_nodes.core.read_node(node).spec.taints or []
            kept = [x for x in taints if x.key != SPOT_NOTICE_TAINT["key"]]
            real_nodes.core.patch_node(node, {"spec": {"unschedulable": False, "taints": kept}})
    yield dict(out, noticed_at=noticed[0][1])


def test_a_node_given_notice_is_left_with_a_fresh_checkpoint_before_the_notice_ends(
    real_nodes: RealNodes, noticed_node_run: dict[str, Any]
) -> None:
    run = noticed_node_run
    final = run["final"]
    assert final["phase"] == "succeeded", json.dumps(final, indent=1)
    assert final["step"] == STEPS and final["preemptions"] == 1
    folder = real_nodes.run_dir / "fsx" / "runs" / "tiny-notice"
    lines = [json.loads(x) for x in (folder / "preemptions.jsonl").read_text().splitlines()]
    assert len(lines) == 1
    saved = lines[0]
    # the trainer checkpointed its current step and left well inside the notice, at a step
    # after the periodic checkpoint: only the step in flight is lost
    assert 0 < saved["t"] - run["noticed_at"] < NOTICE_S
    assert saved["step"] >= run["running"]["last_checkpoint"]
    starts = [e for e in run["timeline"] if e["event"] == "start"]
    assert len(starts) >= 2 and starts[-1]["step"] == saved["step"]
    # the restart avoided the node given notice: it is cordoned, as the handler leaves it
    assert run["victim"] and all(p["node"] != run["victim"] for p in run["pods_after"])


# 12 GiB a pod: two do not fit on one real node (23.4 GiB allocatable), so a lost node's pod
# has nowhere to go until a node joins the pool
ELASTIC_SETS = ["job.nnodes=3", "job.min_nnodes=2", "train.batch_size=8",
                "train.global_batch_size=48", "train.max_steps=5000",
                "kubernetes.memory_gib=12"]  # fmt: skip


@pytest.fixture(scope="module")
def elastic_run(real_nodes: RealNodes) -> Iterator[dict[str, Any]]:
    """An elastic job (3 nodes, at least 2) with no spare: one of its nodes killed, then a new
    node labelled into the pool (capacity that returns, as a node group's new instance). On the
    nodes left by the tests before it (module order): three for the job, one held back, the
    system node out of the pool; the node killed is one of POOL (test_real_nodes.py uses
    real-1..3)."""
    kubeconfig, run_dir = real_nodes.run_dir / "kubeconfig", real_nodes.run_dir
    system = POOL[-1]
    # schedulable and untainted: the node the notice test gave back may keep the node
    # controller's unschedulable taint a few seconds after its uncordon
    passing = {"node.kubernetes.io/unschedulable"}
    ready = [
        n.metadata.name
        for n in real_nodes.core.list_node().items
        if not n.spec.unschedulable
        and all(t.key in passing for t in n.spec.taints or [])
        and n.metadata.name != system
    ]
    live = [n for n in kube_job.live_nodes(run_dir) if n in ready]
    victims = [n for n in POOL[:-1] if n in live]
    others = [n for n in live if n not in POOL]
    if not victims or len(others) < 3:
        pytest.skip(f"an elastic job here needs 4 free real nodes, one of {POOL[:-1]}: {live}")
    victim, returning = victims[0], others[2]
    training = [others[0], others[1], victim]
    kube_job.setup(kubeconfig, run_dir, real_nodes.image, [*training, system])
    for node in (system, returning):  # the job's pods may land on the three alone
        real_nodes.core.patch_node(node, {"metadata": {"labels": {kube_job.POOL_LABEL[0]: None}}})
    sets = kube_job.job_sets(real_nodes.image, "tiny-elastic", 5000, EVERY) + ELASTIC_SETS
    handle = kube_job.launch(kubeconfig, run_dir, sets)
    rows = lambda: kube_job.metrics_rows(run_dir, "tiny-elastic")  # noqa: E731
    out: dict[str, Any] = {"handle": handle, "victim": victim, "returning": returning}
    try:
        kube_job.wait_for(
            lambda: (s := kube_job.status(kubeconfig, handle)).get("last_checkpoint") and s,
            600, "a complete checkpoint on 3 nodes", every=2,
        )  # fmt: skip
        kill_step = rows()[-1]["step"]
        out["pods_before"] = [
            kube_job_loss._placed(p) for p in kube_job.pods(kubeconfig, "tiny-elastic")
        ]
        kube_job_loss.kill_node(run_dir, victim)
        on_two = kube_job.wait_for(
            lambda: len([r for r in rows() if r["world"] == 2 and r["step"] > kill_step]) >= 5,
            600, "five steps on the 2 nodes left", every=2,
        )  # fmt: skip
        assert on_two
        out["two_seen_at_step"] = rows()[-1]["step"]
        real_nodes.core.patch_node(returning, {"metadata": {"labels": dict([kube_job.POOL_LABEL])}})
        kube_job.wait_for(
            lambda: any(r["world"] == 3 and r["step"] > out["two_seen_at_step"] for r in rows()),
            900, "the job on 3 nodes again", every=3,
        )  # fmt: skip
        out["status"] = kube_job.wait_for(  # rank 0's pod publishes every 15 s
            lambda: (s := kube_job.status(kubeconfig, handle)).get("metrics", {}).get("world") == 3
            and s,
            120, "status to show the 3 nodes", every=3,
        )  # fmt: skip
        out["rows"], out["kill_step"] = rows(), kill_step
        out["pods"] = [kube_job_loss._placed(p) for p in kube_job.pods(kubeconfig, "tiny-elastic")]
        yield out
    finally:
        kube_job.tm(kubeconfig, "cancel", handle, check=False)
        kube_job.wait_for(
            lambda: not kube_job.pods(kubeconfig, "tiny-elastic"),
            300,
            "the elastic job's pods gone",
        )
        real_nodes.core.patch_node(
            returning, {"metadata": {"labels": {kube_job.POOL_LABEL[0]: None}}}
        )


def test_an_elastic_job_trains_on_the_survivors_and_takes_a_node_back(
    real_nodes: RealNodes, elastic_run: dict[str, Any]
) -> None:
    """world 3 -> 2 after the kill, without a spare and without a restart of the gang, the
    global batch kept (48 = 8 x 2 x 3 = 8 x 3 x 2) -> 3 once a node can take the replaced pod;
    status shows the world size and the batch of the newest step."""
    rows, kill = elastic_run["rows"], elastic_run["kill_step"]
    worlds = [r["world"] for r in rows]
    first_two = next(i for i, r in enumerate(rows) if r["world"] == 2)
    back = next(i for i, r in enumerate(rows) if i > first_two and r["world"] == 3)
    assert set(worlds[:first_two]) == {3} and rows[first_two]["step"] > kill - EVERY
    assert back > first_two + 4
    assert {r["global_batch"] for r in rows} == {48}  # the accumulation made up for the node
    st = elastic_run["status"]
    assert st["phase"] == "running" and st["metrics"]["world"] == 3
    assert st["metrics"]["global_batch"] == 48
    nodes = {p["node"] for p in elastic_run["pods"]}
    assert elastic_run["returning"] in nodes and elastic_run["victim"] not in nodes
    # the survivors' pods are the same pods throughout: the lost one alone was replaced
    kept = {p["uid"] for p in elastic_run["pods_before"] if p["node"] != elastic_run["victim"]}
    assert len(kept) == 2 and kept <= {p["uid"] for p in elastic_run["pods"]}
