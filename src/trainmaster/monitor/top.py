"""`trainmaster top JOB`: a live table, one row per rank (per device for multi-core ranks).

Local jobs: the worker processes are found from state.json (runinfo.workers: each node agent's
children, by their RANK); CPU % and resident memory come from psutil over a sampling window,
GPU utilisation and memory from NVML (the `nvidia-ml-py` package, imported only here and only
if installed; without it, or without a driver, the GPU columns are left out). Kubernetes jobs:
see backends/kubernetes/top.py. psutil and NVML are imported inside the functions: `--help`
stays fast.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from trainmaster.errors import UserError
from trainmaster.monitor import runinfo
from trainmaster.run import state
from trainmaster.storage import Storage

GIB = 1 << 30


@dataclass
class Row:
    node: str  # node index (local) or pod name (kubernetes)
    rank: int | None
    local_rank: int | None
    pid: int | None
    cpu_pct: float | None = None  # of one core (200 = two cores busy)
    rss_bytes: int | None = None
    device: str = ""  # "cuda:0", "nc3", ""
    util_pct: float | None = None
    dev_mem_used: int | None = None
    dev_mem_total: int | None = None
    note: str = ""


@dataclass(frozen=True)
class GpuUse:
    index: int
    util_pct: float | None
    used: int | None
    total: int | None


def nvml_usage(pids: Iterable[int]) -> dict[int, GpuUse]:
    """GPU of each pid that runs on one, through NVML; {} without nvidia-ml-py or a driver."""
    try:
        nvml: Any = importlib.import_module("pynvml")
    except ImportError:
        return {}
    wanted, out = set(pids), {}
    try:
        nvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: no GPU here
        return {}
    try:
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            util: float | None = None
            with contextlib.suppress(Exception):
                util = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid in wanted:
                    used = proc.usedGpuMemory  # None when the driver does not say (containers)
                    out[int(proc.pid)] = GpuUse(
                        i, util, int(used) if used is not None else None, total
                    )
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return out


def local_rows(st: state.RunState, window_s: float) -> list[Row]:
    """One row per live worker: CPU % over `window_s` seconds, RSS, and its GPU if it has one."""
    import psutil

    found = runinfo.workers(st)
    procs: dict[int, psutil.Process] = {}
    psutil.cpu_percent(None)  # the host's window too (host_line reads it)
    for w in found:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(w.pid)
            p.cpu_percent(None)  # starts the measurement window
            procs[w.pid] = p
    time.sleep(window_s)  # the CPU % sampling window (a measurement, not a wait for anything)
    gpus = nvml_usage(procs)
    rows = []
    for w in found:
        row = Row(str(w.node), w.rank, w.local_rank, w.pid)
        proc = procs.get(w.pid)
        try:
            if proc is None:
                raise psutil.NoSuchProcess(w.pid)
            with proc.oneshot():
                row.cpu_pct, row.rss_bytes = proc.cpu_percent(None), proc.memory_info().rss
        except psutil.Error:
            row.note = "exited"
        g = gpus.get(w.pid)
        if g is not None:
            row.device, row.util_pct = f"cuda:{g.index}", g.util_pct
            row.dev_mem_used, row.dev_mem_total = g.used, g.total
        rows.append(row)
    return rows


def host_line() -> str:
    import psutil

    vm = psutil.virtual_memory()
    return (
        f"host: CPU {psutil.cpu_percent(None):.0f}% of {psutil.cpu_count()} cores, memory "
        f"{(vm.total - vm.available) / GIB:.1f}/{vm.total / GIB:.1f} GiB"
    )


def running_state(store: Storage, job: str) -> state.RunState:
    run = runinfo.run_paths(store, job)
    st = state.observed(run.state)
    if st.phase not in ("pending", "running"):
        raise UserError(
            f"job {job} is {st.phase}: top shows the processes of a running job; "
            f"see `trainmaster report {job}`",
            where="JOB",
        )
    return st


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def table(rows: list[Row], title: str, caption: str = "") -> Table:
    has_dev = any(r.device for r in rows)
    t = Table(title=title, caption=caption or None)
    for col in ("node", "rank", "local rank", "pid", "CPU %", "memory GiB"):
        t.add_column(col, justify="left" if col == "node" else "right")
    if has_dev:
        for col in ("device", "util %", "device memory GiB"):
            t.add_column(col, justify="right")
    has_note = any(r.note for r in rows)
    if has_note:
        t.add_column("note")
    for r in sorted(
        rows, key=lambda r: (r.node, r.rank if r.rank is not None else 1 << 30, r.device)
    ):
        cells = [
            r.node,
            "-" if r.rank is None else str(r.rank),
            "-" if r.local_rank is None else str(r.local_rank),
            str(r.pid or "-"),
            "-" if r.cpu_pct is None else f"{r.cpu_pct:.0f}",
            _gib(r.rss_bytes),
        ]
        if has_dev:
            mem = (
                f"{_gib(r.dev_mem_used)} / {_gib(r.dev_mem_total)}"
                if r.dev_mem_total
                else _gib(r.dev_mem_used)
            )
            cells += [r.device or "-", "-" if r.util_pct is None else f"{r.util_pct:.0f}", mem]
        t.add_row(*cells, *([r.note] if has_note else []))
    return t


def watch(
    sample: Callable[[], Table | None],
    once: bool,
    interval_s: float,
    show: Callable[[Table], None],
    live: Any = None,
) -> None:
    """Print one table (`once`), or refresh it in place until `sample` returns None (the job
    ended) or Ctrl-C. Each sample takes its own measurement window, so no extra wait is needed
    beyond `interval_s` for kubernetes, where sampling is an API call."""
    first = sample()
    if first is None:
        return
    if once or live is None:
        show(first)
        return
    with live(first, refresh_per_second=4) as view, contextlib.suppress(KeyboardInterrupt):
        while True:
            nxt = sample()
            if nxt is None:
                return
            view.update(nxt)
            if interval_s > 0:
                time.sleep(interval_s)  # refresh cadence of a display
