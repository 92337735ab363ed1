"""The training program: `python -m trainmaster.train --job STORAGE/runs/JOB/job.toml`.

torchrun starts it on every worker. It checks everything it can before it imports torch or
joins the process group (config vs WORLD_SIZE, run folder, shards, the checkpoint to resume
from, the first shard it reads), so bad input ends every rank at once with one `error:` line
and exit code 2, and nothing waits on a peer that has already given up.

Modules, in the order a run uses them:
  preflight   torch-free checks and the plan of the run (what to resume, first shard)
  dataset     shard headers, whole-shard loading, the file and sample order (numpy only)
              (the checkpoints folder, torch-free, is the run folder's: run/checkpoints.py)
  device      process group, device (cpu/cuda/xla), collectives, precision
  model       BertForPreTraining with the masked-positions-only MLM head; FLOPs per sequence
  data        the batch iterator over shards with a resumable position and prefetch
  optim       AdamW / LAMB, parameter groups and the learning-rate schedules
  step        one optimizer step (micro-batches, gradient reduction, clipping, update)
  checkpoint  the package: stage, write and load model, optimizer, scheduler, RNG and data
              position; rank 0's writer process, off the training thread's GIL
  watchdog    the hang watchdog: stack dumps and a restart instead of a 30-minute wait
  health      node preflight: device, matmul, all-reduce, disk, shm, Neuron and EFA devices
  preempt     SIGTERM: a checkpoint of the current step, then stop (not a failure)
  rollback    divergence: the verdict of each window, the rollback in the running processes
  metrics     metrics.jsonl, TensorBoard, log lines, rank0.json and summary.json
  trainsetup  the run's start-up: model, optimizer and data resumed exactly (build), then
              the writer process, SIGTERM handler and watchdog (start; close undoes it)
  loop        the training loop on a started setup: steps, checkpoints, preemption, summary
And beside them:
  env         what torchrun tells a worker, from its environment
  devices     the device table: precision, attention, compile per device kind
  netplugin   which NCCL network plugin a CUDA worker really uses
  nodefault   the node mark a restart avoids, and the device probe after a hang
  scriptnet   the trainer's safety net for your own script, run by the entry shim
  scriptsettings  the job file's keys that net reads, without the config model
  faults      fault injection for the end-to-end tests
  __main__    `python -m trainmaster.train --job ...`
"""
