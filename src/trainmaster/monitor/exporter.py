"""`/metrics` of a job for Prometheus, read from its run folder at every scrape.

Served by the process that watches the job for its whole life, with the official client
(prometheus_client): the local supervisor (backends/local/supervisor.py), and on Kubernetes every
pod's first process (backends/kubernetes/publish.py) on port METRICS_PORT, the series only from
the pod holding rank 0 (the PodMonitor of cluster/monitoring.py scrapes them all).
Why the run folder and not a registry inside the training step: the folder is already where
rank 0 records every step (metrics.jsonl), each save and stand-still (timeline.jsonl), hangs,
preemptions and restarts, for the built-in trainer and for a custom script's log_metrics alike;
reading it costs the training processes nothing and needs no port per rank.

Every series carries `job_name` (not `job`: Prometheus sets `job` to the scrape job) and
`rank="0"`: they are rank 0's, the job's own. Names follow Prometheus' conventions (base units,
_total for counters, _seconds); SERIES lists them, the dashboard and the alert rules use only
those (tests/monitor/test_exporter.py checks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trainmaster import files
from trainmaster.monitor import history, runinfo
from trainmaster.run import goodput, saves, state, timeline
from trainmaster.storage import RunPaths

METRICS_PORT = 9400  # in a pod; a local job takes any free port and writes it to TARGETS
TARGETS = "prometheus-targets.json"  # in the run folder: Prometheus' file_sd format
LABELS = ("job_name", "rank")

# name: (type, help); the key of metrics.jsonl for the ones read off the newest row
ROW_GAUGES = {
    "trainmaster_step": ("step", "The newest step rank 0 logged"),
    "trainmaster_loss": ("loss", "Training loss at the newest step"),
    "trainmaster_seq_per_second": ("seq_per_s", "Sequences per second at the newest step"),
    "trainmaster_tokens_per_second": ("tokens_per_s", "Tokens per second at the newest step"),
    "trainmaster_mfu": ("mfu", "Model FLOPs utilisation at the newest step (0..1)"),
}
SERIES = (
    *ROW_GAUGES,
    "trainmaster_max_steps",
    "trainmaster_eta_seconds",
    "trainmaster_last_step_timestamp_seconds",
    "trainmaster_goodput_ratio",
    "trainmaster_time_seconds",
    "trainmaster_checkpoint_saves_total",
    "trainmaster_checkpoint_write_seconds_total",
    "trainmaster_checkpoint_bytes_total",
    "trainmaster_checkpoint_standstill_seconds_total",
    "trainmaster_restarts_total",
    "trainmaster_hangs_total",
    "trainmaster_preemptions_total",
    "trainmaster_rollbacks_total",
    "trainmaster_rollback_steps_lost_total",
    "trainmaster_finished",
)


class RunCollector(Collector):
    """The job's series, read at each scrape; none while `active()` says another serves them."""

    def __init__(
        self,
        run: RunPaths,
        job: str,
        phase: Callable[[], state.Phase],
        active: Callable[[], bool] = lambda: True,
        job_retries: int = 0,  # a pod's: the gang's restarts before its attempt (no state.json)
    ):
        self.run, self.job, self.phase, self.active = run, job, phase, active
        self.job_retries = job_retries

    def collect(self) -> Iterator[Metric]:
        if not self.active():
            return
        # state.json's launch and end times where the run has one (a local job), so that the
        # goodput here is measured over the window `report` and `status` use (runinfo.goodput_of).
        known = history.read_state(self.run) or state.RunState(
            job=self.job, backend="kubernetes", job_retries=self.job_retries
        )
        st = known.model_copy(update={"phase": self.phase()})
        s = runinfo.status_of(self.run, st)
        labels = [self.job, "0"]

        def gauge(name: str, doc: str, value: float | None) -> Iterator[Metric]:
            if value is not None:
                g = GaugeMetricFamily(name, doc, labels=LABELS)
                g.add_metric(labels, value)
                yield g

        def counter(name: str, doc: str, value: float) -> Metric:
            c = CounterMetricFamily(name.removesuffix("_total"), doc, labels=LABELS)
            c.add_metric(labels, value)
            return c

        for name, (key, doc) in ROW_GAUGES.items():
            yield from gauge(name, doc, _number((s.last or {}).get(key)))
        yield from gauge("trainmaster_max_steps", "Steps the run is heading for", s.max_steps)
        yield from gauge(
            "trainmaster_eta_seconds", "Time to the last step at the recent pace", s.eta_s
        )
        events = timeline.read(self.run.timeline)
        stepped = [float(e.end) for e in events if isinstance(e, timeline.Steps)]
        yield from gauge(
            "trainmaster_last_step_timestamp_seconds",
            "When rank 0 last finished a step (Unix time)",
            max(stepped) if stepped else _mtime(self.run.metrics) if s.last else None,
        )
        g = runinfo.goodput_of(events, st)
        if g is not None:
            yield from gauge("trainmaster_goodput_ratio", "Productive share of wall time", g.ratio)
            parts = GaugeMetricFamily(
                "trainmaster_time_seconds",
                "Wall time by where it went (run/goodput.py KINDS)",
                labels=[*LABELS, "part"],
            )
            for kind in goodput.KINDS:
                parts.add_metric([*labels, kind], g.seconds.get(kind, 0.0))
            yield parts
        written = saves.stats(events)
        yield counter("trainmaster_checkpoint_saves_total", "Checkpoints written", written["count"])
        yield counter(
            "trainmaster_checkpoint_write_seconds_total",
            "Seconds spent writing checkpoints (in the background)",
            written["total_s"],
        )
        yield counter(
            "trainmaster_checkpoint_bytes_total", "Bytes of checkpoints written", written["bytes"]
        )
        yield counter(
            "trainmaster_checkpoint_standstill_seconds_total",
            "Seconds training stood still for checkpoints",
            written["blocked_s"],
        )
        yield counter("trainmaster_restarts_total", "Restarts of the worker group", s.restarts)
        yield counter("trainmaster_hangs_total", "Hangs the watchdogs caught", len(s.hangs))
        yield counter(
            "trainmaster_preemptions_total", "SIGTERMs honoured with a checkpoint", s.preemptions
        )
        yield counter(
            "trainmaster_rollbacks_total",
            "Divergences rolled back to a checkpoint",
            s.divergence["rollbacks"],
        )
        yield counter(
            "trainmaster_rollback_steps_lost_total",
            "Steps the rollbacks took back",
            s.divergence["rollback_steps_lost"],
        )
        yield from gauge(
            "trainmaster_finished",
            "1 once the workers wrote their summary",
            1.0 if s.summary else 0.0,
        )


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


@dataclass
class Exporter:
    """A /metrics server on its own daemon thread; stop() closes it."""

    port: int
    stop: Callable[[], None]


def serve(collector: RunCollector, *, port: int, addr: str = "0.0.0.0") -> Exporter:
    """Serve the collector's series at http://ADDR:PORT/metrics (port 0: any free one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server, thread = start_http_server(port, addr=addr, registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5)

    return Exporter(int(server.server_port), stop)


def write_targets(run: RunPaths, host: str, port: int) -> Path:
    """RUN/prometheus-targets.json in Prometheus' file_sd format, for a local job's free port:
    point a `file_sd_configs` at it and Prometheus finds the job, wherever it listens."""
    path = run.dir / TARGETS
    files.write_json(path, [{"targets": [f"{host}:{port}"], "labels": {}}])
    return path


def serve_in_background(run: RunPaths, job: str, phase: Callable[[], state.Phase]) -> Exporter:
    """A local job's exporter on a free port of this host, announced in TARGETS."""
    exporter = serve(RunCollector(run, job, phase), port=0, addr="127.0.0.1")
    targets = write_targets(run, "127.0.0.1", exporter.port)

    def stop() -> None:  # a job that ended is no target any more (its series go stale)
        targets.unlink(missing_ok=True)
        exporter.stop()

    return Exporter(exporter.port, stop)
