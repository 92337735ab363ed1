"""The job file's keys the safety net for a custom script uses (train/scriptnet.py), read cheaply:
launch writes the resolved job, so tomllib reads it without pydantic or the config model."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmaster import catalog

DEVICES = ("auto", "cpu", "cuda", "xla", "neuron")  # train.device's values (a test compares)
DIVERGENCE = ("rollback", "stop", "off")  # train.on_divergence's (the same test)


@dataclass(frozen=True)
class Settings:
    """The job's keys the net uses."""

    preflight: bool
    hang_timeout: float | None
    device: str
    keep_checkpoints: int
    instance: catalog.InstanceType
    on_divergence: str = "rollback"  # a script's non-finite loss stops it unless "off"


def settings(job_file: Path) -> Settings:
    """The net's keys of the job file. launch writes the resolved job (jobfile.render: every
    key that has a value, checked by the config), so tomllib reads them: pydantic and the
    config model would cost every worker a fifth of a second the script does not need. A file
    that is not such a job (written by hand, a missing key, a bad value) goes through the full
    loader, which fills in defaults or says what is wrong."""
    try:
        found = _resolved(tomllib.loads(job_file.read_text(encoding="utf-8")))
    except tomllib.TOMLDecodeError:
        found = None
    if found is not None:
        return found
    from trainmaster.config import jobfile

    cfg = jobfile.load(job_file)
    t = cfg.train
    return Settings(
        t.preflight, t.hang_timeout, t.device, t.keep_checkpoints, cfg.derived.instance,
        t.on_divergence,
    )  # fmt: skip


def _resolved(data: dict[str, Any]) -> Settings | None:
    """Settings when every key is there with a value the config allows, else None."""
    job, train, k8s = ({**v} if isinstance(v := data.get(k), dict) else {}
                       for k in ("job", "train", "kubernetes"))  # fmt: skip
    hang, keep, node_type = (
        train.get("hang_timeout"),
        train.get("keep_checkpoints"),
        k8s.get("instance_type"),
    )
    if not (
        isinstance(train.get("preflight"), bool)
        and (hang is None or (type(hang) in (int, float) and hang >= 0))  # None: render omits it
        and type(keep) is int and keep >= 1
        and train.get("on_divergence") in DIVERGENCE
        and train.get("device") in DEVICES
        and job.get("backend") in ("local", "kubernetes")
        and node_type in catalog.CATALOG
    ):  # fmt: skip
        return None
    # as config.instance_of: the cluster's node type for kubernetes jobs, else a CPU host
    inst = catalog.CATALOG[node_type if job["backend"] == "kubernetes" else "cpu"]
    hang_s = None if hang is None else float(hang)
    return Settings(train["preflight"], hang_s, train["device"], keep, inst, train["on_divergence"])
