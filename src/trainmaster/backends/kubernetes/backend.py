"""The Kubernetes backend behind the Backend interface: Volcano jobs built by backends/kubernetes/volcano.py,
submitted, watched and deleted through backends/kubernetes/jobs.py.

The `kubernetes` client takes ~0.5 s to import, so it is imported inside the methods, only
when a command really talks to a cluster; `--dry-run` needs none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainmaster.backends import base
from trainmaster.config import JobConfig
from trainmaster.errors import UserError
from trainmaster.presets import EXAMPLE_ACCOUNT

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


class KubernetesBackend:
    name = "kubernetes"

    def __init__(self, target: base.Target) -> None:
        self.target = target
        self._clusters: dict[str | None, Cluster] = {}

    def _cluster(self, namespace: str | None = None) -> Cluster:
        ns = namespace or self.target.namespace
        if ns not in self._clusters:
            from trainmaster.backends.kubernetes import jobs as kubernetes

            self._clusters[ns] = kubernetes.connect(self.target.kubeconfig, self.target.context, ns)
        return self._clusters[ns]

    def plan(self, cfg: JobConfig, *, resume: bool = False, image: str | None = None,
             wait_lock_s: float = 0.0, precompile_steps: int | None = None) -> KubernetesDryRun:
        """Build (and so check) every object. resume: a Kubernetes job always resumes from its
        last checkpoint (the trainer's own rule); wait_lock_s: pod 0 waits for the lock itself."""
        from trainmaster.backends.kubernetes import volcano
        from trainmaster.compile import precompile as pre_mod

        precompile = precompile_steps is not None
        objects = volcano.objects(cfg, image=image, precompile=precompile,
                                  steps=precompile_steps or pre_mod.DEFAULT_STEPS)
        job = objects[-1]["metadata"]
        return KubernetesDryRun(job["name"], self.name, "precompile" if precompile else "train", (),
                                tuple(objects), job["namespace"], volcano.image_of(cfg, image))

    def submit(self, dry_run: base.DryRun, *, server_dry_run: bool = False, on_wait: base.Waiting | None = None,
               on_start: Callable[[str], None] | None = None) -> base.Submitted:
        from trainmaster.backends.kubernetes import jobs as kubernetes

        if not isinstance(dry_run, KubernetesDryRun):
            raise UserError(f"a {dry_run.backend} plan cannot run on Kubernetes", where="--backend")
        if EXAMPLE_ACCOUNT in dry_run.image and not server_dry_run:
            raise UserError(f"the image still names the example account {EXAMPLE_ACCOUNT}; push the "
                            "image to your ECR (see `trainmaster cluster plan`) and set it",
                            where="kubernetes.image")
        cluster = self._cluster(dry_run.namespace)
        name = kubernetes.submit(cluster, list(dry_run.objects), dry_run=server_dry_run)["metadata"]["name"]
        if server_dry_run:
            return base.Submitted(name, (f"{name}: the API server accepts the Job and its ConfigMap "
                                    "(server dry run; nothing created)",))
        more = ("; its rank 0 writes the cacheset's fingerprint after the first step"
                if dry_run.purpose == "precompile" else "")
        return base.Submitted(name, (f"{name}  (Volcano job in namespace {cluster.namespace}; "
                                f"`trainmaster status {name} --backend kubernetes`{more})",))

    def status(self, job: str) -> base.View:
        from trainmaster.backends.kubernetes import jobs as kubernetes

        st = kubernetes.status(self._cluster(), job)
        blocks: list[base.Line | base.Grid] = [base.Line(
            f"[bold]{st.name}[/bold]  phase [bold]{st.phase}[/bold]  backend kubernetes  "
            f"namespace {st.namespace}  Volcano {st.volcano_phase}  restarts {st.retries}", markup=True)]
        if st.message:
            blocks.append(base.Line(f"  {st.message}"))
        blocks.append(base.Grid(("node", "pod", "phase", "k8s node", "restarts", "exit code", "rank 0"), tuple(
            (str(p.index), p.name, p.phase, p.node or "-", str(p.restarts),
             "-" if p.exit_code is None else str(p.exit_code), "yes" if p.name == st.rank0_pod else "")
            for p in st.pods)))
        return base.View(st.name, st.phase, tuple(blocks), message=st.message,
                    info=f"Volcano {st.volcano_phase}, restarts {st.retries}")

    def logs(self, job: str, *, rank: int | None, node: int | None, follow: bool) -> base.LogStream:
        from trainmaster.backends.kubernetes import jobs as kubernetes

        if rank not in (None, 0):
            raise UserError("kubernetes jobs: logs shows rank 0's pod or --node N's pod", where="--rank")
        pod, lines = kubernetes.logs(self._cluster(), job, node=node, follow=follow)
        return base.LogStream(f"# {pod}", lines)

    def cancel(self, job: str, *, grace_s: float) -> str:
        """Delete the Volcano job (Kubernetes gives its pods their terminationGracePeriodSeconds)."""
        from trainmaster.backends.kubernetes import jobs as kubernetes

        kubernetes.cancel(self._cluster(), job)
        return f"{job}: cancelled (Volcano job and its pods deleted)"

    def list(self) -> base.Grid:
        from trainmaster.backends.kubernetes import jobs as kubernetes

        return base.Grid(("job", "phase", "namespace", "nodes", "running", "created"), tuple(
            (j.name, j.phase, j.namespace, str(j.nodes), str(j.running), j.created)
            for j in kubernetes.list_jobs(self._cluster())))

    def top(self, job: str, *, interval_s: float, say: Callable[[str], None]
            ) -> tuple[Callable[[], Any], float]:
        import time

        from trainmaster.backends.kubernetes import top as top_k8s
        from trainmaster.monitor import top as top_mod

        cluster = self._cluster()

        def sample() -> Any:  # the first call fails clearly: no job, no running pods
            rows = top_k8s.k8s_rows(cluster, job)
            stamp = time.strftime("%H:%M:%S")
            return top_mod.table(rows, f"{job}  (kubernetes, namespace {cluster.namespace})  {stamp}")

        return sample, interval_s

    def tensorboard(self, job: str | None, *, host: str, port: int, announce: Callable[[str], None]) -> None:
        """kubectl port-forward to the cluster's TensorBoard (`host` is the local backend's)."""
        from trainmaster.monitor import tensorboard as tb

        tb.serve_k8s(self._cluster(), port, self.target.kubeconfig, self.target.context, announce, job)
