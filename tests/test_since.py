"""Fields added after hashes were in use (`Since`): at their default they leave every model hash and run id as it
was; at any other value they are part of the identity. Checked on a toy model and over every `Since` field of the
spec tree (the fields later issues add)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from archspec.kinds.base import Since, Strict, _since, identity_dump
from archspec.spec import Spec, _all_models


class _Inner(Strict):
    a: int = 1
    late: Annotated[float, Since("test")] = 0.5


class _Outer(Strict):
    inner: _Inner = Field(default_factory=_Inner)
    items: list[_Inner] = Field(default_factory=lambda: [_Inner(), _Inner(late=2.0)])
    late_model: Annotated[_Inner | None, Since("test")] = None


def test_a_since_field_at_its_default_is_left_out_at_every_depth_and_kept_otherwise():
    dumped = identity_dump(_Outer())
    assert dumped == {"inner": {"a": 1}, "items": [{"a": 1}, {"a": 1, "late": 2.0}]}
    dumped = identity_dump(_Outer(late_model=_Inner(late=0.5)))
    assert dumped["late_model"] == {"a": 1}  # set, but its own late field at its default
    assert identity_dump(_Inner(late=0.25)) == {"a": 1, "late": 0.25}


def _since_fields():
    for model in _all_models(Spec):
        for name, info in model.model_fields.items():
            if _since(info):
                yield model, name, info


def test_every_since_field_of_the_spec_has_a_default_the_identity_drops():
    # A Since field without a default would have to be written in every old spec: that is not a later field.
    for model, name, info in _since_fields():
        assert not info.is_required(), f"{model.__name__}.{name}: a Since field needs a default"
