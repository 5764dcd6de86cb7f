"""Values read from environment variables, checked like any other input: a variable that does not hold what archspec
needs (`WORLD_SIZE=abc`, `LOCAL_RANK=-1`, a number too large to mean anything) is a UserError naming the variable, never
a traceback from deep inside. Every read of a numeric variable goes through here."""

from __future__ import annotations

import os

from archspec.errors import UserError, printable

ENV_INT_LIMIT = 1 << 31  # ranks, world sizes, ports, widths: nothing archspec reads from the environment is larger


def env_int(name: str, default: int, minimum: int = 0, maximum: int = ENV_INT_LIMIT) -> int:
    """$name as an integer in [minimum, maximum]; `default` when unset or empty."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    text = raw.strip()
    digits = text[1:] if text[:1] in "+-" else text  # one sign at most
    if len(text) > 20 or not (digits.isascii() and digits.isdigit()):
        raise UserError(f"${name} must be an integer, got {printable(repr(raw), 60)}")
    value = int(text)
    if not minimum <= value <= maximum:
        raise UserError(f"${name} must be between {minimum} and {maximum}, got {value}")
    return value


__all__ = ["env_int", "ENV_INT_LIMIT"]
