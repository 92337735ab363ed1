"""What torchrun tells a worker, read from its environment.

Its own module, apart from preflight.py (which imports the data stage, numpy and the config), so
that the entry shim's safety net (scriptnet.py) reaches the process group through device.py
without importing anything a user's script does not need.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from trainmaster.errors import UserError


@dataclass(frozen=True)
class Env:
    """What torchrun tells a worker (or a single process started by hand)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    restarts: int = 0
    launched: bool = False  # started by torchrun (WORLD_SIZE set)

    @classmethod
    def read(cls, environ: Mapping[str, str] = os.environ) -> Env:
        def num(key: str, default: int) -> int:
            raw = environ.get(key, "")
            try:
                return int(raw) if raw != "" else default
            except ValueError as exc:
                raise UserError(f"not an integer: {raw!r}", where=key) from exc

        world = num("WORLD_SIZE", 1)
        return cls(
            rank=num("RANK", 0),
            local_rank=num("LOCAL_RANK", 0),
            world_size=world,
            local_world_size=num("LOCAL_WORLD_SIZE", world),
            node_rank=num("GROUP_RANK", 0),
            restarts=num("TORCHELASTIC_RESTART_COUNT", 0),
            launched="WORLD_SIZE" in environ,
        )
