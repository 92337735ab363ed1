"""The estimate's arithmetic, pure: one node's rate and the node counts -> every figure of the
table (the formulas: trainmaster/estimate/__init__.py)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from trainmaster import catalog
from trainmaster.config import JobConfig
from trainmaster.errors import UserError
from trainmaster.estimate.spot import SpotPrice
from trainmaster.monitor import history

DEFAULT_NODES = "2,4,16,64"
MAX_NODES = 100_000


@dataclass(frozen=True)
class Rate:
    per_node: float  # seq/s of one node (a multi-node measurement divided back)
    basis: str  # "measured" (--from-run) | "measured here" (--measure) | "published" | "given"
    source: str


@dataclass(frozen=True)
class Row:
    nodes: int
    workers: int
    grad_accum: int | None  # None: the global batch does not divide over these workers
    per_worker: float  # sequences per worker per optimizer step
    below_published: bool  # per_worker below the published scaling run's: expect a lower rate
    efficiency: float
    efficiency_basis: str  # "1 node" | "published" | "interpolated" | "extrapolated" | "assumed"
    seq_per_s: float
    time_s: float
    node_hours: float
    cost: float
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Estimate:
    job: str
    instance: str
    max_steps: int
    global_batch: int
    sequences: int
    rate: Rate
    scaling: str  # where the efficiencies come from
    price_per_node_hour: float
    price_source: str
    rows: tuple[Row, ...]
    assumptions: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_nodes(text: str) -> list[int]:
    """'2,4,16,64' -> [2, 4, 16, 64] (sorted, no repeats); UserError naming --nodes otherwise."""
    counts = set()
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= MAX_NODES:
            raise UserError(
                f"{part!r} is not a node count; give whole numbers from 1 to "
                f"{MAX_NODES:,} separated by commas, e.g. {DEFAULT_NODES}",
                where="--nodes",
            )
        counts.add(int(part))
    return sorted(counts)


def efficiency(scaling: catalog.Scaling, nodes: int) -> tuple[float, str]:
    """(efficiency, basis) at `nodes`: a published point, log-interpolated between points, or
    extrapolated past the last one with the same loss per doubling as from 1 node to it."""
    if nodes <= 1:
        return 1.0, "1 node"
    points = [(1, 1.0), *sorted(scaling.points)]
    for (n0, e0), (n1, e1) in zip(points, points[1:], strict=False):
        if nodes == n1:
            return e1, "published"
        if n0 < nodes < n1:
            t = math.log(nodes / n0) / math.log(n1 / n0)
            return e0 * (e1 / e0) ** t, "interpolated"
    n_last, e_last = points[-1]
    return e_last ** (math.log(nodes) / math.log(n_last)), "extrapolated"


def scaling_for(instance: str) -> tuple[catalog.Scaling, bool]:
    """The instance type's published scaling, or trn1's as a stand-in (False: borrowed)."""
    own = catalog.SCALING.get(instance)
    return (own, True) if own else (catalog.SCALING[catalog.DEFAULT_SCALING], False)


def per_node(total: float, nodes: int, instance: str) -> float:
    """One node's rate from a rate measured on `nodes` nodes (efficiency divided back out)."""
    return total / (nodes * efficiency(scaling_for(instance)[0], nodes)[0])


def estimate(
    cfg: JobConfig, rate: Rate, nodes: list[int], spot: SpotPrice | None = None
) -> Estimate:
    """Every figure of the table, from the job, a one-node rate and the node counts."""
    inst = cfg.derived.instance
    sc, own = scaling_for(inst.name)
    price = history.price_of(cfg, 1)
    assert price is not None  # a config is given
    # [cluster] price_per_hour is the user's own figure and wins over a looked-up Spot price
    spot = spot if price.source == "catalog" else None
    per_node_hour = spot.per_node_hour if spot else price.per_node_hour
    t = cfg.train
    sequences = t.max_steps * t.global_batch_size
    workers_per_node = cfg.job.nproc_per_node
    rows = []
    for n in nodes:
        eff, basis = efficiency(sc, n)
        if not own and n > 1:
            basis = "assumed"
        workers = n * workers_per_node
        per_step = t.batch_size * workers
        accum = t.global_batch_size // per_step if t.global_batch_size % per_step == 0 else None
        notes = []
        if accum is None:
            notes.append(
                f"does not run as is: global batch {t.global_batch_size:,} is not a "
                f"multiple of batch_size {t.batch_size} x {workers:,} workers"
            )
        mine = t.global_batch_size / workers
        below = n > 1 and mine < sc.reference_per_worker(n)
        rate_n = rate.per_node * n * eff
        time_s = sequences / rate_n
        node_hours = n * time_s / 3600.0
        rows.append(
            Row(
                n,
                workers,
                accum,
                mine,
                below,
                eff,
                basis,
                rate_n,
                time_s,
                node_hours,
                node_hours * per_node_hour,
                tuple(notes),
            )
        )
    scaling = (
        f"published for {inst.name}: {sc.setup}; {sc.source}"
        if own
        else f"assumed: no published multi-node figure for {inst.name}, so trn1.32xlarge's is "
        f"used ({sc.setup}; {sc.source})"
    )
    assumptions = (
        f"sequences to train = max_steps {t.max_steps:,} x global batch {t.global_batch_size:,} "
        f"= {sequences:,}, the same on every node count (accumulation is derived)",
        "efficiency(N) = rate of N nodes / (N x one node's rate): published points, "
        "log-interpolated between them; past the last point it keeps losing the same share per "
        "doubling of nodes (extrapolated)",
        f"the published scaling ran {_reference(sc)} sequences per worker per optimizer step; "
        "rows with fewer (marked *; below_published in --json) spend a larger share of each step in the all-reduce, "
        "so expect a lower rate there than shown",
        "only training steps take time: no start-up, compilation, checkpoints, restarts or idle "
        f"nodes; cost is the {'Spot price now' if spot else 'on-demand list price'} x "
        "node-hours (no storage, network, control plane), not a bill",
    )
    price_source = (
        spot.source
        if spot
        else "[cluster] price_per_hour of the job file"
        if price.source != "catalog"
        else f"catalog: EC2 on-demand list price of {inst.name}, us-east-1, Linux"
        + (" (a generic CPU host, m7i.8xlarge-sized)" if inst.name == "cpu" else "")
    )
    return Estimate(
        cfg.job.name,
        inst.name,
        t.max_steps,
        t.global_batch_size,
        sequences,
        rate,
        scaling,
        per_node_hour,
        price_source,
        tuple(rows),
        assumptions,
    )


def _reference(sc: catalog.Scaling) -> str:
    if sc.global_batch is not None:
        return f"global batch {sc.global_batch:,} / (N x {sc.workers_per_node})"
    return f"{sc.per_worker_batch:,}"
