"""The error type user-caused problems travel in: one sentence, an exit status, no traceback."""

from __future__ import annotations


class UsageError(Exception):
    """A problem the user can fix (bad name, missing script, Score-P not installed...)."""

    def __init__(self, message: str, exit_status: int = 2):
        super().__init__(message)
        self.exit_status = exit_status
