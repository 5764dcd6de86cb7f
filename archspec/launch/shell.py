"""The one gate between a value and a script archspec generates (an sbatch script, its `#SBATCH` directives, the
torchrun line a multi-node job's nodes run through `bash -c`).

A sweep file is shared like a spec, and its `launcher:` section, like the command line's launcher options, ends up
in a file that a shell reads on a cluster node: it must never carry code. Every such value passes `script_value`:

- always: a string of at most MAX_CHARS characters with no line break, NUL, other control character, or Unicode
  format character (bidi overrides): a line break would end a `#SBATCH` comment and start a command, in any quoting;
- `word=True` (a SLURM name: partition, account, qos, an sbatch option's name): only the characters of WORD, nothing
  a shell or sbatch splits, quotes or expands;
- `quote=True` (a word of a shell command line): returned shell-quoted (shlex.quote), so it arrives as one argument,
  unexpanded.

A refusal is a UserError (exit 2, one line) naming where the value came from, with the value cut and escaped.
"""

from __future__ import annotations

import re
import shlex
import unicodedata

from archspec.errors import UserError, printable

MAX_CHARS = 1024
WORD = re.compile(r"[A-Za-z0-9_.,:+@%/=\[\]^-]+")  # gpu, my-lab, a100&ib is not one (an sbatch value may be text)
WORD_TEXT = "letters, digits and _ . , : + @ % / = [ ] ^ -"


def script_problem(value: object, *, word: bool = False) -> str | None:
    """Why `value` may not stand in a generated script (None: it may)."""
    if not isinstance(value, str):
        return f"expected text, got {type(value).__name__}"
    if not value:
        return "empty"
    if len(value) > MAX_CHARS:
        return f"longer than {MAX_CHARS} characters"
    for c in value:
        if c in "\n\r\0" or unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp"):
            return f"holds the control character {printable(repr(c))}; a generated script takes one line of text"
    if word and not WORD.fullmatch(value):
        return f"not a single word of {WORD_TEXT}"
    return None


def script_value(value: object, where: str, *, word: bool = False, quote: bool = False) -> str:
    """`value` as it may be written into a generated script (shell-quoted when `quote`); UserError otherwise."""
    problem = script_problem(value, word=word)
    if problem is not None:
        raise UserError(f"{where} {printable(repr(value), 80)}: {problem}")
    return shlex.quote(value) if quote else value  # type: ignore[arg-type]
