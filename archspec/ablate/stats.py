"""The interval arithmetic behind an ablation's verdicts: Welch t intervals for a difference of means, and for any
linear combination of independent group means (the marginal means and main effects of a multi-factor grid).

A combination L = Σ c_i · mean_i of independent groups (n_i values, sample variance s_i²) has standard error
SE = sqrt(Σ c_i² s_i² / n_i) and, by the Welch–Satterthwaite approximation, ν = SE⁴ / Σ (c_i² s_i² / n_i)² / (n_i − 1)
degrees of freedom; its confidence interval is L ± t_{(1+level)/2, ν} · SE. With c = (+1, −1) this is Welch's
two-sample t interval (scipy.stats.ttest_ind(a, b, equal_var=False).confidence_interval()); it does not assume the
two variants' seed-to-seed spreads are equal, which an architecture change often breaks.

A group with one value has no variance estimate, so an interval that needs it is None ("n/a (1 seed)"), never a
guess. The t quantile is scipy's (scipy.stats.t.ppf).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

LEVEL = 0.95  # the confidence level of every interval in a report


@dataclass(frozen=True)
class Interval:
    """An estimate with its Welch t interval. `se`, `dof`, `low`, `high` are None when some group has one value."""

    estimate: float
    se: float | None = None
    dof: float | None = None
    low: float | None = None
    high: float | None = None
    level: float = LEVEL

    @property
    def known(self) -> bool:
        return self.low is not None

    def excludes_zero(self) -> bool:
        return self.known and (self.low > 0 or self.high < 0)

    def text(self, digits: int = 4) -> str:
        """`[-0.0123, +0.0456]`, or `-` when there is no interval."""
        if not self.known:
            return "-"
        return f"[{self.low:+.{digits}f}, {self.high:+.{digits}f}]"

    def as_dict(self) -> dict[str, float | None]:
        return {"estimate": self.estimate, "se": self.se, "dof": self.dof, "low": self.low, "high": self.high,
                "level": self.level}


def t_quantile(dof: float, level: float = LEVEL) -> float:
    from scipy import stats  # imported here: only a report needs it

    return float(stats.t.ppf(0.5 + level / 2, dof))


def combination(groups: Sequence[tuple[float, Sequence[float]]], level: float = LEVEL) -> Interval | None:
    """Σ c_i · mean(values_i) over independent groups [(c_i, values_i)], with its Welch–Satterthwaite interval.
    None when a group with a non-zero coefficient is empty."""
    used = [(c, list(v)) for c, v in groups if c != 0]
    if not used or any(not v for _, v in used):
        return None
    estimate = math.fsum(c * statistics.fmean(v) for c, v in used)
    if any(len(v) < 2 for _, v in used):
        return Interval(estimate, level=level)
    terms = [(c * c * statistics.variance(v) / len(v), len(v)) for c, v in used]
    var = math.fsum(w for w, _ in terms)
    se = math.sqrt(var)
    if var == 0.0:  # every group identical within itself: a point, no spread to test against
        return Interval(estimate, 0.0, None, estimate, estimate, level)
    dof = var * var / math.fsum(w * w / (n - 1) for w, n in terms)
    half = t_quantile(dof, level) * se
    return Interval(estimate, se, dof, estimate - half, estimate + half, level)


def welch(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Interval | None:
    """mean(a) − mean(b) with Welch's t interval (unequal variances, Welch–Satterthwaite degrees of freedom)."""
    return combination([(1.0, a), (-1.0, b)], level)


def mean_interval(values: Sequence[float], level: float = LEVEL) -> Interval | None:
    """The mean of one group with its t interval (n − 1 degrees of freedom)."""
    return combination([(1.0, values)], level)


def verdict(interval: Interval | None, lower_is_better: bool = True) -> str:
    """better / worse only when the interval excludes 0; inconclusive otherwise; n/a without an interval."""
    if interval is None:
        return "no runs"
    if not interval.known:
        return "n/a (1 seed)"
    if interval.se == 0.0:
        return "n/a (no spread)"
    if not interval.excludes_zero():
        return "inconclusive"
    return "better" if (interval.estimate < 0) == lower_is_better else "worse"


__all__ = ["LEVEL", "Interval", "combination", "welch", "mean_interval", "verdict", "t_quantile"]
