"""The thin CLI: parse arguments, call one API function, print, exit (DESIGN 3.1)."""
