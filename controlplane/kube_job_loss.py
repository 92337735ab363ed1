"""The tutorial's job on real nodes, one of them lost mid-job: what happened, and when.

run() launches the job (kube_job.py), waits for its first step and for a complete checkpoint
(status's last_checkpoint: the evidence a resume needs, not a step count), kills the node of a
training pod that is not the system node (`kube.py kill-node`: its kubelet, containerd, shims and
containers SIGKILLed, its bridge gone), follows the job to its end, and lays out where the time
from the loss to the first new training step went, each phase from the cluster's own record:

    detection   the kill -> the first to notice: a surviving node's peer watch (its record in
                   hangs.jsonl: the lost node's heartbeat stopped, run/peers.py), or the node
                   controller (the node's Ready condition leaves True, after its grace)
    eviction    -> the gang's replacement pods are created (the survivors' pods end, Volcano's
                   RestartJob deletes the gang's pods, the node watcher lets the lost node's
                   pod go once its kubelet's lease is stale; or, without the peers' notice, the
                   not-ready taint, the toleration kubernetes.node_lost_after_s, out-of-service)
    scheduling  -> the last of them is bound to a node (Volcano's gang scheduling)
    start       -> the last container started (sandbox, CNI, the image already on the node)
    trainer     -> rank 0's trainer process began (torchrun's start, after its rendezvous)
    first step  -> the first new step ended (imports, preflight, the checkpoint's load, a step)

Times are wall clocks of this one machine: Kubernetes' in whole seconds, the trainer's
timeline (runs/JOB/timeline.jsonl on the claim) in fractions. The test
(tests/controlplane/test_real_job.py) and the bench (bench/k8s_real_nodes.py) both call run().
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import kube_job

HERE = Path(__file__).resolve().parent


def timeline(run_dir: Path, job: str) -> list[dict[str, Any]]:
    """rank 0's goodput events on the claim (run/goodput.py); a torn last line skipped."""
    path = run_dir / "fsx" / "runs" / job / "timeline.jsonl"
    events = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def peer_lost(run_dir: Path, job: str, after: float) -> dict[str, Any] | None:
    """The first record of a peer lost (run/peers.py: hangs.jsonl) after AFTER, if any."""
    path = run_dir / "fsx" / "runs" / job / "hangs.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            hang = json.loads(line)
        except json.JSONDecodeError:
            continue
        if hang.get("t", 0) > after and "heartbeat stopped" in hang.get("where", ""):
            return dict(hang)
    return None


def _t(stamp: datetime | None) -> float | None:
    return stamp.timestamp() if stamp else None


def _placed(pod: Any) -> dict[str, Any]:
    """A pod's node and the moments Kubernetes recorded for it."""
    scheduled = next(
        (c for c in pod.status.conditions or [] if c.type == "PodScheduled" and c.status == "True"),
        None,
    )
    running = [  # a container that ran: running now, or ended since (the job's end)
        (s.state.running or s.state.terminated).started_at
        for s in pod.status.container_statuses or []
        if s.state and (s.state.running or s.state.terminated)
    ]
    return {
        "name": pod.metadata.name,
        "uid": pod.metadata.uid,
        "node": pod.spec.node_name,
        "created": _t(pod.metadata.creation_timestamp),
        "scheduled": _t(scheduled.last_transition_time) if scheduled else None,
        "started": _t(max(running)) if running else None,
    }


def kill_node(run_dir: Path, name: str) -> None:
    """`kube.py kill-node NAME` on the plane in RUN_DIR."""
    env = {"TRAINMASTER_KUBE_DIR": str(run_dir), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    subprocess.run(
        [sys.executable, str(HERE / "kube.py"), "kill-node", name], env=env, check=True, timeout=60
    )


def _not_ready_at(kubeconfig: Path, node: str) -> float | None:
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(kubeconfig))
    found = client.CoreV1Api(api).read_node(node)
    for c in found.status.conditions or []:
        if c.type == "Ready" and c.status != "True":
            return _t(c.last_transition_time)
    return None


def run(
    kubeconfig: Path,
    run_dir: Path,
    sets: list[str],
    system_node: str,
    kill: Callable[[str], None] | None = None,
    timeout: float = 1200,
) -> dict[str, Any]:
    """Launch, lose a training node after the first checkpoint (KILL(node), kill_node by
    default), follow to the end. Returns status at the checkpoint and at the end, the pods
    before and after, the timeline and the phases (seconds)."""
    job = next(s.split("=", 1)[1] for s in sets if s.startswith("job.name="))
    t_launch = time.time()
    handle = kube_job.launch(kubeconfig, run_dir, sets)
    first = kube_job.wait_for(
        lambda: next((e for e in timeline(run_dir, job) if e["event"] == "steps"), None),
        600,
        "the first step in the containers",
    )
    running = kube_job.wait_for(
        lambda: (s := kube_job.status(kubeconfig, handle)).get("last_checkpoint") and s,
        600,
        "a complete checkpoint",
        every=2,
    )
    before = [_placed(p) for p in kube_job.pods(kubeconfig, job)]
    victim = next(p["node"] for p in before if p["node"] != system_node)
    t_kill = time.time()
    (kill or (lambda node: kill_node(run_dir, node)))(victim)
    final = kube_job.wait_for(
        lambda: (
            (s := kube_job.status(kubeconfig, handle))["phase"] in ("succeeded", "failed") and s
        ),
        timeout,
        f"{handle} to end",
        every=3,
    )
    after = [_placed(p) for p in kube_job.pods(kubeconfig, job)]
    events = timeline(run_dir, job)
    noticed = peer_lost(run_dir, job, t_kill)
    not_ready = _not_ready_at(kubeconfig, victim)
    marks = [x for x in (noticed and noticed["t"], not_ready) if x]
    first_notice = min(marks) if marks else None
    phases = _phases(t_kill, first_notice, before, after, events)
    return {
        "handle": handle,
        "job": job,
        "victim": victim,
        "launch_to_first_step_s": round(first["end"] - t_launch, 1),
        "running": running,
        "final": final,
        "pods_before": before,
        "pods_after": after,
        "timeline": events,
        "phases": phases,
        "noticed_by": "peers" if noticed and noticed["t"] == first_notice else "kubernetes",
        "peer_lost": noticed,
        "not_ready_at": not_ready,
    }


def _phases(
    t_kill: float,
    noticed: float | None,
    before: list[dict[str, Any]],
    after: list[dict[str, Any]],
    events: list[dict[str, Any]],
) -> dict[str, float | None]:
    """Seconds of each phase from the kill to the first new step (None: not recorded)."""
    old = {p["uid"] for p in before}
    new = [p for p in after if p["uid"] not in old]
    starts = [e for e in events if e["event"] == "start" and e["t"] > t_kill]
    first_new = next(
        (e for e in events if e["event"] == "steps" and starts and e["t"] >= starts[0]["t"]), None
    )
    marks = [
        ("detection", noticed),
        ("eviction", min((p["created"] for p in new if p["created"]), default=None)),
        ("scheduling", max((p["scheduled"] for p in new if p["scheduled"]), default=None)),
        ("start", max((p["started"] for p in new if p["started"]), default=None)),
        ("trainer", starts[0]["t"] if starts else None),
        ("first_step", first_new["end"] if first_new else None),
    ]
    phases: dict[str, float | None] = {}
    prev = t_kill
    for name, at in marks:
        phases[f"{name}_s"] = round(at - prev, 1) if at is not None else None
        prev = at if at is not None else prev
    end = first_new["end"] if first_new else None
    phases["loss_to_first_new_step_s"] = round(end - t_kill, 1) if end else None
    return phases
