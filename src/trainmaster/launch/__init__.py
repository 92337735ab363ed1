"""What every backend runs: the one torchrun command line (torchrun.py) and the entry shim
(entry.py); agent.py is torchrun with its imports done without the cyclic garbage collector,
the local backend's agent.
"""
