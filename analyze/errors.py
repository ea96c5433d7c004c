"""The error type user-caused problems travel in: one sentence, an exit status, no traceback."""

from __future__ import annotations


class AnalyzeError(Exception):
    """A problem with the user's input: one sentence naming the file and what to do."""

    def __init__(self, message: str, exit_status: int = 1):
        super().__init__(message)
        self.exit_status = exit_status
