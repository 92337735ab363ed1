"""Fixtures: `--from-run` reads the real finished run the monitor tests make (one per session)."""

from tests.monitor.conftest import finished_run  # noqa: F401 - a session fixture, shared
