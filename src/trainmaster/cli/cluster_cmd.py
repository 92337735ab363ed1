"""`trainmaster cluster plan | up | status | scale | down`: the EKS cluster of the kubernetes backend.

Thin: parse, call trainmaster.cluster, print. boto3 and the kubernetes client are imported by
the commands that use them, so that `trainmaster --help` stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from trainmaster.cli.options import JobFileArg, SetOpt
from trainmaster.errors import ConfigError, UserError

out = Console(highlight=False, soft_wrap=True)
DEFAULT_DIR = "cluster-plan"

cluster_app = typer.Typer(
    help="Plan, create, inspect, resize and delete the EKS cluster that kubernetes jobs run on.",
    no_args_is_help=True,
)
PlanDir = Annotated[
    str, typer.Option("--plan", metavar="DIR", help="Folder written by `cluster plan`")
]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the commands; run nothing")]


@cluster_app.command("plan")
def plan_cmd(
    file: JobFileArg,
    out_dir: Annotated[
        str, typer.Option("--out", metavar="DIR", help="Folder to write the plan to")
    ] = DEFAULT_DIR,
    overrides: SetOpt = None,
) -> None:
    """Write the cluster's files from the job file's cluster section: eksctl configs, CloudFormation template, add-on manifests, Helm values, Dockerfiles, runbook.sh. Creates nothing."""
    from trainmaster.cluster.plan import write_plan
    from trainmaster.config import jobfile

    cfg = jobfile.load(file, overrides)
    try:
        written = write_plan(cfg, out_dir)
    except ConfigError as exc:  # name the job file, as jobfile.load does
        raise ConfigError(str(exc), where=Path(file).name) from exc
    s = written.spec
    out.print(
        f"wrote {written.dir}/ for cluster {s.name}: {s.nodes} x {s.instance.name} in "
        f"{s.region} ({s.accelerator_zone}; cluster zones {', '.join(s.zones)}), "
        f"Kubernetes {s.kubernetes_version}",
        markup=False,
    )
    for rel in written.files:
        out.print(f"  {rel}", markup=False)
    from trainmaster.cluster import versions

    out.print("pinned versions (newest upstream release seen, date checked):", markup=False)
    for line in versions.pin_lines():
        out.print(f"  {line}", markup=False)
    if s.instance.device_kind == "xla":  # trn1: say why its stack is frozen
        out.print(f"note: {versions.FROZEN_XLA_NOTE}", markup=False)
    elif s.instance.device_kind == "neuron":
        out.print(f"note: {versions.TORCHNEURON_BETA}: the torchneuron image", markup=False)
    # how `data stage` gets S3 credentials (IRSA: pods cannot reach the node's IMDS)
    from trainmaster.config import S3_READER

    if s.data_buckets:
        out.print(
            f"data stage reads s3://{', s3://'.join(s.data_buckets)} through service account "
            f"{S3_READER} (namespace {s.namespace}; IRSA, read-only: eksctl/s3-irsa.yaml), its "
            "default for those buckets",
            markup=False,
        )
    else:
        out.print(
            "note: no cluster.data_buckets: `data stage s3://...` has no S3 credentials unless "
            "kubernetes.service_account names a service account that has (or --no-sign-request)",
            markup=False,
        )
    if s.endpoint_note:  # who can reach the API endpoint: the user must know before `up`
        out.print(f"note: {s.endpoint_note}", markup=False)
    out.print(
        f"next: review them, then `trainmaster cluster up --plan {written.dir}` "
        "(`--dry-run` prints every command first)",
        markup=False,
    )
    # the tag is pushed again by every build; jobs should name the image by digest
    # (docs/architecture.md 5: 17.10)
    out.print(
        f"the training image is tagged {s.image_repository}:{s.image_tag} and rebuilt under that "
        "tag; launch with the digest that `cluster up` and `cluster status` print "
        "(kubernetes.image=REPO@sha256:...)",
        markup=False,
    )


@cluster_app.command()
def up(
    plan_dir: PlanDir = DEFAULT_DIR,
    dry_run: DryRun = False,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Forget recorded progress; check every step again")
    ] = False,
) -> None:
    """Create everything in the plan, step by step: skips what exists, resumes after a failure."""
    from trainmaster.cluster import up as up_mod
    from trainmaster.cluster.plan import load_plan

    plan = load_plan(plan_dir)
    up_mod.up(plan, out, dry_run=dry_run, fresh=fresh)
    if not dry_run:
        out.print(
            f"cluster {plan.cluster['name']} is ready; `trainmaster cluster status --plan {plan_dir}`",
            markup=False,
        )


@cluster_app.command()
def status(
    plan_dir: PlanDir = DEFAULT_DIR,
    kubeconfig: Annotated[
        str | None,
        typer.Option(metavar="PATH", help="kubeconfig (default $KUBECONFIG, ~/.kube/config)"),
    ] = None,
    context: Annotated[
        str | None,
        typer.Option(metavar="NAME", help="kubeconfig context (default: the current one)"),
    ] = None,
) -> None:
    """What of the plan exists in AWS and in the cluster; per node, allocatable Neuron/GPU/EFA."""
    from trainmaster import api
    from trainmaster.cluster.plan import load_plan

    plan = load_plan(plan_dir)
    st = api.cluster_status(plan, kubeconfig, context)
    c = plan.cluster
    rows: list[tuple[str, str]] = []
    cl = st.cluster
    rows.append(
        (
            "cluster",
            f"{c['name']}: {cl['status']}, Kubernetes {cl.get('version')}"
            if cl
            else f"{c['name']}: not created",
        )
    )
    for ng in st.nodegroups:
        size = ng.get("scalingConfig", {})
        rows.append(
            (
                f"node group {ng['nodegroupName']}",
                f"{ng.get('status')}, {size.get('desiredSize')} node(s)",
            )
        )
    rows.append(("node stack", f"{c['stack']}: {st.stack_status or 'not created'}"))
    rows.append(
        (
            "image repository",
            f"{st.repository} (tags: {', '.join(st.image_tags) or 'none'})"
            if st.repository
            else f"{c['image_repository']}: not created",
        )
    )
    if st.repository:  # the tag is pushed again on every build: jobs pin the digest
        rows.append(
            (
                "training image",
                f"{st.image} (tag {c['image_tag']}; launch with --set kubernetes.image={st.image})"
                if st.image
                else f"tag {c['image_tag']} not pushed",
            )
        )
    for fs in st.file_systems:
        rows.append(
            (
                f"file system {fs.get('FileSystemId')}",
                f"{fs.get('Lifecycle')}, {fs.get('StorageCapacity')} GiB",
            )
        )
    if st.queue is not None:
        rows.append((f"queue {c['queue']}", "exists" if st.queue else "missing"))
    if st.claim_phase is not None:
        rows.append((f"claim {c['pvc']}", st.claim_phase))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        out.print(f"{key:<{width}}  {value}", markup=False)
    if st.kube_error:
        out.print(f"cluster: {st.kube_error}", markup=False)
    if st.nodes:
        table = [("NODE", "ROLE", "TYPE", "ZONE", "READY", "NEURON", "CORES", "GPU", "EFA")]
        for n in st.nodes:
            a = n.allocatable
            table.append(
                (
                    n.name,
                    n.role,
                    n.instance_type,
                    n.zone,
                    "yes" if n.ready else "NO",
                    a.get("aws.amazon.com/neuron", "-"),
                    a.get("aws.amazon.com/neuroncore", "-"),
                    a.get("nvidia.com/gpu", "-"),
                    a.get("vpc.amazonaws.com/efa", "-"),
                )
            )
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        out.print("")
        for row in table:
            out.print(
                "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(),
                markup=False,
            )


@cluster_app.command()
def scale(
    nodes: Annotated[
        int,
        typer.Option(
            "--nodes", metavar="N", help="Accelerator nodes wanted (0 pauses the node group)"
        ),
    ],
    plan_dir: PlanDir = DEFAULT_DIR,
    dry_run: DryRun = False,
) -> None:
    """Resize the accelerator node group (eksctl scale nodegroup)."""
    from trainmaster.cluster import up as up_mod
    from trainmaster.cluster.plan import load_plan

    up_mod.scale(load_plan(plan_dir), nodes, out, dry_run=dry_run)


@cluster_app.command()
def down(
    plan_dir: PlanDir = DEFAULT_DIR,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation")] = False,
    dry_run: DryRun = False,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Forget recorded progress; check every step again")
    ] = False,
    discard_data: Annotated[
        bool,
        typer.Option(
            "--discard-data",
            help="Delete the FSx file system with the runs on it although the plan exports them nowhere (cluster.results_bucket unset)",
        ),
    ] = False,
) -> None:
    """Delete everything the plan created, in the tutorial's clean-up order (asks first).

    With cluster.results_bucket the runs are exported to S3 once more first; without it the
    checkpoints would go with the file system, so it takes --discard-data."""
    from trainmaster.cluster import up as up_mod
    from trainmaster.cluster.plan import load_plan

    plan = load_plan(plan_dir)
    if not dry_run and not plan.cluster.get("results") and not discard_data:
        raise UserError(
            "cluster down deletes the FSx file system and every run on it (checkpoints, "
            "metrics, logs): set cluster.results_bucket and plan again (runs/ is then exported "
            "to S3 first), copy what you need from a pod, or pass --discard-data",
            where="--discard-data",
        )
    if not dry_run and not yes:
        if not sys.stdin.isatty():
            raise UserError("deleting the cluster needs a confirmation; pass --yes", where="--yes")
        out.print("This deletes:", markup=False)
        for item in up_mod.what_down_deletes(plan):
            out.print(f"  - {item}", markup=False)
        if not typer.confirm(f"Delete cluster {plan.cluster['name']}?", default=False):
            out.print("nothing deleted", markup=False)
            raise typer.Exit(1)
    up_mod.down(plan, out, dry_run=dry_run, fresh=fresh)
    if not dry_run:
        out.print(f"cluster {plan.cluster['name']} and its resources are deleted", markup=False)


@cluster_app.command("wait-fsx", hidden=True)
def wait_fsx(
    region: Annotated[str, typer.Option("--region")],
    cluster: Annotated[str, typer.Option("--cluster")],
    file_system_id: Annotated[
        list[str] | None, typer.Option("--file-system-id", metavar="ID")
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", metavar="SECONDS")] = 1800,
) -> None:
    """Wait until the FSx file systems are deleted (runbook.sh's down-claim step calls this)."""
    from trainmaster.cluster import aws

    aws.wait_file_systems_deleted(
        region,
        cluster,
        file_system_id or [],
        timeout_s=timeout,
        progress=lambda line: out.print(line, markup=False),
    )
    out.print("FSx file systems deleted", markup=False)
