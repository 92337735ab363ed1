"""The local backend: jobs as processes on this machine."""
