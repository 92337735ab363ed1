"""The job file: its typed sections (the single source of truth), files on disk, presets.

Modules, top down (a layers contract inside the package keeps them so):
  jobfile  job files on disk: TOML, `--set` overrides, presets applied, the commented writer
  job      JobConfig: the job, model, data and training sections, validation, derived values
           (the node type, batch split, config hash)
  infra    the [kubernetes] and [cluster] sections
  base     what every section shares: the strict base model, number types, name rules
  presets  job presets for `trainmaster init --preset NAME`: overrides of the defaults, nothing more

This face names what the rest of trainmaster uses from the typed config; the file functions are
imported from jobfile, the presets from presets.
"""

from trainmaster.config.base import S3_READER
from trainmaster.config.infra import ClusterSection, KubernetesSection
from trainmaster.config.job import (
    BUILTIN_ENTRYPOINT,
    DEFAULT_VOCAB,
    MODEL_PRESETS,
    JobConfig,
    TrainSection,
    derive,
    is_valid_job_name,
)

__all__ = [
    "BUILTIN_ENTRYPOINT",
    "DEFAULT_VOCAB",
    "MODEL_PRESETS",
    "S3_READER",
    "ClusterSection",
    "JobConfig",
    "KubernetesSection",
    "TrainSection",
    "derive",
    "is_valid_job_name",
]
