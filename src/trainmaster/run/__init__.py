"""The run folder (STORAGE/runs/JOB/): its files, their writers and readers."""
