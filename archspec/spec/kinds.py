"""The base of every spec class and discriminated unions on `kind`; they live with the kinds (archspec.kinds.base),
shared by the model and the training recipe."""

from archspec.kinds.base import Strict, is_default_member, kind_union

__all__ = ["Strict", "kind_union", "is_default_member"]
