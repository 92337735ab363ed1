"""Running the precompile job (compile/precompile.py says what it is) on the job's backend.

local       `<job>-precompile` through the local launcher (lock, supervisor, torchrun agents),
            awaited to its end; the result is checked: the cacheset's fingerprint must be the
            job's and compiled graphs must be there, else JobFailed.
kubernetes  the objects of launch/volcano.objects(precompile=True), which carry the precompile
            environment of compile/cache.py (on Neuron: torchrun under
            neuron_parallel_compile); submitted, not awaited (follow it with `status`).

The run folder of a previous precompile is removed first: it is disposable, and a stale
checkpoint in it would make the new run resume instead of compiling from step 0.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable
from typing import Any

from trainmaster.backends.local import launcher as local
from trainmaster.compile import lock
from trainmaster.compile import precompile as pre_mod
from trainmaster.config import JobConfig
from trainmaster.errors import JobFailed, UserError
from trainmaster.run import state
from trainmaster.storage import RunPaths, Storage

POLL_S = 0.5


def remove_previous(run: RunPaths) -> None:
    """The folder of a finished earlier precompile run goes; a running one is refused."""
    if not run.dir.exists():
        return
    if run.state.exists() and state.observed(run.state).phase in ("pending", "running"):
        raise UserError(
            f"{run.dir.name} is running; wait for it or `trainmaster cancel {run.dir.name}`",
            where="job.name",
        )
    shutil.rmtree(run.dir)


def plan_local(
    cfg: JobConfig, store: Storage, *, steps: int, wait_lock_s: float, dry_run: bool = False
) -> tuple[JobConfig, local.Plan]:
    """Every check, nothing started; unless dry_run, a finished previous precompile run is
    removed (a running one is refused either way)."""
    pre = pre_mod.precompile_config(cfg, steps)
    store.ensure_writable()
    if not dry_run:
        remove_previous(RunPaths(store.run_dir(pre.job.name)))
    plan = local.plan(pre, store, resume=dry_run, precompile=True)
    return pre, dataclasses.replace(plan, lock_wait_s=wait_lock_s)


def run_local(
    pre: JobConfig,
    store: Storage,
    plan: local.Plan,
    *,
    on_wait: Callable[[lock.Holder], None] | None = None,
    on_start: Callable[[state.RunState], None] | None = None,
) -> dict[str, Any]:
    """Start the precompile job, wait for its end, return compile/precompile.outcome."""
    st = local.start(pre, store, plan, on_wait=on_wait)
    try:
        if on_start is not None:
            on_start(st)
        while (final := state.observed(plan.run.state)).phase not in state.FINAL:
            time.sleep(POLL_S)  # waiting for the job's processes (bounded by the job itself)
    except KeyboardInterrupt:
        local.cancel(plan.run)
        raise
    result = pre_mod.outcome(store, pre) | {"phase": final.phase}
    if final.phase != "succeeded":
        raise JobFailed(
            f"precompile job {pre.job.name} {final.phase}: "
            f"{final.message or 'see `trainmaster logs ' + pre.job.name + '`'}"
        )
    if not result["ok"]:
        raise JobFailed(
            f"precompile job {pre.job.name} ended, but the cache is not warm for the "
            f"job (fingerprint {result['fingerprint']}, entries {result['entries']})"
        )
    return result
