"""The compiler's own cache counters: proof of a warm start that is not a timing.

torch.compile counts, per process, every lookup in its on-disk caches:
counters["inductor"]["fxgraph_cache_hit" | "_miss" | "_bypass"] (compiled FX graphs) and
counters["aot_autograd"]["autograd_cache_hit" | "_miss" | "_bypass"] (the joint forward and
backward graphs). A warm start is one whose lookups hit and none miss.

This module imports torch: only the trainer imports it (the rest of the package is torch-free).
"""

from __future__ import annotations

from typing import Any

KEYS = {
    "inductor": ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass"),
    "aot_autograd": ("autograd_cache_hit", "autograd_cache_miss", "autograd_cache_bypass"),
}


def snapshot() -> dict[str, int]:
    """This process's counts so far (zeros where torch.compile never ran)."""
    out: dict[str, int] = {}
    try:  # private to torch (verified 2.9, 2.13): without it, no proof either way
        from torch._dynamo.utils import counters
    except ImportError:
        return out

    for group, keys in KEYS.items():
        table: Any = counters[group]
        for key in keys:
            out[key] = int(table.get(key, 0))
    return out


def describe(counts: dict[str, int]) -> str:
    return (
        f"FX graph cache {counts.get('fxgraph_cache_hit', 0)} hit(s), "
        f"{counts.get('fxgraph_cache_miss', 0)} miss(es); AOTAutograd cache "
        f"{counts.get('autograd_cache_hit', 0)} hit(s), "
        f"{counts.get('autograd_cache_miss', 0)} miss(es)"
    )
