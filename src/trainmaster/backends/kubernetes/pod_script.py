"""The parts of a Volcano pod's shell script and environment that identify the attempt.

backends/kubernetes/volcano.py renders the script; these are its pieces that depend on what
Volcano puts on the pods (the rendezvous id) and the cache lock held around the command
(docs/architecture.md 3.7, "The Volcano job"; 5: 12.1 and 17.3).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from trainmaster.backends.kubernetes import names as k8s_names
from trainmaster.backends.kubernetes import podspec
from trainmaster.compile import cache
from trainmaster.config import JobConfig

TASK = "worker"  # the Volcano job's one task (backends/kubernetes/volcano.py)
# Pod annotations set by Volcano's job controller in createJobPod, on every pod it creates
# (volcano-sh/volcano pkg/controllers/job/job_controller_util.go, tag v1.15.1 - the version
# cluster/versions.py installs - and unchanged at main ed72c7c8:
#   pgName := job.Name + "-" + string(job.UID)
#   pod.Annotations[schedulingv2.KubeGroupNameAnnotationKey] = pgName
#   pod.Annotations[batch.JobVersion] = fmt.Sprintf("%d", job.Status.Version)
# with the keys in staging/src/volcano.sh/apis/pkg/apis/{scheduling/v1beta1,batch/v1alpha1}/
# labels.go). job.Status.Version++ happens in killJob (job_controller_actions.go: "Job version
# is bumped only when job is killed"), which RestartJob runs (state/running.go) before the
# pods of the next attempt are created, so all pods of one attempt share both values.
# The job uid is in the PodGroup name since Volcano v1.6.0; before, the name was the job's
# alone, so a job deleted and submitted again would meet its old id: the script says so.
ANN_PODGROUP, ANN_JOB_VERSION = "scheduling.k8s.io/group-name", "volcano.sh/job-version"
ENV_PODGROUP, ENV_JOB_VERSION = "TRAINMASTER_PODGROUP", "TRAINMASTER_JOB_VERSION"
CACHE_HOLD = "trainmaster.backends.kubernetes.cache_hold"
PUBLISH = "trainmaster.backends.kubernetes.publish"  # runs every pod's command (publish.py)
LOCK_WAIT_S = 600.0  # how long pod 0 waits for another job's cache lock, as the trainer does
RDZV_ID_BEGIN, RDZV_ID_END = "# rendezvous id: begin", "# rendezvous id: end"


def rdzv_id_lines(job: str) -> list[str]:
    """Shell lines that set $rdzv_id from the Volcano annotations above (backends/kubernetes/volcano.py says
    why); job: the Volcano job's name."""
    return [
        RDZV_ID_BEGIN,
        f'if [ -z "${{{ENV_PODGROUP}:-}}" ] || [ -z "${{{ENV_JOB_VERSION}:-}}" ]; then',
        f'  echo "trainmaster: no {ANN_PODGROUP} / {ANN_JOB_VERSION} annotation: this pod was not '
        'created by the Volcano job controller" >&2; exit 1',
        "fi",
        f'if [ "${ENV_PODGROUP}" = {shlex.quote(job)} ]; then',
        '  echo "trainmaster: warning: Volcano older than v1.6 (PodGroup name without the job uid): '
        'the rendezvous id repeats if this job is submitted again" >&2',
        "fi",
        f'rdzv_id="${{{ENV_PODGROUP}}}-v${{{ENV_JOB_VERSION}}}"',
        RDZV_ID_END,
    ]


def attempt_id(environ: Mapping[str, str]) -> str:
    """The attempt's rendezvous id as rdzv_id_lines builds it, from the same environment ("" if
    the annotations are missing): every pod of one attempt has the same, the next a new one."""
    group, version = environ.get(ENV_PODGROUP, ""), environ.get(ENV_JOB_VERSION, "")
    return f"{group}-v{version}" if group and version else ""


def lock_lines(cfg: JobConfig, purpose: str) -> list[str]:
    """Pod 0 holds the cacheset's lock around the whole command (backends/kubernetes/cache_hold.py says why);
    every pod knows the token, the attempt's rendezvous id. Sets "$@" to the holder's command."""
    if not podspec.uses_cache(cfg):
        return ["set --"]
    q = shlex.quote
    hold = [
        "python3",
        "-m",
        CACHE_HOLD,
        "--cache",
        str(podspec.cache_dir(cfg)),
        "--job",
        cfg.job.name,
        "--purpose",
        purpose,
        "--wait",
        f"{LOCK_WAIT_S:g}",
    ]
    pod0 = k8s_names.pod_name(cfg.job.name, TASK, 0)
    return [
        f'export {cache.LOCK_ENV}="$rdzv_id"',
        "set --",
        f'if [ "$POD_NAME" = {q(pod0)} ]; then set -- {shlex.join(hold)} --token "$rdzv_id" --; fi',
    ]


def annotation_env(env: str, key: str) -> dict[str, Any]:
    return {"name": env, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}}}
