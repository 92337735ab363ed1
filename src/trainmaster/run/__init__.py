"""The run folder (STORAGE/runs/JOB/): its files, their writers and readers.

Modules:
  state      state.json: what was started, where, and how it ended (local)
  metrics    metrics.jsonl: log_metrics() and its readers
  timeline   timeline.jsonl: rank 0's events, one frozen dataclass per kind, read and written
             in the one JSON-lines format; the trainer processes they make up
  goodput    where a run's wall time went, from the timeline (and the writers' face: record)
  counters   restarts, processes, job retries, rollbacks...: each counter's sources and the one
             rule that combines them (never falls, summed, the largest)
  saves      summary.json's checkpoint_saves: the writes and the stand-stills per save
  segments   metrics.jsonl's rows split by the trainer process that wrote them
  checkpoints  checkpoints/step_N: which are complete, whose (config hash), atomic publish,
             pruning (the writing is the trainer's: train/checkpoint/)
  divergence rollbacks.jsonl: the divergence detector, its verdicts, the stop a restart keeps
  peers      heartbeats/ and fence: a node lost, seen by its peers; an attempt given up, fenced
  ranklog    logs/rankR.log, one per rank
  processes  a local run's agents and workers, found through /proc
  pids       whether a process is alive (standard library only)
  export     `export checkpoint`: the newest checkpoint, copied out and verified
"""
