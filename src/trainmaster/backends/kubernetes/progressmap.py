"""A job's progress ConfigMap, `<job>-progress`: rank 0's pod writes it, `status` reads it.

The record in it is monitor/progress.py's RunProgress as JSON; cluster/progressguard.py says
why a ConfigMap and who may write it. The launch creates the map empty next to the job's
config (volcano.build_progress_map) and the Volcano Job owns it, so it goes with the job.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from trainmaster.backends.kubernetes.client import Cluster, NotFound, call, list_all
from trainmaster.cluster.progressguard import KEY, LABEL, map_name
from trainmaster.monitor.progress import RunProgress


def _record(cm: dict[str, Any]) -> RunProgress | None:
    return RunProgress.from_json(((cm.get("data") or {}).get(KEY)) or "")


def read(cluster: Cluster, job: str) -> RunProgress | None:
    """The job's newest record; None before rank 0's pod published one, or for a job launched
    before progress maps existed (no map)."""
    name = map_name(job)
    try:
        with call(cluster, "get", "configmaps", name):
            resp = cluster.core.read_namespaced_config_map(
                name, cluster.namespace, _preload_content=False
            )
            cm = json.loads(resp.data)
    except NotFound:
        return None
    return _record(cm)


def read_all(cluster: Cluster) -> dict[str, RunProgress]:
    """Every job's record in the namespace, by job name: one list (by label) for `list`."""
    found = list_all(
        cluster,
        "configmaps",
        functools.partial(
            cluster.core.list_namespaced_config_map,
            cluster.namespace,
            label_selector=LABEL,
        ),
    )
    out = {}
    for cm in found:
        job = (cm["metadata"].get("labels") or {}).get(LABEL)
        record = _record(cm)
        if job and record is not None:
            out[job] = record
    return out


def publish(cluster: Cluster, job: str, record: RunProgress) -> None:
    """Write the record: one merge patch of the one key, all the pod's role allows."""
    name = map_name(job)
    with call(cluster, "patch", "configmaps", name):
        cluster.core.patch_namespaced_config_map(
            name, cluster.namespace, {"data": {KEY: record.to_json()}}
        )
