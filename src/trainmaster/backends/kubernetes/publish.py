"""`python3 -m trainmaster.backends.kubernetes.publish --run DIR --job J --namespace NS -- COMMAND`

Every pod of a job runs its command under this (backends/kubernetes/volcano.py). While the
command runs, the pod that holds rank 0 (rank0.json on the shared storage names its pod; pod 0
until the first rank 0 wrote it) reads the run folder every PUBLISH_S seconds and publishes
its progress record (monitor/progress.py) into the job's `<job>-progress` ConfigMap
(progressmap.py); once more when the command has ended, so a finished job keeps its step,
loss and summary after its pods are gone. The record names rank 0's pod, which is how `status`
and `logs` find it (status.py), and counts the worker group's restarts as the local backend
does, the gang's (Volcano's) left out: `status` adds Volcano's own count. The other pods only
pass the command through. Every pod also serves /metrics on port METRICS_PORT
(monitor/exporter.py); only the pod holding rank 0 has series in it.

Publishing never changes what the command does: an answer the API server refuses (the
cluster lacks k8s/job-progress.yaml of `cluster plan`, say) is said once on stderr and
publishing stops; this process exits with the command's exit code. Kubernetes stops a pod
with SIGTERM to its first process, which is this one: it passes the signal on and waits for
the command to end, as cache_hold does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from trainmaster.backends.kubernetes import names as k8s_names
from trainmaster.backends.kubernetes import podpeers, podproc, progressmap
from trainmaster.backends.kubernetes.client import Cluster, connect
from trainmaster.backends.kubernetes.pod_script import ENV_JOB_VERSION, PUBLISH, TASK, attempt_id
from trainmaster.cluster.progressguard import PUBLISH_S
from trainmaster.errors import JobFailed, UserError
from trainmaster.monitor import exporter, progress
from trainmaster.run import state
from trainmaster.storage import RunPaths

PUBLISH_S_ENV = "TRAINMASTER_PUBLISH_S"
METRICS_PORT_ENV = "TRAINMASTER_METRICS_PORT"  # tests: several "pods" on one host
FINAL_WAIT_S = 10.0  # the last publish may hold the pod's end this long, no longer


def attempt(environ: Mapping[str, str] = os.environ) -> int:
    """The gang's restarts before this pod's attempt: the Volcano job version its pods carry
    (pod_script.ENV_JOB_VERSION; RestartJob bumps it). Rank 0's trainer processes of those
    attempts are in the run folder's timeline too, and are not the worker group's restarts."""
    raw = environ.get(ENV_JOB_VERSION, "")
    return int(raw) if raw.isdigit() else 0


class Publisher:
    def __init__(
        self,
        run: RunPaths,
        job: str,
        pod: str,
        cluster: Callable[[], Cluster],
        job_retries: int = 0,
    ):
        self.run, self.job, self.pod = run, job, pod
        self.job_retries = job_retries
        self._connect = cluster
        self._cluster: Cluster | None = None
        self.off = False
        self.phase: state.Phase = "running"  # the command's, once it has ended

    def holds_rank0(self) -> bool:
        try:
            rank0 = json.loads(self.run.rank0.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return self.pod == k8s_names.pod_name(self.job, TASK, 0)
        return isinstance(rank0, dict) and rank0.get("pod") == self.pod

    def once(self) -> bool:
        """Publish the run's record if this pod holds rank 0; whether it did."""
        if self.off or not self.holds_rank0():
            return False
        record = progress.of_folder(self.run, self.job, self.phase, self.job_retries)
        try:
            self._cluster = self._cluster or self._connect()
            progressmap.publish(self._cluster, self.job, record)
        except (UserError, JobFailed) as exc:
            print(f"trainmaster: progress not published, and no more tries: {exc}", flush=True)
            self.off = True
            return False
        return True


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        raise UserError(
            "usage: publish --run DIR --job NAME --namespace NS -- COMMAND...", where="publish"
        )
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog=PUBLISH)
    parser.add_argument("--run", required=True, type=Path)
    parser.add_argument("--job", required=True)
    parser.add_argument("--namespace", required=True)
    # the peer watch (podpeers.py): the job's nodes, kubernetes.peer_lost_after_s, elastic
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--peer-lost-after-s", type=float, default=0.0)
    parser.add_argument("--elastic", action="store_true")
    return parser.parse_args(argv[:cut]), argv[cut + 1 :]


def main(argv: list[str] | None = None) -> int:
    try:
        args, command = parse(sys.argv[1:] if argv is None else argv)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    every = float(os.environ.get(PUBLISH_S_ENV) or PUBLISH_S)
    pub = Publisher(
        RunPaths(args.run),
        args.job,
        os.environ.get("POD_NAME", ""),
        lambda: connect(namespace=args.namespace),
        attempt(),
    )
    port = int(os.environ.get(METRICS_PORT_ENV) or exporter.METRICS_PORT)
    try:  # /metrics on every pod; the series only where rank 0 is (monitor/exporter.py)
        collector = exporter.RunCollector(
            pub.run, args.job, lambda: pub.phase, pub.holds_rank0, pub.job_retries
        )
        metrics = exporter.serve(collector, port=port).stop
    except OSError as exc:  # the port is taken: the job runs without /metrics
        print(f"trainmaster: no /metrics on port {port}: {exc}", flush=True)
        metrics = None
    child = podproc.start(command)
    if child is None:
        return podproc.CANNOT_START
    watched = podpeers.start(
        pub.run,
        child,
        attempt=attempt_id(os.environ),
        pod=pub.pod,
        nodes=args.nodes,
        lost_after_s=args.peer_lost_after_s,
        elastic=args.elastic,
    )
    done = threading.Event()

    def loop() -> None:
        while not done.wait(every):
            pub.once()

    ticker = threading.Thread(target=loop, name="publish", daemon=True)
    ticker.start()
    code = child.wait()
    pub.phase = "succeeded" if code == 0 else "failed"
    if watched is not None:
        # an ended command is no lost node (a preempted or failed pod restarts the job its own
        # way): "done", unless another attempt holds the run
        watched[1].stop(done=watched[0].ended != "fenced")
        pub.off = pub.off or watched[0].ended == "fenced"  # the run is another attempt's now
    done.set()
    ticker.join(FINAL_WAIT_S)
    final = threading.Thread(target=pub.once, daemon=True)
    final.start()
    final.join(FINAL_WAIT_S)
    if metrics is not None:
        metrics()
    code = podproc.exit_code(code)
    return watched[0].exit_code(code) if watched is not None else code


if __name__ == "__main__":
    sys.exit(main())
