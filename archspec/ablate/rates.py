"""A learning rate per variant (sweep `lr_sweep`): which rate is a variant's best, by one rule.

The rule (RULE, printed with every report of such a sweep): the sweep's first seed is the pilot; each variant trains
at every rate of `lr_sweep` with it; a variant's best rate is the one whose pilot run has the lowest final val loss
(a FAILED pilot, e.g. diverged, never wins; ties go to the smaller rate). The best rate is decided only once every
pilot of the variant is FINISHED or FAILED; then the variant's other seeds train at that rate only, and the report
compares variants at their own best rates (all seeds there, the pilot included), beside each variant's rate curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RULE = ("pilot seed {pilot} at every rate; a variant's best rate is the one whose pilot has the lowest final val loss "
        "(FAILED pilots never win, ties go to the smaller rate); the other seeds train at that rate only")


@dataclass(frozen=True)
class RatePoint:
    lr: float
    status: str | None  # the pilot run's status; None: not in the registry yet
    val_loss: float | None
    run_id: str | None = None


def decided(points: list[RatePoint]) -> bool:
    """Every pilot has an outcome (FINISHED or FAILED)."""
    return bool(points) and all(p.status in ("FINISHED", "FAILED") for p in points)


def best_rate(points: list[RatePoint]) -> float | None:
    """The variant's best rate by RULE, or None while a pilot has no outcome yet (or none finished)."""
    if not decided(points):
        return None
    finished = [p for p in points if p.status == "FINISHED" and p.val_loss is not None and math.isfinite(p.val_loss)]
    if not finished:
        return None
    return min(finished, key=lambda p: (p.val_loss, p.lr)).lr


def rule_text(pilot: int) -> str:
    return RULE.format(pilot=pilot)


__all__ = ["RULE", "RatePoint", "best_rate", "decided", "rule_text"]
