"""The shared compile cache (STORAGE/cache/CACHESET/): fingerprint, lock, per-device settings.

Modules, and who uses them:
  fingerprint  what changes the compiled graphs; fingerprint.json; compare -> differing fields
  lock         one job at a time per cacheset (.lock: pid, host, job, time; heartbeat)
  cache        per-device cache settings (environment, the neuron_parallel_compile wrapper),
               what a cacheset holds
  precompile   the precompile job (the same job, a few steps, compile mode) and its outcome
  counters     the compiler's own cache counters (imports torch: the trainer's only)

Everything but `counters` is torch-free: the operator side (CLI, launchers) imports it, and
`trainmaster --help` must start fast. This package never imports launch, cli or monitor.
"""
