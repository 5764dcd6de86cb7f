"""Spec dicts read through the pydantic models: which union members a field holds, which model and field validate a
value at a path, and every node or leaf of a dict with its path."""

from __future__ import annotations

import types
from functools import lru_cache
from typing import Any, Iterator, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from archspec.spec.model import Spec

Path = tuple  # a field path: ("model", "attention", "n_kv_heads"); list items by index


def models_in(annotation: Any) -> list[type[BaseModel]]:
    origin = get_origin(annotation)
    if origin is not None and getattr(annotation, "__metadata__", None) is not None:  # Annotated[X, ...]
        return models_in(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [m for a in get_args(annotation) for m in models_in(a)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def union_members(owner: type[BaseModel], field_name: str) -> dict[str, type[BaseModel]]:
    """The members of a `kind` union field, by kind: `union_members(ModelSpec, "norm")` → {kind: class, ...}."""
    return {m.model_fields["kind"].default: m for m in models_in(owner.model_fields[field_name].annotation)
            if "kind" in m.model_fields}


@lru_cache(maxsize=None)
def kind_omittable(owner: type[BaseModel], field_name: str) -> str | None:
    """The kind an omitted `kind` selects in this union field, or None when the union requires `kind`."""
    field = owner.model_fields[field_name]
    default = field.get_default(call_default_factory=True)
    kind = getattr(default, "kind", None)
    if kind is None:
        return None
    try:
        got = getattr(owner.model_validate({field_name: {}}), field_name)
    except Exception:  # noqa: BLE001 (any refusal means "kind is required here")
        return None
    return kind if getattr(got, "kind", None) == kind else None


def field_at(data: dict, path: Path) -> tuple[type[BaseModel], FieldInfo] | None:
    """The model class and pydantic field that validate `data` at `path` (a valid spec dict), or None for a list
    item. The member of a union is picked by the node's `kind` (or the kind an omitted one selects)."""
    cls: type[BaseModel] = Spec
    node: Any = data
    for i, key in enumerate(path):
        if not isinstance(key, str) or key not in cls.model_fields:
            return None
        field = cls.model_fields[key]
        if i == len(path) - 1:
            return cls, field
        child = node.get(key) if isinstance(node, dict) else None
        models = models_in(field.annotation)
        if not models or not isinstance(child, dict):
            return None
        if len(models) > 1:
            kind = child.get("kind", kind_omittable(cls, key))
            members = union_members(cls, key)
            if not isinstance(kind, str) or kind not in members:
                return None
            cls = members[kind]
        else:
            cls = models[0]
        node = child
    return None


def nodes(data: dict, path: Path = ()) -> Iterator[tuple[Path, dict]]:
    """Every mapping in a spec dict with its path (the root first)."""
    yield path, data
    for key, value in data.items():
        if isinstance(value, dict):
            yield from nodes(value, path + (key,))


def leaves(obj: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every non-mapping value with its path; list items too (by index), after the list itself."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from leaves(value, path + (key,))
        return
    yield path, obj
    if isinstance(obj, list):
        for i, item in enumerate(obj):
            yield from leaves(item, path + (i,))


def get_at(data: Any, path: Path) -> Any:
    for key in path:
        data = data[key]
    return data


def set_at(data: dict, path: Path, value: Any) -> None:
    node = data
    for key in path[:-1]:
        node = node[key] if isinstance(node, list) else node.setdefault(key, {})
    node[path[-1]] = value
