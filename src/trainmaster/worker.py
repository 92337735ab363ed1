"""What a training script imports from trainmaster: cheap helpers, no torch, no pydantic.

    from trainmaster.worker import log_metrics
    log_metrics(step=step, loss=loss.item(), tokens_per_s=tps)   # rank 0 writes; others return

The script runs under `trainmaster launch` (the entry shim sets TRAINMASTER_RUN_DIR and the
rest) or by hand (rows then go to ./metrics.jsonl). Importing this module costs milliseconds:
it pulls in the standard library and run/metrics.py, nothing else.
"""

from __future__ import annotations

from trainmaster.run.metrics import drop_after, log_metrics

__all__ = ["drop_after", "log_metrics"]
