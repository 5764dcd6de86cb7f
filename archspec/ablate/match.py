"""Matched budgets: solve one width of a spec so that its parameter count, train FLOPs per token or KV-cache bytes per
token come within a tolerance of a target (a sweep's baseline variant, or `archspec build --match`).

    solution = solve_width(data, "model.ffn.hidden_dim", "params", target=410_240, tolerance=0.02)
    solution.value, solution.count, solution.residual     # 344, 409_856, -0.00094

The counts come from `archspec.accounting.account` alone (params: total; flops: train FLOPs per token at the
recipe's train.seq_len; kv_bytes: KV-cache bytes per token, bf16). Validity is the spec language's: a candidate is
written into the raw mapping and parsed with every rule (divisible by heads, expert widths, limits), so a solved spec
is one `archspec build` accepts. Candidates are the multiples of `multiple_of` (8 unless asked) within the field's
bounds. Nothing here knows a kind: the key is any dotted integer field.

The search assumes the count does not decrease as the width grows (true of every width: params, FLOPs and KV bytes
are sums of non-negative terms in it). It is a binary search over the valid candidates (an invalid midpoint is
replaced by the nearest valid candidate inside the interval), then the two valid candidates that bracket the target
are compared: the closer one wins (the smaller width on a tie). So the answer is the valid candidate whose count is
nearest the target (tests/test_match.py checks it against a brute-force scan).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel, ValidationError

from archspec.accounting import Accounting, account
from archspec.errors import UserError, printable
from archspec.spec import Spec, format_validation_error, is_known_key, parse_spec, set_dotted

Measure = Literal["params", "flops", "kv_bytes"]
MEASURES: tuple[str, ...] = ("params", "flops", "kv_bytes")
MEASURE_TEXT = {"params": "parameters", "flops": "train FLOPs per token", "kv_bytes": "KV-cache bytes per token"}
TOLERANCE = 0.02
MULTIPLE_OF = 8
# Invalid candidates skipped looking for a valid one near a point (each costs one parse, ~0.4 ms).
MAX_PROBES = 4096


def measure_of(acc: Accounting, measure: str) -> int:
    """The count a match compares, from the one accounting."""
    if measure == "params":
        return acc.total
    if measure == "flops":
        return acc.flops_train
    if measure == "kv_bytes":
        return acc.kv_cache_bytes_per_token
    raise ValueError(f"unknown measure {measure!r}")


def count(spec: Spec, measure: str) -> int:
    return measure_of(account(spec, seq_len=spec.train.seq_len), measure)


@dataclass(frozen=True)
class Solution:
    key: str
    measure: str
    value: int
    count: int
    target: int
    spec: Spec
    data: dict[str, Any]  # the raw mapping with the solved value written in

    @property
    def residual(self) -> float:
        """(count − target) / target: the mismatch left."""
        return (self.count - self.target) / self.target if self.target else 0.0

    def text(self) -> str:
        return f"{self.key}={self.value} ({MEASURE_TEXT[self.measure]} {self.count:,}, {self.residual:+.2%} vs {self.target:,})"


def dotted_value(spec: Spec, key: str) -> Any:
    """The value of a dotted key in a parsed spec (its defaults filled in)."""
    node: Any = spec
    for part in key.split("."):
        node = getattr(node, part, None)
    return node


def field_bounds(data: dict[str, Any], key: str) -> tuple[int, int]:
    """The integer bounds (ge/le) pydantic declares for the dotted key, read from the parsed spec's classes (whatever
    kind the mapping chose); (1, 2**20) when none are declared."""
    lo, hi = 1, 1 << 20
    try:
        node: Any = parse_spec(data)
    except ValidationError:
        return lo, hi
    parts = key.split(".")
    for part in parts[:-1]:
        node = getattr(node, part, None)
        if not isinstance(node, BaseModel):
            return lo, hi
    field = type(node).model_fields.get(parts[-1])
    for meta in field.metadata if field is not None else []:
        if isinstance(meta, annotated_types.Ge):
            lo = max(lo, int(meta.ge))
        elif isinstance(meta, annotated_types.Gt):
            lo = max(lo, int(meta.gt) + 1)
        elif isinstance(meta, annotated_types.Le):
            hi = min(hi, int(meta.le))
        elif isinstance(meta, annotated_types.Lt):
            hi = min(hi, int(meta.lt) - 1)
    return lo, hi


def solve_width(data: dict[str, Any], key: str, measure: str, target: int, *, tolerance: float = TOLERANCE,
                multiple_of: int = MULTIPLE_OF, what: str = "spec", bounds: tuple[int, int] | None = None) -> Solution:
    """The valid value of `key` (a multiple of `multiple_of`) whose `measure` is nearest `target`. UserError when no
    valid value comes within `tolerance` (relative), naming `what` and the best residual."""
    if measure not in MEASURES:
        raise UserError(f"match: {printable(str(measure), 40)!r}: expected one of {', '.join(MEASURES)}")
    if target < 1:
        raise UserError(f"{what}: match {measure}: the target must be a positive count, got {target}")
    if not is_known_key(key):
        raise UserError(f"{what}: solve {printable(key, 200)}: not a field of a spec (`archspec schema` lists them)")
    lo, hi = bounds or field_bounds(data, key)
    first, last = -(-lo // multiple_of), hi // multiple_of  # candidate w = i · multiple_of, i in [first, last]
    seen: dict[int, tuple[int, Spec, dict] | None] = {}
    errors: list[str] = []

    def evaluate(i: int) -> tuple[int, Spec, dict] | None:
        if i not in seen:
            trial = copy.deepcopy(data)
            set_dotted(trial, key, i * multiple_of, f"solve {key}")
            try:
                spec = parse_spec(trial)
                seen[i] = (count(spec, measure), spec, trial)
            except ValidationError as e:
                if not errors:
                    errors.extend(format_validation_error(e, data=trial))
                seen[i] = None
            except ValueError as e:  # a rule that only the accounting meets (a per-layer problem)
                if not errors:
                    errors.append(str(e))
                seen[i] = None
        return seen[i]

    def nearest_valid(i: int, a: int, b: int) -> int | None:
        """The valid candidate nearest i inside [a, b] (below first on a tie), within MAX_PROBES probes."""
        for step in range(0, MAX_PROBES):
            for j in ((i - step, i + step) if step else (i,)):
                if a <= j <= b and evaluate(j) is not None:
                    return j
            if i - step < a and i + step > b:
                return None
        return None

    def scan(i: int, direction: int) -> int | None:
        for j in range(i, i + direction * MAX_PROBES, direction):
            if not first <= j <= last:
                return None
            if evaluate(j) is not None:
                return j
        return None

    a, b = first, last
    while a <= b:
        j = nearest_valid((a + b) // 2, a, b)
        if j is None:
            break
        if seen[j][0] < target:
            a = j + 1
        else:
            b = j - 1
    candidates = [j for j in (scan(a - 1, -1), scan(a, +1)) if j is not None]
    if not candidates:
        why = f": {errors[0]}" if errors else ""
        raise UserError(f"{what}: solve {key} for {measure} {target:,}: no valid value among the multiples of "
                        f"{multiple_of} in [{lo}, {hi}]{why}")
    best = min(candidates, key=lambda j: (abs(seen[j][0] - target), j))
    n, spec, trial = seen[best]
    solution = Solution(key, measure, best * multiple_of, n, target, spec, trial)
    if abs(solution.residual) > tolerance:
        ends = [j for j in (scan(first, +1), scan(last, -1)) if j is not None]
        flat = len({seen[j][0] for j in ends}) == 1
        hint = (f"; {key} does not change the {MEASURE_TEXT[measure]}" if flat else
                "; widen the tolerance or solve another key")
        raise UserError(f"{what}: no valid {key} brings the {MEASURE_TEXT[measure]} within {tolerance:.2%} of "
                        f"{target:,}: the best is {solution.value} at {n:,} (residual {solution.residual:+.2%}){hint}")
    return solution


def parse_match(text: str) -> tuple[str, int]:
    """`params=12000000` (or flops=, kv_bytes=) → (measure, target). Integers only (underscores allowed)."""
    measure, sep, raw = text.partition("=")
    measure = measure.strip()
    if not sep or measure not in MEASURES:
        raise UserError(f"--match {printable(text, 80)!r}: expected MEASURE=N with MEASURE one of "
                        f"{', '.join(MEASURES)}, e.g. params=400000")
    try:
        target = int(raw.strip())
    except ValueError:
        raise UserError(f"--match {printable(text, 80)!r}: N must be an integer count, e.g. params=400000") from None
    if target < 1:
        raise UserError(f"--match {printable(text, 80)!r}: N must be positive")
    return measure, target


__all__ = ["MEASURES", "Solution", "solve_width", "parse_match", "measure_of", "count", "field_bounds", "dotted_value", "TOLERANCE",
           "MULTIPLE_OF"]
