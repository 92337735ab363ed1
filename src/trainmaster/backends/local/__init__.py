"""The local backend: jobs as processes on this machine.

Modules, from the CLI's side down to what the detached supervisor uses:
  backend     the Backend of local jobs: plan, submit, status, logs, cancel, list, top
  precompile  the precompile job on the local backend
  launcher    plan (every check before anything starts), start, cancel
  detach      start the run's supervisor detached, in a fork of the CLI when it can
  supervisor  one per run: set-up, a short loop over attempts, teardown, the verdict
  gang        one attempt's node agents: start, wait for an outcome, stop; a cancel's watch
  ending      the verdict (phase, nodes, message) from what the supervisor saw; pure
  outcome     an attempt's outcome and what follows it (verdict, job retry, none left); pure
  completion  a run whose work is done while an agent still waits
  rejoin      a lost node taken back into an elastic job
  agents      each node's torchrun command, its environment, the rendezvous of each attempt
  logs        `trainmaster logs` of a local run (rank 0 by default); a failed job's error
  netns       local nodes on a real network: a network namespace each
  rendezvous  rendezvous endpoints: a free loopback port for c10d, or a private etcd
"""
