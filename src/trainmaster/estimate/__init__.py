"""`trainmaster estimate`: time, node-hours and cost of a job before it is launched.

    sequences      = train.max_steps x train.global_batch_size   (fixed whatever the nodes:
                                                                  accumulation is derived)
    rate(N)        = r1 x N x efficiency(N)                      (seq/s of N nodes)
    time(N)        = sequences / rate(N)
    node-hours(N)  = N x time(N) / 3600;  cost(N) = node-hours(N) x price per node-hour

r1 is one node's rate: measured (a finished run's summary.json, or a short run made here by
`--measure`), given (`--rate`), or the catalog's published BERT-large phase-1 figure for the
instance type. A rate measured on M nodes is brought back to one node as rate / (M x
efficiency(M)). efficiency(N) follows the published multi-node points of the instance type
(catalog.SCALING), interpolated between them with the same loss per doubling of nodes and
extrapolated past the last one the same way (e(N) = e_last ** (log N / log N_last)); a type
without published points borrows trn1's, and every row says which of these it is.

Not counted: start-up, compilation, checkpoints, restarts, idle nodes, storage and network;
prices are on-demand list prices (catalog or [cluster] price_per_hour) or, with --spot,
EC2's Spot price now (spot.py); not a bill.
No torch. Modules:
  figures the arithmetic, pure: one node's Rate -> the Estimate of every node count (efficiency,
          scaling, price); parse_nodes
  rates   where one node's rate comes from: the catalog's published figure, a finished run's
          summary.json (rate_of_run), or a short run made here (measure, a subprocess)
  spot    the Spot price `--spot` (or cluster.spot) prices the node-hours at: EC2's now, the
          highest of the region's zones
"""
