"""`trainmaster top JOB --backend kubernetes`: devices and workers of each running pod.

One exec per pod (the API's pods/exec, RBAC verb `create` on `pods/exec`) runs PROBE, a small
stdlib-only Python program, with the image's `python`. It
  - finds the pod's worker processes (/proc/*/environ with RANK, LOCAL_RANK and this POD_NAME),
  - runs the device tool once: `neuron-monitor -c CONFIG` (Neuron pods; the config asks for
    neuroncore_counters, memory_used and neuron_runtime_vcpu_usage every second, and the probe
    keeps the first report line and stops it), or `nvidia-smi --query-gpu=... --format=csv`
    (GPU pods),
  - measures each worker's CPU % (/proc/PID/stat over the tool's run, at least a second) and RSS,
  - prints one JSON object: {"workers": [...], "tool": ..., "output": RAW, "error": ...}.
The raw tool output is parsed here (parse_neuron_monitor, parse_nvidia_smi), so what is tested
against captured documents is exactly what runs. neuron-monitor's Prometheus endpoint was not
used: it needs a companion process and a port-forward per node; exec needs neither.

Rows: Neuron, one per NeuronCore in use, matched to its worker by the runtime's pid (the same
pid namespace: neuron-monitor runs in the pod), else by core index = local rank; GPU, one per
GPU, matched by GPU index = local rank (torchrun's cuda:LOCAL_RANK); workers without a device
row still get a row with CPU and memory.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from trainmaster import catalog
from trainmaster.errors import JobFailed, UserError
from trainmaster.monitor.top import Row

if TYPE_CHECKING:
    from trainmaster.backends.kubernetes.client import Cluster

TOOL_TIMEOUT_S = 15
EXEC_TIMEOUT_S = 30
MIB = 1 << 20
NEURON_MONITOR_CONFIG = {
    "period": "1s",
    "neuron_runtimes": [
        {
            "tag_filter": ".*",
            "metrics": [
                {"type": "neuroncore_counters"},
                {"type": "memory_used"},
                {"type": "neuron_runtime_vcpu_usage"},
            ],
        }
    ],
    "system_metrics": [{"type": "memory_info"}],
}
NVIDIA_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,name,utilization.gpu,memory.used,memory.total",
    "--format=csv,noheader,nounits",
]

PROBE = r"""
import json, os, select, subprocess, sys, tempfile, time
kind, timeout = sys.argv[1], float(sys.argv[2])
me = os.environ.get("POD_NAME", "")
tick, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
def cpu(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            v = f.read().rsplit(")", 1)[1].split()
        return int(v[11]) + int(v[12])
    except (OSError, IndexError, ValueError):
        return None
def rss(pid):
    try:
        with open("/proc/%d/statm" % pid) as f:
            return int(f.read().split()[1]) * page
    except (OSError, IndexError, ValueError):
        return None
workers = []
for d in os.listdir("/proc"):
    if not d.isdigit():
        continue
    try:
        with open("/proc/%s/environ" % d, "rb") as f:
            raw = f.read()
    except OSError:
        continue
    env = dict(kv.split(b"=", 1) for kv in raw.split(b"\0") if b"=" in kv)
    if b"RANK" in env and b"LOCAL_RANK" in env and env.get(b"POD_NAME", b"").decode() == me:
        workers.append({"pid": int(d), "rank": int(env[b"RANK"]), "local_rank": int(env[b"LOCAL_RANK"])})
t0 = time.monotonic()
c0 = dict((w["pid"], cpu(w["pid"])) for w in workers)
out = {"workers": workers, "tool": kind, "output": "", "error": ""}
cmd = json.loads(sys.argv[3])
try:
    if kind == "neuron":
        fd, path = tempfile.mkstemp(suffix=".json")
        os.write(fd, sys.argv[4].encode())
        os.close(fd)
        err = tempfile.TemporaryFile()
        p = subprocess.Popen(cmd + ["-c", path], stdout=subprocess.PIPE, stderr=err)
        ready = select.select([p.stdout], [], [], timeout)[0]
        out["output"] = p.stdout.readline().decode("utf-8", "replace") if ready else ""
        p.kill()
        code = p.wait()
        os.unlink(path)
        if not out["output"].strip():
            err.seek(0)
            out["error"] = "neuron-monitor gave no report (exit %s): %s" % (code, err.read().decode("utf-8", "replace").strip()[-300:])
    elif kind == "cuda":
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        out["output"] = r.stdout.decode("utf-8", "replace")
        if r.returncode:
            out["error"] = "nvidia-smi failed (exit %d): %s" % (r.returncode, r.stderr.decode("utf-8", "replace").strip()[-300:])
except OSError as e:
    out["error"] = "%s cannot run in the pod (%s)" % (cmd[0], e.strerror or e)
except subprocess.TimeoutExpired:
    out["error"] = "%s did not answer within %.0f s" % (cmd[0], timeout)
time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
dt = time.monotonic() - t0
for w in workers:
    c1, a = cpu(w["pid"]), c0.get(w["pid"])
    w["cpu_pct"] = 100.0 * (c1 - a) / tick / dt if c1 is not None and a is not None else None
    w["rss"] = rss(w["pid"])
print(json.dumps(out))
"""


def device_kind(pod: Any) -> str:
    """neuron | cuda | cpu, from the extended resources the pod's containers ask for."""
    for c in (pod.spec.containers if pod.spec else None) or []:
        limits = (c.resources.limits if c.resources else None) or {}
        if catalog.NEURON in limits or "aws.amazon.com/neuroncore" in limits:
            return "neuron"
        if catalog.NVIDIA_GPU in limits:
            return "cuda"
    return "cpu"


def probe_command(kind: str) -> list[str]:
    tool = ["neuron-monitor"] if kind == "neuron" else NVIDIA_QUERY if kind == "cuda" else ["true"]
    return [
        "python",
        "-c",
        PROBE,
        kind,
        str(TOOL_TIMEOUT_S),
        json.dumps(tool),
        json.dumps(NEURON_MONITOR_CONFIG),
    ]


def _worker_rows(pod: str, workers: list[dict[str, Any]]) -> dict[int, Row]:
    return {
        int(w["pid"]): Row(
            pod, int(w["rank"]), int(w["local_rank"]), int(w["pid"]), w.get("cpu_pct"), w.get("rss")
        )
        for w in workers
    }


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def parse_neuron_monitor(pod: str, doc: dict[str, Any], workers: list[dict[str, Any]]) -> list[Row]:
    """One row per NeuronCore in use (see the module docstring), plus idle workers."""
    base = _worker_rows(pod, workers)
    by_local = {r.local_rank: r for r in base.values()}
    hw = doc.get("neuron_hardware_info") or {}
    dev_mem, per_dev = (
        _num(hw.get("neuron_device_memory_size")),
        _num(hw.get("neuroncore_per_device_count")),
    )
    core_total = int(dev_mem / per_dev) if dev_mem and per_dev else None
    rows, used = [], set()
    for rt in doc.get("neuron_runtime_data") or []:
        report, pid = rt.get("report") or {}, rt.get("pid")
        cores = (report.get("neuroncore_counters") or {}).get("neuroncores_in_use") or {}
        mem = (report.get("memory_used") or {}).get("neuron_runtime_used_bytes") or {}
        per_core = (mem.get("usage_breakdown") or {}).get("neuroncore_memory_usage") or {}
        vcpu = (report.get("neuron_runtime_vcpu_usage") or {}).get("vcpu_usage") or {}
        for idx in sorted(cores, key=lambda k: int(k)):
            owner = base.get(pid) if isinstance(pid, int) else None
            owner = owner or by_local.get(int(idx))
            row = Row(
                pod,
                None,
                None,
                pid if isinstance(pid, int) and pid else None,
                note=str(rt.get("error") or ""),
            )
            if owner is not None:
                used.add(owner.pid)
                row.rank, row.local_rank, row.pid = owner.rank, owner.local_rank, owner.pid
                row.cpu_pct, row.rss_bytes = owner.cpu_pct, owner.rss_bytes
            if row.cpu_pct is None and vcpu:
                row.cpu_pct = (_num(vcpu.get("user")) or 0.0) + (_num(vcpu.get("system")) or 0.0)
            if row.rss_bytes is None and _num(mem.get("host")) is not None:
                row.rss_bytes = int(mem["host"])
            breakdown = per_core.get(idx) or {}
            row.device, row.util_pct = f"nc{idx}", _num(cores[idx].get("neuroncore_utilization"))
            row.dev_mem_used = (
                int(sum(v for v in breakdown.values() if _num(v) is not None))
                if breakdown
                else None
            )
            row.dev_mem_total = core_total
            rows.append(row)
    return rows + [r for pid, r in base.items() if pid not in used]


def parse_nvidia_smi(pod: str, text: str, workers: list[dict[str, Any]]) -> list[Row]:
    """One row per GPU (`index, name, utilization.gpu, memory.used, memory.total`, MiB), plus
    workers without a GPU row."""
    base = _worker_rows(pod, workers)
    by_local = {r.local_rank: r for r in base.values()}
    rows, used = [], set()
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 5 or not cells[0].isdigit():
            continue
        index = int(cells[0])

        def number(cell: str) -> float | None:
            try:
                return float(cell)
            except ValueError:  # "[N/A]", "[Not Supported]"
                return None

        owner = by_local.get(index)
        row = Row(pod, None, None, None, note=cells[1])
        if owner is not None:
            used.add(owner.pid)
            row = Row(
                pod,
                owner.rank,
                owner.local_rank,
                owner.pid,
                owner.cpu_pct,
                owner.rss_bytes,
                note=cells[1],
            )
        used_mib, total_mib = number(cells[3]), number(cells[4])
        row.device, row.util_pct = f"cuda:{index}", number(cells[2])
        row.dev_mem_used = int(used_mib * MIB) if used_mib is not None else None
        row.dev_mem_total = int(total_mib * MIB) if total_mib is not None else None
        rows.append(row)
    return rows + [r for pid, r in base.items() if pid not in used]


def parse_probe(pod: str, text: str) -> list[Row]:
    """The probe's JSON line -> rows; a pod whose probe or tool failed gets one row saying why."""
    try:
        out = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [Row(pod, None, None, None, note=f"probe gave no JSON: {text.strip()[-200:]}")]
    workers, raw, error = out.get("workers") or [], out.get("output") or "", out.get("error") or ""
    rows: list[Row]
    if out.get("tool") == "neuron" and raw.strip():
        try:
            rows = parse_neuron_monitor(pod, json.loads(raw), workers)
        except ValueError:
            rows = [*_worker_rows(pod, workers).values()]
            error = error or "neuron-monitor's report is not JSON"
    elif out.get("tool") == "cuda":
        rows = parse_nvidia_smi(pod, raw, workers)
    else:
        rows = [*_worker_rows(pod, workers).values()]
    if error:
        rows = rows or [Row(pod, None, None, None)]
        for r in rows:
            r.note = error
    return rows or [Row(pod, None, None, None, note="no worker processes in the pod yet")]


def exec_probe(cluster: Cluster, pod: str, container: str | None, kind: str) -> str:
    """Run PROBE in the pod; its stdout (JobFailed when the exec itself fails)."""
    from trainmaster.backends.kubernetes.client import call, exec_stream

    with call(cluster, "exec in", "pods", pod):
        ws = exec_stream(
            cluster, pod, cluster.namespace, probe_command(kind), container=container, stdin=False
        )
    try:
        ws.run_forever(timeout=EXEC_TIMEOUT_S)
        stdout, stderr = ws.read_stdout(), ws.read_stderr()
    finally:
        ws.close()
    if not str(stdout).strip():
        raise JobFailed(
            f"the monitoring probe in pod {pod} printed nothing: {str(stderr).strip()[-300:]}"
        )
    return str(stdout)


def k8s_rows(cluster: Cluster, job: str) -> list[Row]:
    """Rows of every running pod of the job (UserError: no such job; none running yet).

    The pods come from status's paged list; every pod of a job has one template, so the
    device kind and container are read from one pod, and the probes run CONNECTIONS at a
    time (one after another, 1,024 pods would take 1,024 exec round trips)."""
    from concurrent.futures import ThreadPoolExecutor

    from trainmaster.backends.kubernetes import status as k8s_status
    from trainmaster.backends.kubernetes.client import CONNECTIONS, NotFound, call

    st = k8s_status.status(cluster, job, find_rank0=False)  # "no job NAME in namespace ..."
    running = [p.name for p in st.pods if p.phase == "Running"]
    if not running:
        raise UserError(
            f"job {job} has no running pods (phase {st.phase}, Volcano {st.volcano_phase}); "
            f"see `trainmaster status {job} --backend kubernetes`",
            where="JOB",
        )
    with call(cluster, "get", "pods", running[0]):
        first = cluster.core.read_namespaced_pod(running[0], cluster.namespace)
    kind = device_kind(first)
    container = first.spec.containers[0].name if first.spec and first.spec.containers else None

    def probe(name: str) -> list[Row]:
        try:
            return parse_probe(name, exec_probe(cluster, name, container, kind))
        except (JobFailed, NotFound) as exc:  # the pod ended or its probe failed: say so, go on
            return [Row(name, None, None, None, note=str(exc))]

    with ThreadPoolExecutor(max_workers=min(CONNECTIONS, len(running))) as pool:
        return [row for rows in pool.map(probe, running) for row in rows]
