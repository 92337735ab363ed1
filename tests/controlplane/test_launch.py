"""`trainmaster launch --backend kubernetes` of the presets against the real API server and
Volcano: strict field validation (an unknown field is an error), Volcano's admission webhook,
the server dry run, and the pods bound to fake nodes of the preset's instance type. Then the
job commands on the same server: status, list, logs (kwok's nodes serve no logs) and cancel.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import assert_user_error, cli_command, cli_env
from tests.controlplane import kubejobs as kj
from tests.controlplane.conftest import RealKube, _kube_module

pytestmark = [pytest.mark.kube, pytest.mark.timeout(3600)]
BATCH = ("batch.volcano.sh", "v1alpha1", "jobs")


@pytest.fixture
def p5_nodes(real_kube: RealKube, cluster_addons: Any) -> Iterator[list[str]]:
    """Two fake p5.48xlarge nodes beside the plane's own (kwok manages any node annotated for
    it), shaped as controlplane/kube_objects.py shapes every node; removed after the test."""
    kube_objects = _kube_module().kube_objects
    names = [f"p5-{n}" for n in kube_objects.node_names("p5.48xlarge", 2)]
    for name in names:
        node = real_kube.core.create_node(kube_objects.node(name, "p5.48xlarge"))
        kj.register_fsx_driver(real_kube, node)

    def ready() -> bool:
        conds = [real_kube.core.read_node(n).status.conditions or [] for n in names]
        return all(any(c.type == "Ready" and c.status == "True" for c in cs) for cs in conds)

    real_kube.wait_for(ready, 30, "the p5 nodes Ready")
    yield names
    for name in names:
        real_kube.core.delete_node(name)


def _launch_checked(kube: RealKube, ns: str, job_file: Any, *sets: str) -> list[Any]:
    """Server dry run, then the real launch; the pods bound (on nodes of the job's type)."""
    args = [a for s in sets for a in ("--set", s)]
    image = ("--set", f"kubernetes.image={kj.IMAGE}")
    dry = kj.ok(kj.tm(kube, ns, "launch", str(job_file), *image, *args, "--dry-run=server"))
    assert "the API server accepts the Job and its ConfigMap" in dry
    handle = kj.launch(kube, ns, job_file, *sets)
    job = handle.rsplit("/", 1)[1]
    stored = kube.custom.get_namespaced_custom_object(BATCH[0], BATCH[1], ns, BATCH[2], job)
    # admitted by Volcano's webhooks: what we set survives its defaulting
    assert stored["spec"]["maxRetry"] == 4 and stored["spec"]["minAvailable"] == 2
    assert stored["spec"]["queue"] == "trainmaster"
    return kj.bound(kube, ns, job, 2, "0")


def test_trn1_preset_launches_and_binds(real_kube: RealKube, job_ns: str) -> None:
    placed = _launch_checked(real_kube, job_ns, kj.TRN1)
    types = {
        real_kube.core.read_node(p.spec.node_name).metadata.labels[
            "node.kubernetes.io/instance-type"
        ]
        for p in placed
    }
    assert types == {"trn1.32xlarge"} and len({p.spec.node_name for p in placed}) == 2


def test_p5_and_custom_gpt_launch_and_bind(
    real_kube: RealKube, job_ns: str, p5_nodes: list[str]
) -> None:
    placed = _launch_checked(real_kube, job_ns, kj.P5)
    assert {p.spec.node_name for p in placed} == set(p5_nodes)
    kj.ok(kj.tm(real_kube, job_ns, "cancel", "bert-large-p5"))
    real_kube.wait_for(lambda: not kj.pods(real_kube, job_ns, "bert-large-p5"), 60, "p5 pods gone")
    placed = _launch_checked(real_kube, job_ns, kj.CUSTOM_GPT, "job.nproc_per_node=8")
    assert {p.spec.node_name for p in placed} == set(p5_nodes)
    # gone before its nodes are: a pod on a deleted node waits for the pod GC (40 s and more)
    kj.ok(kj.tm(real_kube, job_ns, "cancel", "custom-gpt"))
    real_kube.wait_for(lambda: not kj.pods(real_kube, job_ns, "custom-gpt"), 60, "pods gone")


def test_strict_validation_refuses_unknown_fields(real_kube: RealKube, job_ns: str) -> None:
    """What launch relies on: fieldValidation=Strict makes the API server refuse a field it
    does not know instead of dropping it silently (the Volcano CRD's schema included)."""
    from kubernetes.client.exceptions import ApiException

    from trainmaster.backends.kubernetes import volcano
    from trainmaster.config import jobfile

    cfg = jobfile.load(
        str(kj.TRN1), [f"kubernetes.image={kj.IMAGE}", f'kubernetes.namespace="{job_ns}"']
    )
    job = volcano.build_job(cfg)
    job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["bogusField"] = 1
    with pytest.raises(ApiException) as refused:
        real_kube.custom.create_namespaced_custom_object(
            *BATCH[:2], job_ns, BATCH[2], job, field_validation="Strict", dry_run="All"
        )
    assert refused.value.status in (400, 422) and "bogusField" in str(refused.value.body)


def test_status_list_logs_cancel(real_kube: RealKube, job_ns: str) -> None:
    handle = kj.launch(real_kube, job_ns, kj.TRN1)
    job = handle.rsplit("/", 1)[1]
    placed = kj.bound(real_kube, job_ns, job, 2, "0")
    st = kj.status(real_kube, job_ns, handle)
    assert st["phase"] == "running" and st["details"]["Volcano"] == "Running"
    assert {n["name"]: n["host"] for n in st["nodes"]} == {
        p.metadata.name: p.spec.node_name for p in placed
    }
    listed = kj.ok(kj.tm(real_kube, job_ns, "list", "--json"))
    assert handle in listed
    # kwok's nodes serve no container logs: logs says so in one line, not "no pod"
    logs = kj.tm(real_kube, job_ns, "logs", handle)
    assert "no pod" not in assert_user_error(logs, "pods/log")
    kj.ok(kj.tm(real_kube, job_ns, "cancel", handle))
    real_kube.wait_for(lambda: not kj.pods(real_kube, job_ns, job), 60, "the pods deleted")
    real_kube.wait_for(lambda: kj.job_gone(real_kube, job_ns, job), 60, "the job deleted")
    gone = kj.tm(real_kube, job_ns, "status", handle)
    assert_user_error(gone, f"no job {job}")
    cms = real_kube.core.list_namespaced_config_map(job_ns).items
    assert f"{job}-config" not in {c.metadata.name for c in cms}


HOLD = "trainmaster.test/hold"  # the test's own finalizer: the Job stays "being deleted"


def test_a_launch_waits_for_a_cancelled_job_of_its_name(real_kube: RealKube, job_ns: str) -> None:
    """`cancel` deletes in the Foreground: the Job stays until its pods are gone (on a cluster
    each after its grace period; here a finalizer holds it). A launch of the same name meanwhile
    says it waits, and goes on once the old Job is gone; one held past the wait is refused
    naming job.name."""
    from trainmaster.backends.kubernetes import jobs
    from trainmaster.errors import UserError

    handle = kj.launch(real_kube, job_ns, kj.TRN1)
    job = handle.rsplit("/", 1)[1]
    api = (*BATCH[:2], job_ns, BATCH[2], job)
    old_uid = real_kube.custom.get_namespaced_custom_object(*api)["metadata"]["uid"]
    real_kube.custom.patch_namespaced_custom_object(*api, {"metadata": {"finalizers": [HOLD]}})
    held_on = True

    def release() -> None:
        """Remove HOLD alone (a JSON patch at its index, tested first): the list may still
        hold the garbage collector's foregroundDeletion, which must not come back."""
        finalizers = real_kube.custom.get_namespaced_custom_object(*api)["metadata"].get(
            "finalizers", []
        )
        if HOLD in finalizers:
            at = f"/metadata/finalizers/{finalizers.index(HOLD)}"
            patch = [{"op": "test", "path": at, "value": HOLD}, {"op": "remove", "path": at}]
            real_kube.api.call_api(
                f"/apis/{BATCH[0]}/{BATCH[1]}/namespaces/{job_ns}/{BATCH[2]}/{job}",
                "PATCH",
                header_params={"Content-Type": "application/json-patch+json"},
                body=patch,
                auth_settings=["BearerToken"],
                _preload_content=False,
            )

    try:
        kj.ok(kj.tm(real_kube, job_ns, "cancel", handle))
        real_kube.wait_for(lambda: not kj.pods(real_kube, job_ns, job), 60, "the pods deleted")
        assert real_kube.custom.get_namespaced_custom_object(*api)["metadata"]["deletionTimestamp"]
        st = kj.status(real_kube, job_ns, handle)  # not "running" while it goes
        assert st["phase"] == "cancelled" and "being deleted" in st["message"]
        listed = json.loads(kj.ok(kj.tm(real_kube, job_ns, "list", "--json")))
        assert [j["phase"] for j in listed if j["job"] == job] == ["cancelled"]

        cluster = jobs.connect(str(real_kube.kubeconfig), None, job_ns)
        with pytest.raises(UserError) as held:
            jobs._wait_until_deleted(cluster, job, job_ns, timeout_s=0)
        assert held.value.where == "job.name" and "still being deleted" in str(held.value)
        # a server dry run meanwhile answers for the launch, not for the old job's name
        dry = kj.tm(
            real_kube,
            job_ns,
            *("launch", str(kj.TRN1), "--dry-run=server", "--set", f"kubernetes.image={kj.IMAGE}"),
        )
        assert dry.returncode == 0, dry.stderr
        assert f"the cancelled job {job} is still being deleted" in dry.stderr
        assert f"{job}: the API server accepts the Job" in dry.stdout
        assert real_kube.custom.get_namespaced_custom_object(*api)["metadata"]["uid"] == old_uid

        cmd = cli_command(
            *("--kubeconfig", str(real_kube.kubeconfig), "--backend", "kubernetes"),
            *("--namespace", job_ns, "launch", str(kj.TRN1)),
            *("--set", f"kubernetes.image={kj.IMAGE}"),
        )
        with subprocess.Popen(
            cmd, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        ) as proc:
            assert proc.stderr is not None
            waiting = f"the cancelled job {job} is still being deleted"
            seen = []
            for line in proc.stderr:  # until the launch says it waits (or ends without it)
                seen.append(line)
                if waiting in line:
                    break
            assert waiting in seen[-1], seen
            release()
            held_on = False
            out, err = proc.communicate(timeout=120)
    finally:
        if held_on:  # never leave the Job (and the namespace) stuck terminating
            release()
    assert proc.returncode == 0, err
    assert out.split()[0] == handle
    new = real_kube.custom.get_namespaced_custom_object(*api)
    assert new["metadata"]["uid"] != old_uid and not new["metadata"].get("deletionTimestamp")
    kj.bound(real_kube, job_ns, job, 2, "0")
    kj.ok(kj.tm(real_kube, job_ns, "cancel", handle))
