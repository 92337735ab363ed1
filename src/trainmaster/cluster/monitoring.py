"""The fleet's monitoring: Prometheus and Grafana for the jobs' /metrics and the devices (pure).

With `cluster.monitoring = true`, `cluster plan` adds (servicesteps.py installs them):
- kube-prometheus-stack (Prometheus, the operator, Grafana, Alertmanager), a pinned chart, told
  to pick up every PodMonitor and PrometheusRule, not only its own release's;
- a PodMonitor for every trainmaster pod's `metrics` port (monitor/exporter.py: the job's
  series come from the pod holding rank 0), a PrometheusRule of alerts, and the job dashboard
  as a ConfigMap Grafana's sidecar loads;
- the device exporters: Neuron's neuron-monitor DaemonSet (trn/inf nodes; AWS's own manifest,
  aws-neuron-sdk src/k8/k8s-neuron-monitor-daemonset.yml, with a PodMonitor for its port) or
  NVIDIA's dcgm-exporter chart (GPU nodes).
Every query here names only series the exporter serves (tests/cluster/test_monitoring.py
checks them against exporter.SERIES and with promtool).
"""

from __future__ import annotations

from typing import Any

from trainmaster.cluster import versions
from trainmaster.cluster.addons import SYSTEM_SELECTOR
from trainmaster.cluster.spec import ClusterSpec

NAMESPACE = "monitoring"  # the stack's
RELEASE = "kube-prometheus-stack"
MANAGED = {"app.kubernetes.io/managed-by": "trainmaster"}
STALLED_S = 900  # a job that logged no step for this long while unfinished: alert
GOODPUT_MIN = 0.7  # productive share of wall time below this for 30 minutes: alert
NEURON_MONITOR_PORT = 8000
JOB = '{job_name=~"$job_name"}'


def stack_values() -> dict[str, Any]:
    """kube-prometheus-stack's values: the system nodes, and every PodMonitor/PrometheusRule of
    the cluster selected (its default selects only those labelled with its own release)."""
    system = {"nodeSelector": dict(SYSTEM_SELECTOR)}
    return {
        "prometheus": {
            "prometheusSpec": {
                **system,
                "podMonitorSelectorNilUsesHelmValues": False,
                "ruleSelectorNilUsesHelmValues": False,
                "serviceMonitorSelectorNilUsesHelmValues": False,
                "retention": "15d",
            }
        },
        "alertmanager": {"alertmanagerSpec": system},
        "prometheusOperator": system,
        "grafana": {
            **system,
            "sidecar": {"dashboards": {"enabled": True, "searchNamespace": "ALL"}},
        },
        "kube-state-metrics": system,
    }


def dcgm_values() -> dict[str, Any]:
    """NVIDIA dcgm-exporter's values: on GPU nodes, scraped through its ServiceMonitor."""
    return {
        "serviceMonitor": {"enabled": True},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }


def job_pod_monitor(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "trainmaster-jobs", "namespace": namespace, "labels": dict(MANAGED)},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/managed-by": "trainmaster"}},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s"}],
        },
    }


def _alert(name: str, expr: str, wait: str, summary: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": wait,
        "labels": {"severity": "warning"},
        "annotations": {"summary": summary},
    }


def alert_rules(namespace: str) -> dict[str, Any]:
    """A job that stopped stepping, goodput below GOODPUT_MIN, restarts and hangs."""
    rules = [
        _alert(
            "TrainmasterJobStalled",
            f"time() - max by (job_name) (trainmaster_last_step_timestamp_seconds) > {STALLED_S} "
            "and on (job_name) max by (job_name) (trainmaster_finished) == 0",
            "5m",
            f"{{{{ $labels.job_name }}}} logged no step for {STALLED_S // 60} minutes",
        ),
        _alert(
            "TrainmasterLowGoodput",
            f"max by (job_name) (trainmaster_goodput_ratio) < {GOODPUT_MIN}",
            "30m",
            f"{{{{ $labels.job_name }}}} spends under {GOODPUT_MIN:.0%} of its time training",
        ),
        _alert(
            "TrainmasterRestarts",
            "max by (job_name) (increase(trainmaster_restarts_total[1h])) >= 2",
            "0m",
            "{{ $labels.job_name }} restarted {{ $value }} times in an hour",
        ),
        _alert(
            "TrainmasterHang",
            "max by (job_name) (increase(trainmaster_hangs_total[15m])) > 0",
            "0m",
            "a watchdog of {{ $labels.job_name }} caught a hang",
        ),
    ]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "trainmaster-jobs", "namespace": namespace, "labels": dict(MANAGED)},
        "spec": {"groups": [{"name": "trainmaster-jobs", "rules": rules}]},
    }


# (title, PromQL, unit, legend): one panel each, in reading order
PANELS = (
    ("Step", f"trainmaster_step{JOB}", "none", "{{job_name}}"),
    ("Loss", f"trainmaster_loss{JOB}", "none", "{{job_name}}"),
    ("Sequences / s", f"trainmaster_seq_per_second{JOB}", "none", "{{job_name}}"),
    ("Tokens / s", f"trainmaster_tokens_per_second{JOB}", "none", "{{job_name}}"),
    ("MFU", f"trainmaster_mfu{JOB}", "percentunit", "{{job_name}}"),
    ("Goodput", f"trainmaster_goodput_ratio{JOB}", "percentunit", "{{job_name}}"),
    ("Where the time went", f"trainmaster_time_seconds{JOB}", "s", "{{job_name}} {{part}}"),
    (
        "Checkpoint stand-still per save",
        f"increase(trainmaster_checkpoint_standstill_seconds_total{JOB}[1h]) / "
        f"clamp_min(increase(trainmaster_checkpoint_saves_total{JOB}[1h]), 1)",
        "s",
        "{{job_name}}",
    ),
    (
        "Checkpoint write bytes / s",
        f"rate(trainmaster_checkpoint_bytes_total{JOB}[$__rate_interval])",
        "Bps",
        "{{job_name}}",
    ),
    (
        "Restarts, hangs, preemptions (1 h)",
        'increase({__name__=~"trainmaster_(restarts|hangs|preemptions)_total",job_name=~"$job_name"}[1h])',
        "none",
        "{{job_name}} {{__name__}}",
    ),
    ("ETA", f"trainmaster_eta_seconds{JOB}", "s", "{{job_name}}"),
)


def dashboard() -> dict[str, Any]:
    """The job dashboard (Grafana JSON model): one row of panels per figure, a job picker."""
    panels = [
        {
            "id": i + 1,
            "type": "timeseries",
            "title": title,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": "A", "expr": expr, "legendFormat": legend}],
        }
        for i, (title, expr, unit, legend) in enumerate(PANELS)
    ]
    return {
        "title": "trainmaster job",
        "uid": "trainmaster-job",
        "schemaVersion": 39,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "tags": ["trainmaster"],
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus"},
                {
                    "name": "job_name",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": "label_values(trainmaster_step, job_name)",
                    "includeAll": True,
                    "multi": True,
                },
            ]
        },
        "panels": panels,
    }


def dashboard_config_map(json_text: str) -> dict[str, Any]:
    """The dashboard where kube-prometheus-stack's Grafana sidecar loads it (label grafana_dashboard)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "trainmaster-job-dashboard",
            "namespace": NAMESPACE,
            "labels": {**MANAGED, "grafana_dashboard": "1"},
        },
        "data": {"trainmaster-job.json": json_text},
    }


def neuron_monitor(spec: ClusterSpec) -> list[dict[str, Any]]:
    """AWS's neuron-monitor DaemonSet (its manifest's image, port and limits) on the accelerator
    nodes, with a named port and a PodMonitor, so device use lands next to the jobs' series."""
    ns, labels = "neuron-monitor", {"app": "neuron-monitor"}
    meta = {"name": "neuron-monitor", "namespace": ns, "labels": {**labels, **MANAGED}}
    container = {
        "name": "neuron-monitor",
        "image": versions.NEURON_MONITOR_IMAGE,
        "command": ["/opt/bin/entrypoint.sh"],
        "args": ["--port", str(NEURON_MONITOR_PORT)],
        "ports": [{"name": "metrics", "containerPort": NEURON_MONITOR_PORT}],
        "env": [{"name": "GOMEMLIMIT", "value": "160MiB"}],
        "resources": {
            "limits": {"cpu": "500m", "memory": "256Mi"},
            "requests": {"cpu": "256m", "memory": "128Mi"},
        },
        "securityContext": {"privileged": True},  # reads the devices' counters, as AWS's does
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns, "labels": dict(MANAGED)},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": meta,
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": dict(spec.accelerator_labels),
                        "tolerations": [
                            {"key": spec.taint_key, "operator": "Exists", "effect": "NoSchedule"}
                        ],
                        "containers": [container],
                    },
                },
            },
        },
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": meta,
            "spec": {
                "selector": {"matchLabels": labels},
                "podMetricsEndpoints": [{"port": "metrics", "interval": "30s"}],
            },
        },
    ]


def objects(spec: ClusterSpec, dashboard_json: str) -> list[dict[str, Any]]:
    """k8s/monitoring.yaml: the jobs' PodMonitor and alerts, the dashboard, the device exporter."""
    out = [
        job_pod_monitor(spec.namespace),
        alert_rules(spec.namespace),
        dashboard_config_map(dashboard_json),
    ]
    if spec.instance.neuron:
        out += neuron_monitor(spec)
    return out
