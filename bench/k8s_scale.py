"""The Kubernetes backend at 64-1,024 nodes, simulated: manifest generation, and `status` of N pods.

    python bench/k8s_scale.py [--repeats 5] [--latency-ms 0,5] [--out FILE]

Two parts, both simulated on this machine (no cluster):

  manifests  the Volcano Job and ConfigMap of the tutorial's job (preset trn1-bert-large) on
             64, 512 and 1,024 trn1.32xlarge nodes: seconds to build the config and the objects
             and to render the YAML, and the size of each object as sent (JSON) against etcd's
             1.5 MiB request limit (https://etcd.io/docs/v3.5/dev-guide/limit/)
  status     `status` (launch/k8s_status.status) of a job with 128, 512 and 1,024 pods held by
             the fake API server of tests/k8s, through the real kubernetes client: without
             rank 0 (the job and its pods: paged lists) and with rank 0 (every pod's log read),
             now and as the code was before paged lists (docs/architecture.md 5: 15.2; "before": one
             unpaged list parsed into the client's models, and the logs read one after
             another; replicated below)

The fake server runs in this process on loopback, so a time is client plus server CPU on
this machine. --latency-ms adds a simulated round trip to every request (an assumption,
not a measured EKS figure): that is what concurrent log reads save on a real cluster.
Medians of --repeats. Prints one JSON object; no assertions (docs/architecture.md 4).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent)
)  # the repository: tests.backends.kubernetes

from tests.backends.kubernetes.fake_api import FakeCluster  # noqa: E402

from benchlib import emit, load, machine  # noqa: E402
from trainmaster import api  # noqa: E402
from trainmaster.backends.kubernetes import client as k8s_client  # noqa: E402
from trainmaster.backends.kubernetes import jobs as kubernetes  # noqa: E402
from trainmaster.backends.kubernetes import (
    names,  # noqa: E402
    volcano,  # noqa: E402
)
from trainmaster.backends.kubernetes import status as k8s_status  # noqa: E402

ETCD_REQUEST_LIMIT = 3 << 19  # 1.5 MiB: etcd's default --max-request-bytes (etcd "System limits")
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/trainmaster:0.1.0-neuron"
WORKERS = 32  # trn1.32xlarge: one worker per NeuronCore (the preset)
NS = "default"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median seconds of `repeats` calls, and the last call's result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def manifests(nodes: int, repeats: int) -> dict[str, Any]:
    overrides = [
        f"kubernetes.image={IMAGE}",
        f"job.nnodes={nodes}",
        f"train.global_batch_size={16 * WORKERS * nodes}",
    ]
    config_s, cfg = timed(lambda: api.preset_job("trn1-bert-large", overrides), repeats)
    objects_s, objs = timed(lambda: volcano.objects(cfg), repeats)
    yaml_s, text = timed(lambda: volcano.render_yaml(objs), repeats)
    sizes = {o["kind"]: len(json.dumps(o).encode()) for o in objs}
    return {
        "nodes": nodes,
        "workers": nodes * WORKERS,
        "config_s": round(config_s, 5),
        "objects_s": round(objects_s, 5),
        "yaml_s": round(yaml_s, 5),
        "total_s": round(config_s + objects_s + yaml_s, 5),
        "json_bytes": sizes,
        "yaml_bytes": len(text.encode()),
        "largest_vs_etcd_limit": round(max(sizes.values()) / ETCD_REQUEST_LIMIT, 5),
    }


# --- "before": k8s_status as it was before paged lists, for the comparison -----------------
def _before_pod_info(pod: Any) -> k8s_status.PodInfo:
    name = pod.metadata.name
    suffix = name.rpartition("-")[2]
    info = k8s_status.PodInfo(
        name=name,
        index=int(suffix) if suffix.isdigit() else -1,
        phase=pod.status.phase or "Unknown",
        node=pod.spec.node_name if pod.spec else None,
    )
    for cs in pod.status.container_statuses or []:
        info.restarts += cs.restart_count or 0
        term = cs.state.terminated if cs.state else None
        if term is not None:
            info.exit_code, info.reason = term.exit_code, term.reason or ""
    return info


def before_status(
    cluster: kubernetes.Cluster, name: str, find_rank0: bool
) -> tuple[int, str | None]:
    cluster.custom.get_namespaced_custom_object(names.GROUP, names.VERSION, NS, names.PLURAL, name)
    found = cluster.core.list_namespaced_pod(NS, label_selector=f"{volcano.LABEL_JOB}={name}")
    infos = sorted((_before_pod_info(p) for p in found.items), key=lambda p: (p.index, p.name))
    best: tuple[tuple[str, int], str] | None = None
    for pod in infos if find_rank0 else []:
        resp = cluster.core.read_namespaced_pod_log(
            pod.name,
            NS,
            timestamps=True,
            limit_bytes=k8s_status.RANK0_SCAN_BYTES,
            _preload_content=False,
        )
        for line in k8s_client.lines(resp):
            stamp, _, text = line.partition(" ")
            m = k8s_status.RANK0_LINE.search(text)
            if (
                m
                and m.group(1) == pod.name
                and (best is None or k8s_status._timestamp(stamp) >= best[0])
            ):
                best = (k8s_status._timestamp(stamp), pod.name)
    return len(infos), best[1] if best else None


def status_at(pods: int, latency_s: float, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-k8s-") as tmp:
        fake = FakeCluster(Path(tmp))
        fake.thread.start()
        try:
            cluster = kubernetes.connect(str(fake.kubeconfig()), namespace=NS)
            cfg = api.preset_job(
                "trn1-bert-large",
                [
                    f"kubernetes.image={IMAGE}",
                    f"job.nnodes={pods}",
                    f"train.global_batch_size={16 * WORKERS * pods}",
                ],
            )
            kubernetes.submit(cluster, volcano.objects(cfg))
            name = cfg.job.name
            labels = volcano.labels(name, "train") | {"volcano.sh/job-name": name}
            rank0 = pods * 3 // 4
            for i in range(pods):
                pod = f"{name}-worker-{i}"
                log = [f"[default{k}]:compiling" for k in range(4)]
                fake.add_pod(
                    NS,
                    pod,
                    labels,
                    log=log + ([f"trainmaster: rank 0 on pod {pod}"] if i == rank0 else []),
                )
            fake.latency_s = latency_s
            row: dict[str, Any] = {"pods": pods, "latency_ms": latency_s * 1000}
            for find in (False, True):
                key = "with_rank0" if find else "pods_only"
                fake.requests.clear()
                now_s, st = timed(
                    lambda f=find: kubernetes.status(cluster, name, find_rank0=f), repeats
                )  # type: ignore[misc]
                n_requests = len(fake.requests) // repeats
                before_s, (seen, r0) = timed(
                    lambda f=find: before_status(cluster, name, f), repeats
                )  # type: ignore[misc]
                assert len(st.pods) == seen == pods and st.rank0_pod == r0  # both see the same job
                row[key] = {
                    "now_s": round(now_s, 4),
                    "before_s": round(before_s, 4),
                    "before_over_now": round(before_s / now_s, 2),
                    "requests_now": n_requests,
                }
            row["list_requests_now"] = -(-pods // k8s_client.PAGE)
            return row
        finally:
            fake.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--repeats", type=int, default=5, help="timed calls of each kind (the median is kept)"
    )
    p.add_argument(
        "--latency-ms", default="0,5", help="simulated round trips per request, comma-separated"
    )
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args()
    load_before = load()
    made = []
    for nodes in (64, 512, 1024):
        made.append(manifests(nodes, args.repeats))
        say(
            f"manifests {nodes:5d} nodes: {made[-1]['total_s'] * 1000:.1f} ms, {made[-1]['json_bytes']} bytes"
        )
    rows = []
    for latency in (float(x) / 1000 for x in args.latency_ms.split(",")):
        for pods in (128, 512, 1024):
            rows.append(
                status_at(
                    pods, latency, args.repeats if latency == 0 else max(1, args.repeats // 2)
                )
            )
            say(
                f"status {pods:5d} pods, {latency * 1000:g} ms: {rows[-1]['pods_only']['now_s']:.3f} s, "
                f"with rank 0 {rows[-1]['with_rank0']['now_s']:.3f} s (before {rows[-1]['with_rank0']['before_s']:.3f} s)"
            )
    emit(
        {
            "bench": "k8s_scale",
            "what": "simulated: Volcano manifests of preset trn1-bert-large at 64/512/1,024 nodes (build time, "
            "size vs etcd's 1.5 MiB request limit), and `status` of N pods through tests/k8s's fake API "
            "server in this process over loopback (real kubernetes client); latency_ms is a simulated "
            "round trip per request, an assumption",
            "machine": machine(),
            "load_before": load_before,
            "load_after": load(),
            "repeats": args.repeats,
            "page_size": k8s_client.PAGE,
            "concurrent_log_reads": k8s_client.CONNECTIONS,
            "etcd_request_limit_bytes": ETCD_REQUEST_LIMIT,
            "manifests": made,
            "status": rows,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
