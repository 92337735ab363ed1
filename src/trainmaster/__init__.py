"""trainmaster: multi-node BERT pretraining on Kubernetes accelerator clusters and on one machine.

Packages, top down (pyproject.toml's layers contract keeps imports one way):
  cli          the thin CLI: parse, call the API, print, exit
  api          the Python API the CLI is a layer over
  export       a job in other tools' formats (TorchX)
  estimate     time, node-hours and cost of a job before launch
  backends     where jobs run, behind one interface: local processes or Volcano jobs
  monitor      looking at runs: status, progress, cost, report, top, TensorBoard, /metrics
  cluster      the EKS cluster, its nodes, add-ons, storage and image (`cluster plan | up`)
  launch       what every backend runs: the torchrun line, the entry shim, the local agent
  train        the training program, torchrun's worker
  compile      the shared compile cache: fingerprint, lock, per-device settings
  data         text -> BERT pretraining shards, and their checks
  run          the run folder's files, their writers and readers
  schemas      the published schemas manifests are validated against
  config       the job file: typed sections, validation, derived values, files, presets
Modules:
  catalog      instance types: one data table, every figure with its source
  storage      the storage layout: every path under STORAGE is computed there
  naming       Kubernetes object-name rules, in one place
  errors       errors a user can fix, and the CLI's exit codes
  files        atomic writes: a reader sees the old file or the new one
  yamltext     the one YAML renderer of manifests and plan files
  worker       what your own training script imports: cheap helpers, no torch
  __main__     `python -m trainmaster` is the `trainmaster` command
"""

__version__ = "0.1.0"
