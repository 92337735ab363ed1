"""torchrun with its imports done without the cyclic garbage collector: the local backend's agent.

    python -m trainmaster.launch.agent ARGS...   ==   python -m torch.distributed.run ARGS...

Each local node runs one torchrun agent, and each agent starts by importing torch.distributed
(the elastic agent, the rendezvous handlers, torch itself): hundreds of thousands of objects,
over which the collector runs again and again while they are made, though none of them is ever
garbage. With it off during those imports and the result frozen, as the entry shim does for the
workers (entry.py), an agent spends less CPU before its rendezvous (`python
bench/launch_overhead.py --cases agent`; figures in bench/README.md): on a machine with fewer cores
than processes, that is time the workers wait for.

Everything else is torchrun's own: the module then runs as `python -m` runs it (runpy, as
__main__, sys.argv[0] its file), so its arguments, log lines, SIGTERM/SIGINT handling and exit
codes are those of plain torchrun, and the supervisor stops, restarts and detaches it the same.
The Kubernetes pods keep plain torchrun (launch/torchrun.py command's module): users read
their pods' command lines.
"""

from __future__ import annotations

import gc
import runpy
import sys

MODULE = "trainmaster.launch.agent"
TORCHRUN = "torch.distributed.run"


def main() -> None:
    gc.disable()
    try:
        import torch.distributed.run  # noqa: F401  # the agent's imports, collector off
    finally:
        # torch's modules live as long as the agent: the collector need not walk them again.
        gc.freeze()
        gc.enable()
    # Then run it as `python -m` does: as __main__, with its imports cached now, and not also
    # under its own name (runpy would warn; plain torchrun never has it there either).
    del sys.modules[TORCHRUN]
    delattr(sys.modules["torch.distributed"], "run")
    runpy.run_module(TORCHRUN, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
