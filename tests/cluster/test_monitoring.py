"""`cluster.monitoring`: the stack, the jobs' monitors, alerts and dashboard (cluster/monitoring.py).

Every query names only series the exporter serves; promtool (Debian's prometheus 2.42) parses
each one and runs the stalled-job alert over series in time.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, run_cli
from trainmaster.cluster import monitoring
from trainmaster.monitor import exporter

TRN1 = ROOT / "examples" / "trn1-bert-large.toml"
P5 = ROOT / "examples" / "p5-bert-large.toml"
SETS = ("--set", 'cluster.public_access_cidrs=["192.0.2.0/28"]')  # no look-ups: zones given
needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="needs promtool (make system-deps: prometheus)"
)


def plan(tmp_path: Path, job: Path, *extra: str) -> Path:
    out = tmp_path / "plan"
    region = "us-east-1" if job == P5 else "us-west-2"
    zones = ("--set", f'cluster.zones=["{region}a", "{region}b"]')
    result = run_cli("cluster", "plan", str(job), "--out", str(out), *SETS, *zones, *extra)
    assert result.returncode == 0, result.stderr
    return out


def queries() -> list[str]:
    rules = monitoring.alert_rules("default")["spec"]["groups"][0]["rules"]
    panels = monitoring.dashboard()["panels"]
    found = [r["expr"] for r in rules] + [t["expr"] for p in panels for t in p["targets"]]
    assert len(found) == len(rules) + len(monitoring.PANELS) > 10
    return found


def test_the_plan_adds_the_stack_only_when_asked(tmp_path: Path) -> None:
    without = plan(tmp_path / "a", TRN1)
    assert not (without / "k8s" / "monitoring.yaml").exists()
    assert "monitoring" not in (without / "runbook.sh").read_text()
    out = plan(tmp_path / "b", TRN1, "--set", "cluster.monitoring=true")
    docs = [d for d in yaml.safe_load_all((out / "k8s" / "monitoring.yaml").read_text()) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ConfigMap",
        "DaemonSet",
        "Namespace",
        "PodMonitor",
        "PodMonitor",
        "PrometheusRule",
    ]
    board = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["trainmaster-job.json"]
    assert json.loads(board) == json.loads((out / "grafana" / "trainmaster-job.json").read_text())
    values = yaml.safe_load((out / "helm" / "kube-prometheus-stack.yaml").read_text())
    assert values["prometheus"]["prometheusSpec"]["podMonitorSelectorNilUsesHelmValues"] is False
    runbook = (out / "runbook.sh").read_text()
    assert (
        "kube-prometheus-stack --version 88.5.0 --namespace monitoring --create-namespace"
        in runbook
    )
    assert not (out / "helm" / "dcgm-exporter.yaml").exists()  # trn1: neuron-monitor instead
    gpu = plan(tmp_path / "c", P5, "--set", "cluster.monitoring=true")
    gpu_docs = yaml.safe_load_all((gpu / "k8s" / "monitoring.yaml").read_text())
    assert "DaemonSet" not in [d["kind"] for d in gpu_docs if d]
    assert (gpu / "helm" / "dcgm-exporter.yaml").exists()
    assert "dcgm-exporter --version" in (gpu / "runbook.sh").read_text()


def test_every_query_names_only_series_the_exporter_serves() -> None:
    text, names = " ".join(queries()), set()
    family = r"trainmaster_\(([a-z_|]+)\)_total"  # a panel of trainmaster_(a|b)_total by name
    for group in re.findall(family, text):
        names |= {f"trainmaster_{k}_total" for k in group.split("|")}
    names |= set(re.findall(r"trainmaster_[a-z_]+", re.sub(family, "", text)))
    assert names <= set(exporter.SERIES), names - set(exporter.SERIES)
    assert len(names) >= 14  # nearly every series is on the dashboard or in an alert


@needs_promtool
def test_promtool_parses_every_query(tmp_path: Path) -> None:
    grafana = {"$job_name": ".*", "$__rate_interval": "5m"}
    exprs = []
    for q in queries():
        for var, value in grafana.items():
            q = q.replace(var, value)
        exprs.append(q)
    rules = {"groups": [{"name": "all", "rules": [
        {"record": f"check:{i}", "expr": e} for i, e in enumerate(exprs)
    ]}]}  # fmt: skip
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_the_stalled_job_alert_fires_only_for_an_unfinished_job(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(
        yaml.safe_dump({"groups": monitoring.alert_rules("default")["spec"]["groups"]})
    )
    last = "trainmaster_last_step_timestamp_seconds"
    # both jobs step until minute 2 (t = 60 s, 120 s), then no more; "done" finished
    tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f'{last}{{job_name="stuck"}}', "values": "0 60 120x40"},
                    {"series": 'trainmaster_finished{job_name="stuck"}', "values": "0x42"},
                    {"series": f'{last}{{job_name="done"}}', "values": "0 60 120x40"},
                    {"series": 'trainmaster_finished{job_name="done"}', "values": "0 0 1x40"},
                ],
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": "TrainmasterJobStalled", "exp_alerts": []},
                    {
                        "eval_time": "25m",
                        "alertname": "TrainmasterJobStalled",
                        "exp_alerts": [
                            {
                                "exp_labels": {"job_name": "stuck", "severity": "warning"},
                                "exp_annotations": {
                                    "summary": "stuck logged no step for 15 minutes"
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
