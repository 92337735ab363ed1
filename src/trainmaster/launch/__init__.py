"""Launchers: the one torchrun command line, and the backends that run it (local, kubernetes)."""
