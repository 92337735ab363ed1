"""The thin CLI: parse arguments, call one API function, print, exit (docs/architecture.md 3.1).

Modules:
  app          the typer app, and the one place errors become exit codes
  options      options shared by several commands, declared once
  show         printing a JobStatus, the same for every backend
  job_cmd      launch, list, status, logs, cancel
  config_cmd   init, config validate | show
  data_cmd     data prepare | verify | inspect | stage
  compile_cmd  precompile, cache list | show | clear
  monitor_cmd  top, tensorboard, report
  estimate_cmd estimate: time, node-hours and cost before launch
  cluster_cmd  cluster plan | up | status | scale | down
  node_cmd     node list | clear
  export_cmd   export torchx | checkpoint
  demo_cmd     demo: the whole local flow in one command
"""
