"""Bad input: each a clear UserError naming the field, before any API call."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.backends.kubernetes.fake_api import FakeCluster
from tests.backends.kubernetes.test_volcano import IMAGE, job_cfg
from trainmaster import api
from trainmaster.backends.kubernetes import jobs as kubernetes
from trainmaster.backends.kubernetes import names as k8s_names
from trainmaster.backends.kubernetes import volcano
from trainmaster.config import JobConfig
from trainmaster.errors import ConfigError, UserError


def launch(cluster: kubernetes.Cluster, cfg: JobConfig) -> dict[str, Any]:
    """What `launch --backend kubernetes` does: build (and check) everything, then submit."""
    return kubernetes.submit(cluster, volcano.objects(cfg))


def with_section(cfg: JobConfig, section: str, **changes: Any) -> JobConfig:
    """A config with values the job file's validation would refuse: the builder checks again."""
    return cfg.model_copy(update={section: getattr(cfg, section).model_copy(update=changes)})


@pytest.mark.parametrize(
    ("overrides", "field", "says"),
    [
        (
            ["kubernetes.instance_type=trn9.xlarge"],
            "kubernetes.instance_type",
            "unknown instance type 'trn9.xlarge'",
        ),
        (["job.nproc_per_node=64"], "job.nproc_per_node", "trn1.32xlarge has 32 cores"),
        (['kubernetes.queue=""'], "kubernetes.queue", "at least 1 character"),
    ],
)
def test_refused_when_the_job_file_is_read(overrides: list[str], field: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        api.preset_job("trn1-bert-large", [f"kubernetes.image={IMAGE}", *overrides])
    assert field in str(err.value) and says in str(err.value)


@pytest.mark.parametrize(
    ("section", "changes", "field", "says"),
    [
        (
            "kubernetes",
            {"instance_type": "trn9.xlarge"},
            "kubernetes.instance_type",
            "unknown instance type",
        ),
        ("job", {"nproc_per_node": 33}, "job.nproc_per_node", "use at most 32"),
        ("kubernetes", {"image": None}, "kubernetes.image", "no training image"),
        ("kubernetes", {"image": "  "}, "kubernetes.image", "no training image"),
        (
            "job",
            {"name": "bert-large-pretraining-on-trainium-nodes-phase1-wikipedia"},
            "job.name",
            "Kubernetes allows at most 63: use a job name of at most 54 characters",
        ),
        ("job", {"name": "1st-bert"}, "job.name", "starting with a letter"),
        ("kubernetes", {"queue": ""}, "kubernetes.queue", "queue name is empty"),
        ("kubernetes", {"queue": "  "}, "kubernetes.queue", "queue name is empty"),
        ("kubernetes", {"queue": "Test_Queue"}, "kubernetes.queue", "not a valid queue name"),
        (
            "kubernetes",
            {"pvc": "FSx_Claim"},
            "kubernetes.pvc",
            "not a valid PersistentVolumeClaim name",
        ),
        (
            "kubernetes",
            {"pvc": "fsx-claim-"},
            "kubernetes.pvc",
            "not a valid PersistentVolumeClaim name",
        ),
        ("kubernetes", {"mount": "data"}, "kubernetes.mount", "absolute path"),
        ("kubernetes", {"service_account": "Trainer"}, "kubernetes.service_account", "not a valid"),
        (
            "kubernetes",
            {"node_selector": {"zone": "us west"}},
            "kubernetes.node_selector",
            "not a valid node label",
        ),
        (
            "kubernetes",
            {"tolerations": [{"key": "team", "operator": "Exists", "value": "nlp"}]},
            "kubernetes.tolerations",
            "takes no value",
        ),
        (
            "kubernetes",
            {"tolerations": [{"key": "team", "effect": "NoRun"}]},
            "kubernetes.tolerations",
            "effect",
        ),
        (
            "kubernetes",
            {"tolerations": [{"key": "team", "seconds": "5"}]},
            "kubernetes.tolerations",
            "unknown toleration key",
        ),
        (
            "rendezvous",
            {"endpoint": "127.0.0.1:2379"},
            "rendezvous.endpoint",
            "not reachable from other pods",
        ),
    ],
)
def test_refused_before_any_api_call(
    fake: FakeCluster,
    cluster: kubernetes.Cluster,
    section: str,
    changes: dict[str, Any],
    field: str,
    says: str,
) -> None:
    cfg = with_section(job_cfg("trn1-32xl"), section, **changes)
    with pytest.raises(UserError) as err:
        launch(cluster, cfg)
    assert str(err.value).startswith(f"{field}: ") and says in str(err.value), str(err.value)
    assert fake.requests == []


def test_pod_name_limit_counts_the_last_index() -> None:
    name = "a" * 54  # with "-worker-9" 63 characters; "-worker-10" is one too many
    k8s_names.check_job_name(name, "worker", 10)
    with pytest.raises(UserError, match="64 characters long.* at most 53 characters"):
        k8s_names.check_job_name(name, "worker", 11)


def test_precompile_name_must_stay_a_job_name(
    fake: FakeCluster, cluster: kubernetes.Cluster
) -> None:
    cfg = job_cfg("trn1-32xl", ["job.name=bert-large-trainium-phase1-wiki"])  # 32 characters
    with pytest.raises(UserError) as err:
        kubernetes.submit(cluster, volcano.objects(cfg, precompile=True))
    assert str(err.value).startswith("job.name: ") and "use at most 29" in str(err.value)
    assert fake.requests == []


def good_job() -> dict[str, Any]:
    return volcano.build_job(job_cfg("p5-48xl"))


def broken(change: Any) -> list[str]:
    job = copy.deepcopy(good_job())
    change(job)
    return k8s_names.webhook_problems(job)


def test_webhook_like_checks() -> None:
    assert k8s_names.webhook_problems(good_job()) == []
    tasks = lambda j: j["spec"]["tasks"]  # noqa: E731
    assert "duplicate task name 'worker'" in broken(
        lambda j: tasks(j).append(copy.deepcopy(tasks(j)[0]))
    )
    assert any(
        "invalid policy event 'PodCrashed'" in p
        for p in broken(
            lambda j: j["spec"]["policies"].append({"event": "PodCrashed", "action": "RestartJob"})
        )
    )
    assert any(
        "invalid policy action 'Retry'" in p
        for p in broken(lambda j: j["spec"]["policies"][0].update(action="Retry"))
    )
    assert any(
        "duplicate policy event 'PodFailed'" in p
        for p in broken(
            lambda j: j["spec"]["policies"].append({"event": "PodFailed", "action": "AbortJob"})
        )
    )
    assert "spec.minAvailable 3 > total replicas 2" in broken(
        lambda j: j["spec"].update(minAvailable=3)
    )
    assert "task worker: minAvailable 3 > replicas 2" in broken(
        lambda j: tasks(j)[0].update(minAvailable=3)
    )
    assert "spec.queue is empty" in broken(lambda j: j["spec"].update(queue=""))
    assert any("longer than 63" in p for p in broken(lambda j: j["metadata"].update(name="x" * 60)))
    assert any(
        "invalid PVC name 'FSx_Claim'" in p
        for p in broken(
            lambda j: tasks(j)[0]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"].update(
                claimName="FSx_Claim"
            )
        )
    )
    assert any(
        "invalid label" in p
        for p in broken(
            lambda j: tasks(j)[0]["template"]["metadata"]["labels"].update(
                {"trainmaster.io/job": "x" * 64}
            )
        )
    )
    with pytest.raises(UserError, match="would be rejected: spec.queue is empty"):
        job = good_job()
        job["spec"]["queue"] = ""
        k8s_names.check_job(job)


@pytest.mark.parametrize(
    ("check", "good", "bad"),
    [
        (
            k8s_names.is_dns1123_label,
            ["a", "a-b", "x" * 63],
            ["", "A", "-a", "a-", "a.b", "x" * 64],
        ),
        (
            k8s_names.is_dns1123_subdomain,
            ["a.b", "fsx-claim", "x" * 253],
            ["", "a..b", "a_b", "x" * 254],
        ),
        (k8s_names.is_dns1035_label, ["a1", "bert"], ["1a", "a_b"]),
        (
            k8s_names.is_qualified_name,
            ["app", "app.kubernetes.io/name", "A_b.c"],
            ["", "/x", "a/b/c", "-a"],
        ),
        (k8s_names.is_label_value, ["", "a", "A_b-1.2"], ["-a", "a b", "x" * 64]),
    ],
)
def test_names(check: Any, good: list[str], bad: list[str]) -> None:
    assert all(check(n) for n in good) and not any(check(n) for n in bad)
