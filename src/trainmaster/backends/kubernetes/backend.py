"""The Kubernetes backend behind the Backend interface: Volcano jobs built by backends/kubernetes/volcano.py,
submitted, watched and deleted through backends/kubernetes/jobs.py.

The `kubernetes` client takes ~0.5 s to import, so it is imported inside the methods, only
when a command really talks to a cluster; `--dry-run` needs none.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainmaster.backends import base
from trainmaster.config import JobConfig
from trainmaster.config.presets import EXAMPLE_ACCOUNT
from trainmaster.errors import UserError
from trainmaster.monitor import progress
from trainmaster.monitor.progress import RunProgress

if TYPE_CHECKING:
    from trainmaster.backends.kubernetes.client import Cluster


@dataclass(frozen=True)
class KubernetesDryRun(base.DryRun):
    objects: tuple[dict[str, Any], ...]  # in creation order: the ConfigMap, then the Volcano Job
    namespace: str
    image: str

    def render(self) -> str:
        """Every object as YAML, first checked against the published schemas (Volcano's CRD,
        Kubernetes' OpenAPI): what is printed is what a cluster accepts, no cluster needed."""
        from trainmaster import schemas
        from trainmaster.backends.kubernetes import volcano

        schemas.check_objects(list(self.objects))
        return volcano.render_yaml(list(self.objects))


@dataclass(frozen=True)
class KubernetesOptions:
    kubeconfig: str | None = None  # else $KUBECONFIG, ~/.kube/config, or the pod's service account
    context: str | None = None  # else the kubeconfig's current context
    namespace: str | None = None  # else kubernetes.namespace (launch) or the context's namespace
    image: str | None = None  # launch --image: else kubernetes.image


class KubernetesBackend:
    name = "kubernetes"

    def __init__(self, options: KubernetesOptions) -> None:
        self.options = options
        self._clusters: dict[str | None, Cluster] = {}

    def _cluster(self, namespace: str | None = None) -> Cluster:
        ns = namespace or self.options.namespace
        if ns not in self._clusters:
            from trainmaster.backends.kubernetes.client import connect

            self._clusters[ns] = connect(self.options.kubeconfig, self.options.context, ns)
        return self._clusters[ns]

    def handle(self, job: str, namespace: str | None = None) -> str:
        ns = namespace or self.options.namespace or self._cluster().namespace
        return f"kubernetes://{ns}/{job}"

    def plan(
        self, cfg: JobConfig, *, wait_lock_s: float = 0.0, precompile_steps: int | None = None
    ) -> KubernetesDryRun:
        """Build (and so check) every object. A Kubernetes job always resumes from its last
        checkpoint (the trainer's own rule); wait_lock_s: pod 0 waits for the lock itself."""
        from trainmaster.backends.kubernetes import volcano
        from trainmaster.compile import precompile as pre_mod

        precompile = precompile_steps is not None
        image = self.options.image
        objects = volcano.objects(
            cfg, image=image, precompile=precompile, steps=precompile_steps or pre_mod.DEFAULT_STEPS
        )
        job = objects[-1]["metadata"]
        return KubernetesDryRun(
            job["name"],
            self.name,
            "precompile" if precompile else "train",
            (),
            tuple(objects),
            job["namespace"],
            volcano.image_of(cfg, image),
        )

    def submit(
        self,
        dry_run: base.DryRun,
        *,
        server_dry_run: bool = False,
        on_wait: base.Waiting | None = None,
        on_start: Callable[[str], None] | None = None,
        on_note: Callable[[str], None] | None = None,
    ) -> base.Submitted:
        from trainmaster.backends.kubernetes import jobs

        if not isinstance(dry_run, KubernetesDryRun):
            raise UserError(f"a {dry_run.backend} plan cannot run on Kubernetes", where="--backend")
        if EXAMPLE_ACCOUNT in dry_run.image and not server_dry_run:
            raise UserError(
                f"the image still names the example account {EXAMPLE_ACCOUNT}; push the "
                "image to your ECR (see `trainmaster cluster plan`) and set it",
                where="kubernetes.image",
            )
        cluster = self._cluster(dry_run.namespace)
        created = jobs.submit(cluster, list(dry_run.objects), dry_run=server_dry_run, say=on_note)
        name = created["metadata"]["name"]
        if server_dry_run:
            return base.Submitted(
                name,
                (
                    f"{name}: the API server accepts the Job and its ConfigMap "
                    "(server dry run; nothing created)",
                ),
            )
        more = (
            "; its rank 0 writes the cacheset's fingerprint after the first step"
            if dry_run.purpose == "precompile"
            else ""
        )
        handle = self.handle(name, cluster.namespace)
        return base.Submitted(
            name,
            (
                f"{handle}  (Volcano job in namespace {cluster.namespace}; "
                f"`trainmaster status {handle}`{more})",
            ),
        )

    def status(self, job: str) -> base.JobStatus:
        from trainmaster.backends.kubernetes import jobs, nodemark, waiting

        cluster = self._cluster()
        st = jobs.status(cluster, job)
        record = st.record  # rank 0's pod published it; it also named that pod (status.py)
        # nodes a pod of this job marked unhealthy (cluster/nodeguard.py): the restart avoids them;
        # a running pod's node gone NotReady is marked here (nodemark.mark_not_ready)
        ours = f"{st.namespace}/{st.name}"
        problems: list[str] = []
        all_nodes = nodemark.list_nodes(cluster)  # one list for both: 1,024 nodes are megabytes
        if st.phase in ("pending", "running"):
            on = {p.node: p.name for p in st.pods if p.node and p.phase in ("Running", "Unknown")}
            problems, changed = nodemark.mark_not_ready(cluster, all_nodes, on, ours)
            all_nodes = nodemark.list_nodes(cluster) if changed else all_nodes
        every_mark = nodemark.marks(cluster, all_nodes)
        marked = [m for m in every_mark if m.job == ours]
        message = st.message
        if message.startswith(waiting.PREFIX) and every_mark:  # the scheduler does not name them
            message = f"{message}; {nodemark.held_back(every_mark)}"
        nodes = tuple(
            base.NodeStatus(
                index=p.index,
                name=p.name,
                state=p.phase,
                host=p.node,
                exit_code=p.exit_code,
                restarts=p.restarts,
                rank0=p.name == st.rank0_pod,
                reason=p.reason,
            )
            for p in st.pods
        )
        return base.JobStatus(
            job=st.name,
            backend=self.name,
            handle=self.handle(st.name, st.namespace),
            phase=base.Phase(st.phase),
            message=message,
            nnodes=st.replicas,
            created=st.created,
            nodes=nodes,
            details={
                "namespace": st.namespace,
                "Volcano": st.volcano_phase,
                "job retries": str(st.retries),
                "attempt": str(st.attempt),
            },
            # restarts: torchrun's in rank 0's record plus Volcano's, as the local backend counts
            **progress.status_fields(
                record, job_retries=st.retries, running=st.phase == "running", now=time.time()
            ),
            notes=_progress_notes(record, st.phase, time.time())
            + tuple(m.line() for m in marked)
            + tuple(problems),
        )

    def logs(self, job: str, *, rank: int | None, node: int | None, follow: bool) -> base.LogStream:
        from trainmaster.backends.kubernetes import jobs

        if rank not in (None, 0):
            raise UserError(
                "kubernetes jobs: logs shows rank 0's pod or --node N's pod", where="--rank"
            )
        pod, lines = jobs.logs(self._cluster(), job, node=node, follow=follow)
        return base.LogStream(f"# {pod}", lines)

    def cancel(self, job: str, *, grace_s: float) -> str:
        """Delete the Volcano job (Kubernetes gives its pods their terminationGracePeriodSeconds)."""
        from trainmaster.backends.kubernetes import jobs

        jobs.cancel(self._cluster(), job)
        return f"{job}: cancelled (the Volcano job and its pods are being deleted)"

    def list(self) -> list[base.JobStatus]:
        from trainmaster.backends.kubernetes import jobs, progressmap

        cluster = self._cluster()
        records = progressmap.read_all(cluster)  # one list call, not one read per job
        now = time.time()
        return [
            base.JobStatus(
                job=j.name,
                backend=self.name,
                handle=self.handle(j.name, j.namespace),
                phase=base.Phase(j.phase),
                nnodes=j.nodes,
                created=j.created,
                details={
                    "namespace": j.namespace,
                    "Volcano": j.volcano_phase,
                    "running": str(j.running),
                },
                **progress.status_fields(
                    records.get(j.name),
                    job_retries=j.retries,
                    running=j.phase == "running",
                    now=now,
                ),
            )
            for j in jobs.list_jobs(cluster)
        ]

    def top(
        self, job: str, *, interval_s: float, say: Callable[[str], None]
    ) -> tuple[Callable[[], Any], float]:
        from trainmaster.backends.kubernetes import top as top_k8s
        from trainmaster.monitor import top as top_mod

        cluster = self._cluster()

        def sample() -> Any:  # the first call fails clearly: no job, no running pods
            rows = top_k8s.k8s_rows(cluster, job)
            stamp = time.strftime("%H:%M:%S")
            return top_mod.table(
                rows, f"{job}  (kubernetes, namespace {cluster.namespace})  {stamp}"
            )

        return sample, interval_s

    def tensorboard(
        self, job: str | None, *, host: str, port: int, announce: Callable[[str], None]
    ) -> None:
        """kubectl port-forward to the cluster's TensorBoard (`host` is the local backend's)."""
        from trainmaster.backends.kubernetes import tensorboard

        tensorboard.serve_k8s(
            self._cluster(), port, self.options.kubeconfig, self.options.context, announce, job
        )


STALE_S = 60.0  # a record older than this, of a running job, is said to be old


def _progress_notes(record: RunProgress | None, phase: str, now: float) -> tuple[str, ...]:
    """The record's lines; a running job's that is more than STALE_S old says so. No record:
    none (rank 0 has not started, or the cluster lacks k8s/job-progress.yaml: its pod says so)."""
    if record is None:
        return ()
    age = now - record.at
    old = (f"progress as of {age:.0f} s ago (rank 0's pod publishes it)",)
    return record.notes + (old if phase == "running" and age > STALE_S else ())
