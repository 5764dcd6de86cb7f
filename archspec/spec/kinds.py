"""Discriminated unions on `kind`, shared by the model and the training recipe."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BaseModel, Discriminator, Tag


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
