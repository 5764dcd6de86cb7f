"""Errors a user can act on. The CLI turns every `UserError` into exit code 2 and its message, no traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input (spec, sweep file, filter, checkpoint, CLI argument): the message names what and where.

    `problems` holds one line per problem when there are several (e.g. every invalid field of a spec).
    """

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = list(problems or [])

    def render(self) -> str:
        if not self.problems:
            return str(self)
        return "\n".join([str(self), *("  " + p for p in self.problems)])
