"""Which NCCL network plugin a CUDA worker really uses, for its log and summary.json
(docs/architecture.md 5: 12.3).

On p5 the EFA path exists only through the aws-ofi-nccl plugin; when NCCL cannot find it, it
falls back to TCP sockets without failing, and a run is several times slower for no visible
reason. So the worker reports what its process has actually loaded, not what was configured:
the shared objects mapped into it (/proc/self/maps) after its first collective (NCCL creates
its communicators, and opens the plugin, at the first collective, not at init_process_group).

Names: NCCL dlopens `libnccl-net.so`, or `libnccl-net-<NCCL_NET_PLUGIN>.so` when that variable is
set (NCCL docs, env.html#nccl-net-plugin:
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-net-plugin); aws-ofi-nccl
installs `libnccl-net-ofi.so` (and a `libnccl-net.so` link in older releases) under
/opt/amazon/ofi-nccl/lib[/x86_64-linux-gnu] (aws/aws-ofi-nccl src/Makefile.am;
awslabs/awsome-distributed-training micro-benchmarks/nccl-tests/nccl-tests.Dockerfile). Its
tuner, `libnccl-ofi-tuner.so`, is a tuner plugin, not a network one, and is not reported.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

MAPS = Path("/proc/self/maps")
NOT_APPLICABLE = "n/a"  # gloo (cpu) and XLA (Neuron's own collectives) do not use NCCL
BUILT_IN = "none loaded (NCCL's built-in IB/socket transport)"
_PLUGIN = re.compile(r"^libnccl-net(-[^/]*)?\.so(\.[0-9.]+)?$")


def loaded_plugins(maps_text: str) -> list[str]:
    """Paths of NCCL network plugins among the mapped files, in first-seen order, no duplicates."""
    found: list[str] = []
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue
        path = fields[5].removesuffix(" (deleted)")
        if _PLUGIN.match(os.path.basename(path)) and path not in found:
            found.append(path)
    return found


def describe(
    device_kind: str, *, maps: Path = MAPS, environ: Mapping[str, str] | None = None
) -> str:
    """The plugin in use, for a log line and summary.json's `nccl_net_plugin`."""
    if device_kind != "cuda":
        return NOT_APPLICABLE
    environ = os.environ if environ is None else environ
    try:
        text = maps.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "unknown (cannot read the process's memory map)"
    plugins = loaded_plugins(text)
    wanted = environ.get("NCCL_NET_PLUGIN")
    if plugins:
        return ", ".join(plugins)
    return f"{BUILT_IN}; NCCL_NET_PLUGIN={wanted} was not loaded" if wanted else BUILT_IN
