"""The Kubernetes side of launch / status / logs / cancel / list.

The `kubernetes` client takes ~0.5 s to import, so it is imported here, inside the functions,
only when a command really talks to a cluster.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from trainmaster.config import JobConfig
from trainmaster.errors import UserError
from trainmaster.presets import EXAMPLE_ACCOUNT

if TYPE_CHECKING:
    from trainmaster.launch.k8s_client import Cluster

out = Console()


def backend_of(option: str | None) -> str:
    value = option or os.environ.get("TRAINMASTER_BACKEND") or "local"
    if value not in ("local", "kubernetes"):
        raise UserError(f"unknown backend {value!r}; use local or kubernetes", where="--backend")
    return value


def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> Cluster:
    from trainmaster.launch import kubernetes

    return kubernetes.connect(kubeconfig, context, namespace)


def launch(cfg: JobConfig, *, image: str | None, dry_run: str | None, kubeconfig: str | None,
           context: str | None) -> None:
    """Build every object (all checks happen here), then print them or submit them."""
    from trainmaster.launch import volcano

    objects = volcano.objects(cfg, image=image)
    if dry_run == "client":
        typer.echo(volcano.render_yaml(objects), nl=False)
        return
    if EXAMPLE_ACCOUNT in volcano.image_of(cfg, image) and dry_run != "server":
        raise UserError(f"the image still names the example account {EXAMPLE_ACCOUNT}; push the "
                        "image to your ECR (see `trainmaster cluster plan`) and set it",
                        where="kubernetes.image")
    from trainmaster.launch import kubernetes

    cluster = kubernetes.connect(kubeconfig, context, cfg.kubernetes.namespace)
    created = kubernetes.submit(cluster, objects, dry_run=dry_run == "server")
    name = created["metadata"]["name"]
    if dry_run == "server":
        typer.echo(f"{name}: the API server accepts the Job and its ConfigMap (server dry run; nothing created)")
        return
    typer.echo(f"{name}  (Volcano job in namespace {cluster.namespace}; "
               f"`trainmaster status {name} --backend kubernetes`)")


def status(cluster: Cluster, job: str) -> None:
    from trainmaster.launch import kubernetes

    st = kubernetes.status(cluster, job)
    out.print(f"[bold]{st.name}[/bold]  phase [bold]{st.phase}[/bold]  backend kubernetes  "
              f"namespace {st.namespace}  Volcano {st.volcano_phase}  restarts {st.retries}")
    if st.message:
        out.print(f"  {st.message}")
    table = Table("node", "pod", "phase", "k8s node", "restarts", "exit code", "rank 0")
    for p in st.pods:
        table.add_row(str(p.index), p.name, p.phase, p.node or "-", str(p.restarts),
                      "-" if p.exit_code is None else str(p.exit_code), "yes" if p.name == st.rank0_pod else "")
    out.print(table)


def logs(cluster: Cluster, job: str, node: int | None, follow: bool) -> None:
    from trainmaster.launch import kubernetes

    pod, lines = kubernetes.logs(cluster, job, node=node, follow=follow)
    typer.echo(f"# {pod}", err=True)
    for line in lines:
        typer.echo(line)


def cancel(cluster: Cluster, job: str) -> None:
    from trainmaster.launch import kubernetes

    kubernetes.cancel(cluster, job)
    typer.echo(f"{job}: cancelled (Volcano job and its pods deleted)")


def list_jobs(cluster: Cluster) -> None:
    from trainmaster.launch import kubernetes

    table = Table("job", "phase", "namespace", "nodes", "running", "created")
    for j in kubernetes.list_jobs(cluster):
        table.add_row(j.name, j.phase, j.namespace, str(j.nodes), str(j.running), j.created)
    out.print(table)
