"""Errors a user can act on. The CLI turns every `UserError` into exit code 2 and its message, no traceback."""

from __future__ import annotations


def printable(text: str, limit: int | None = None) -> str:
    """User text inside a message: control characters escaped (no forged lines, no terminal codes), length capped.

    Anything that echoes a path, key or value the user (or a file) supplied goes through this, so a corpus path
    holding `\\r` or `\\x1b[2K` cannot rewrite what the terminal shows."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
    if limit is not None and len(out) > limit:
        return out[: limit - 3] + "..."
    return out


class Note(UserWarning):
    """Something the user should know that does not stop the command: the CLI prints it as one `<prefix>: ...` line
    on stderr (control characters escaped), Python shows it as a UserWarning."""

    prefix = "note"


class Caution(Note):
    """A note about a risk the command accepted (an unverifiable old checkpoint): printed as `warning: ...`."""

    prefix = "warning"


class UserError(Exception):
    """Bad input (spec, sweep file, filter, checkpoint, CLI argument): the message names what and where.

    `problems` holds one line per problem when there are several (e.g. every invalid field of a spec).
    """

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = list(problems or [])

    def render(self) -> str:
        """The message and one line per problem; each part printable (a newline inside a path stays `\\n`)."""
        if not self.problems:
            return printable(str(self))
        return "\n".join([printable(str(self)), *("  " + printable(p) for p in self.problems)])


def closest_key(key: str, known: set[str]) -> str | None:
    """The known key `key` most likely meant: one it abbreviates part by part (`tok_s` → `tokens_per_s`: every `_`/`.`
    part a prefix of a part, in order), else the closest spelling. The one rule for every "did you mean": registry
    filters (archspec.registry.query.fields) and spec keys (archspec.spec.format_validation_error)."""
    import difflib
    import re

    parts = [p for p in re.split(r"[_.]", key) if p]

    def abbreviates(candidate: str) -> bool:
        rest = [p for p in re.split(r"[_.]", candidate) if p]
        i = 0
        for part in parts:
            while i < len(rest) and not rest[i].startswith(part):
                i += 1
            if i == len(rest):
                return False
            i += 1
        return True

    abbreviated = sorted((k for k in known if k != key and abbreviates(k)), key=lambda k: (len(k), k))
    if parts and abbreviated:
        return abbreviated[0]
    close = difflib.get_close_matches(key, sorted(known), n=1)
    return close[0] if close else None
