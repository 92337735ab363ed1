"""Looking at runs: status, logs, list (from the run folder and the backend).

Modules:
  runinfo      what a run left in its folder: state, metrics, summary, rank 0, workers
  history      how a run went: metrics, timing, price basis
  progress     a run's progress as one record, for both backends (status, list)
  exporter     /metrics for Prometheus, read from the run folder at every scrape
  cost         progress, ETA and money: the line `status` prints under a running job
  report       `report`: a run as a table and as report.png
  top          `top`: a live table, one row per rank
  tensorboard  `tensorboard`: TensorBoard on a run's events, or on every run's
"""
