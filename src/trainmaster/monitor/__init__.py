"""Looking at runs: status, logs, list (from the run folder and the backend)."""
