"""Errors a user can fix, and the exit codes of the CLI (docs/architecture.md 3.1).

Every error here is turned by the CLI into one line on stderr and exit code 2, with no
traceback: the message must name the field or file and say what to do. Anything else that
escapes is a bug or a failed job/tool (exit 1).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # the job or a tool failed
EXIT_BAD_INPUT = 2  # config, arguments or data are wrong


class UserError(Exception):
    """Bad input: the message names what is wrong and how to fix it."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, *, where: str | None = None) -> None:
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class ConfigError(UserError):
    """A job file or a --set override is invalid."""


class DataError(UserError):
    """Input text, a vocabulary or shards are unusable."""


class JobFailed(Exception):
    """The job or an external tool ran and failed (exit code 1)."""

    exit_code = EXIT_FAILED
