"""The thin CLI: parse arguments, call one API function, print, exit (docs/architecture.md 3.1)."""
