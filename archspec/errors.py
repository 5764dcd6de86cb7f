"""Errors a user can act on. The CLI turns every `UserError` into exit code 2 and its message, no traceback."""

from __future__ import annotations

import re

# A password in a URL's user part (scheme://user:PASSWORD@host, SQLAlchemy's and libpq's form) or in its query
# (?password=..., libpq's keyword form): what `redact` hides.
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:'\"<>]*:)[^\s@]*@")
_QUERY_PASSWORD = re.compile(r"(?i)([?&;](?:password|passwd|pwd)=)[^&;\s'\"<>#]*")
HIDDEN = "***"
MAX_MESSAGE = 2000  # characters of one line of an error: any echoed input beyond it is cut  # SQLAlchemy's own mark (URL.render_as_string(hide_password=True))


def redact(text: str) -> str:
    """`text` with every password a URL in it carries replaced by ***: the one redaction every line and file archspec
    writes for people goes through (console lines and error messages through `printable`, reports, run records).
    A registry URL is the usual carrier: `--registry postgresql+psycopg://user:PASSWORD@host/db`."""
    text = str(text)
    if "://" not in text and "=" not in text:
        return text
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + HIDDEN + "@", text)
    return _QUERY_PASSWORD.sub(lambda m: m.group(1) + HIDDEN, text)


def printable(text: str, limit: int | None = None) -> str:
    """User text inside a message: control characters escaped (no forged lines, no terminal codes), passwords in
    URLs hidden (`redact`), length capped.

    Anything that echoes a path, key or value the user (or a file) supplied goes through this, so a corpus path
    holding `\\r` or `\\x1b[2K` cannot rewrite what the terminal shows."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in redact(str(text)))
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
        """The message and one line per problem (a single problem joins the message's line, so that one mistake reads
        as one line); each part printable (a newline inside a path stays `\\n`) and cut to MAX_MESSAGE characters,
        whatever input it echoes."""
        if not self.problems:
            return printable(str(self), MAX_MESSAGE)
        if len(self.problems) == 1:  # one problem, one line: `where: what is wrong: field: why`
            return printable(f"{self}: {self.problems[0]}", MAX_MESSAGE)
        return "\n".join([printable(str(self), MAX_MESSAGE), *("  " + printable(p, MAX_MESSAGE) for p in self.problems)])


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
