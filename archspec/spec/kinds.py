"""The base of every spec class, and discriminated unions on `kind`: shared by the model and the training recipe."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, ValidationInfo, field_validator

_NUMBERS = (int, float, int | None, float | None)


class Strict(BaseModel):
    """Unknown keys are errors, NaN/inf are refused, assignments are validated too, and booleans are not numbers.

    Numbers stay lax otherwise: PyYAML reads `3e-4` (no dot) as a string, and pydantic turns it into the float the
    user meant. But `n_layers: yes` must not quietly become one layer, nor `bias: 1` true.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _booleans_are_not_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        annotation = cls.model_fields[info.field_name].annotation
        if isinstance(value, bool) and annotation in _NUMBERS:
            raise ValueError(f"expected a number, got {str(value).lower()}")
        if annotation is bool and not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value


def kind_union(*members: type[BaseModel], default: str) -> Any:
    """A union discriminated on `kind`, where an omitted kind means `default` (`norm: {eps: 1e-6}` is an RMSNorm).

    Each member declares `kind: Literal[...]`; the tag is read from that literal, so there is one source of truth.
    """
    kinds = [m.model_fields["kind"].default for m in members]
    assert default in kinds, (default, kinds)

    def pick(value: Any) -> str | None:
        if isinstance(value, dict):
            kind = value.get("kind", default)
            return kind if isinstance(kind, str) else None
        return getattr(value, "kind", None)

    return Annotated[
        Union[tuple(Annotated[m, Tag(k)] for m, k in zip(members, kinds))],
        Discriminator(
            pick,
            custom_error_type="invalid_kind",
            custom_error_message=f"kind must be one of {', '.join(repr(k) for k in kinds)}",
        ),
    ]
