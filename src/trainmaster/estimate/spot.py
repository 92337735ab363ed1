"""The Spot price an estimate uses: EC2's price now, looked up, never from the catalog.

Spot prices move with supply and differ per zone, so no list price stands for them (the catalog
holds on-demand prices only). `estimate --spot`, or a job file with cluster.spot, asks EC2
(DescribeSpotPriceHistory through cluster/aws.py: AWS credentials needed) for the instance
type's price now in every zone of cluster.region that sells it, and prices the node-hours at
the highest of them: the node group's zone is chosen at `cluster plan`, and a dearer zone must
not make the estimate look cheaper than the bill. `[cluster] price_per_hour` still overrides.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmaster.config import JobConfig
from trainmaster.errors import UserError


@dataclass(frozen=True)
class SpotPrice:
    per_node_hour: float
    source: str  # the sentence the estimate prints after "price:"


def spot_price(cfg: JobConfig) -> SpotPrice:
    """The highest Spot price of cfg's instance type across cluster.region's zones, now."""
    from trainmaster.cluster import aws  # boto3: only when a Spot price is asked for

    inst, region = cfg.derived.instance.name, cfg.cluster.region
    prices = aws.spot_prices(region, inst)
    if not prices:
        raise UserError(
            f"EC2 reports no Spot price for {inst} in {region}: it is not sold as Spot there; "
            "estimate on-demand (without --spot) or set [cluster] price_per_hour",
            where="--spot",
        )
    zone = max(prices, key=lambda z: prices[z])
    each = ", ".join(f"{z} ${p:,.4f}" for z, p in prices.items())
    return SpotPrice(
        prices[zone],
        f"EC2 Spot price of {inst} now, the highest of {region}'s zones ({each}); Spot prices "
        "move, and a reclaimed node costs a restart from the last checkpoint (not counted)",
    )
