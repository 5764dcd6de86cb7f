"""What a pydantic field declares, read back: its type and bounds, and the values it accepts.

`KindUnit.strategy` draws a kind's fields over their declared ranges from here (`fields_of`), so a new field is drawn
without a word in the strategies. The Hypothesis strategies that use it live in `archspec.testing`; hypothesis is a
test dependency, imported only when a strategy is asked for.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

if TYPE_CHECKING:  # pragma: no cover
    from hypothesis.strategies import SearchStrategy

# Defaults used when a field has no upper bound of its own: large enough to matter, small enough to stay cheap.
UNBOUNDED_INT_CAP = 10**6
UNBOUNDED_FLOAT_CAP = 1e6


def bounds(field: FieldInfo) -> dict[str, Any]:
    """The numeric and length bounds pydantic keeps in a field's metadata (annotated_types Ge/Gt/Le/Lt/MinLen...)."""
    out: dict[str, Any] = {}
    for m in field.metadata:
        for attr in ("ge", "gt", "le", "lt", "min_length", "max_length"):
            if getattr(m, attr, None) is not None:
                out[attr] = getattr(m, attr)
    return out


def strip_optional(annotation: Any) -> tuple[Any, bool]:
    """(annotation without None, whether None is allowed)."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        optional = len(args) < len(get_args(annotation))
        if len(args) == 1:
            return args[0], optional
        return Union[tuple(args)], optional
    return annotation, False


def field_values(field: FieldInfo, *, int_cap: int = UNBOUNDED_INT_CAP,
                 float_cap: float = UNBOUNDED_FLOAT_CAP) -> "SearchStrategy | None":
    """Every valid value of a scalar field, from its annotation and bounds (None: not a scalar this knows)."""
    from hypothesis import strategies as st

    base, _ = strip_optional(field.annotation)
    b = bounds(field)
    if base is bool:
        return st.booleans()
    if get_origin(base) is Literal:
        return st.sampled_from(get_args(base))
    if base is int:
        lo = b.get("ge", b["gt"] + 1 if "gt" in b else -int_cap)
        hi = b.get("le", b["lt"] - 1 if "lt" in b else max(lo, int_cap))
        return st.integers(lo, hi)
    if base is float:
        lo, hi = b.get("ge", b.get("gt", -float_cap)), b.get("le", b.get("lt", float_cap))
        return st.floats(lo, hi, exclude_min="gt" in b, exclude_max="lt" in b, allow_nan=False,
                         allow_infinity=False)
    return None


def fields_of(cls: type[BaseModel], overrides: "dict[str, SearchStrategy | None] | None" = None) -> "SearchStrategy":
    """A dict of `cls`'s own fields (not `kind`), each optional, drawn by `field_values` unless overridden
    (an override of None leaves the field out)."""
    from hypothesis import strategies as st

    overrides = overrides or {}
    optional: dict[str, SearchStrategy] = {}
    for name, field in cls.model_fields.items():
        if name == "kind" or field.exclude:  # an old spelling, read but never written (archspec.spec.legacy)
            continue
        strategy = overrides[name] if name in overrides else field_values(field)
        if strategy is None:
            if name not in overrides:
                raise TypeError(f"archspec.testing: no strategy for {cls.__name__}.{name}; add an override")
            continue
        optional[name] = strategy
    return st.fixed_dictionaries({}, optional=optional)
