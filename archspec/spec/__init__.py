"""Spec loading, validation, overrides, canonical form and hashing.

    spec = load_spec("specs/llama-like.yaml", overrides=["model.attention.n_kv_heads=1"])
    model_hash(spec)      # sha256 of the canonical JSON of the fully-defaulted `model:` section

A spec's identity is its model's: the name is a label and the recipe (`train:`) belongs to runs, so neither enters
`model_hash`, the generated code or `SPEC_JSON` (see `archspec.train.build` for a run's identity).
"""

from __future__ import annotations

import collections.abc
import copy
import functools
import hashlib
import json
import types
import typing
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from archspec.errors import UserError, printable
from archspec.kinds import registry_version
from archspec.kinds.base import identity_dump, is_default_member
from archspec.spec import safe_yaml
from archspec.spec.layers import SELECTION_TAGS
from archspec.spec.model import SLUG as SLUG_RE
from archspec.spec.model import Spec
from archspec.spec.rules import cross_field_problems

__all__ = [
    "Spec", "SpecError", "parse_spec", "load_spec", "load_spec_dict", "apply_overrides", "canonical_json",
    "json_schema", "format_validation_error", "read_yaml", "set_dotted", "SLUG_RE", "canonical_dict",
    "known_keys", "is_known_key",
    "model_dict", "model_json", "model_hash", "canonical_text", "text_hash",
]


class SpecError(UserError):
    """An invalid spec: one line per problem, each with its field path."""


def parse_spec(data: Any) -> Spec:
    """Validate a spec dict. Raises pydantic.ValidationError listing every problem with its field path."""
    spec = Spec.model_validate(data)
    problems = cross_field_problems(spec)
    if problems:
        raise ValidationError.from_exception_data(
            "Spec",
            [
                InitErrorDetails(type=PydanticCustomError("spec_rule", msg), loc=path, input=value)
                for path, msg, value in problems
            ],
        )
    return spec


def _kind_members(annotation: Any) -> dict[str, type[BaseModel]] | None:
    """The kind → class table of a `kind`-discriminated union annotation, or None if it is not one."""
    found: dict[str, type[BaseModel]] = {}
    stack = [annotation]
    while stack:
        a = stack.pop()
        if isinstance(a, type) and issubclass(a, BaseModel):
            if "kind" not in a.model_fields:
                return None
            found[a.model_fields["kind"].default] = a
        else:
            stack.extend(typing.get_args(a))
    # A one-member union (today's `sparsity`) reaches here as the bare class; it is still tagged by pydantic.
    return found or None


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return _model_of(args[0]) if len(args) == 1 else None


def _items_of(annotation: Any) -> Any:
    """The annotation of a mapping's values or a list's items (`model.layers`: LayerGroup), else None: the next part
    of a location is then a key or an index, and the one after it a field of that."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
            continue
        if origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return None
            annotation = args[0]
            continue
        if origin in (dict, collections.abc.Mapping):
            return typing.get_args(annotation)[1]
        if origin in (list, tuple, collections.abc.Sequence):
            args = typing.get_args(annotation)
            return args[0] if args else None
        return None


def _step(annotation: Any) -> tuple[type[BaseModel] | None, dict[str, type[BaseModel]] | None, Any]:
    """What a location part of this annotation leads into: (a model, a union's members by tag, a container's items)."""
    if (items := _items_of(annotation)) is not None:
        return None, None, items
    if members := _kind_members(annotation):
        return None, members, None
    return _model_of(annotation), None, None


def _user_path(loc: tuple, root: type[BaseModel] = Spec) -> str:
    """Field path as the user wrote it. Pydantic puts the union tag into the location of an error inside a union
    member (`model.ffn.glu.activation`); walk the schema beside the location and drop exactly those tags."""
    return ".".join(_printable(str(part)) for part in untagged(tuple(loc), model=root))


def untagged(loc: tuple, model: type[BaseModel] | None = None,
             members: dict[str, type[BaseModel]] | None = None) -> tuple:
    """`loc` without the union tags pydantic inserted, walked from `model` (or from a union: its `members` by tag)
    beside the schema: at any depth (an MoE's `expert`, inside a layer group), through mappings and lists."""
    return _walk(loc, model, members)[0]


def _walk(loc: tuple, model: type[BaseModel] | None,
          members: dict[str, type[BaseModel]] | None) -> tuple[tuple, type[BaseModel] | None, dict | None]:
    """(`loc` without its union tags, the model and the union members it ends in): the one walk of a location."""
    out: list = []
    items: Any = None
    for i, part in enumerate(loc):
        if part in SELECTION_TAGS and i and loc[i - 1] == "select":
            continue  # the tag of a layer group's selection form
        if members is not None:
            if str(part) in members:  # the tag pydantic inserted after a union field
                model, members = members[str(part)], None
                continue
            model, members = None, None  # a rule's own path (no tag) into a union member's field
        out.append(part)
        if items is not None:  # a mapping's key or a list's index (a layer group's name)
            model, members, items = _step(items)
            continue
        field = model.model_fields.get(part) if model is not None and isinstance(part, str) else None
        if field is None:
            model = None
            continue
        model, members, items = _step(field.annotation)
    return tuple(out), model, members


def _fields_at(loc: tuple, root: type[BaseModel] = Spec) -> set[str]:
    """The field names valid at `loc` (the mapping an unknown key was found in), walked as `_user_path` walks it: a
    union field's tag picks its member; without one, every member's fields."""
    _, model, members = _walk(loc, root, None)
    if members:
        return {name for m in members.values() for name in m.model_fields}
    return set(model.model_fields) if model is not None else set()


def _did_you_mean(loc: tuple, root: type[BaseModel]) -> str:
    """`; did you mean ffn?` for an unknown key: the nearest valid key at its place (the filter language's
    closest_key: an abbreviation part by part, else the closest spelling), or the valid ones when few."""
    from archspec.errors import closest_key

    if not loc:
        return ""
    valid = _fields_at(tuple(loc[:-1]), root)
    close = closest_key(str(loc[-1]), valid) if valid else None
    if close:
        return f"; did you mean {close}?"
    return f"; valid here: {', '.join(sorted(valid))}" if valid and len(valid) <= 12 else ""


def known_keys() -> frozenset[str]:
    """Every dotted leaf key a spec can have, across all union members (`model.norm.eps`, `train.data.corpus.paths`):
    what a registry filter may name as `params.<key>`. Plus `train.data_parallel`, which runs on several data-parallel replicas add to the recipe, and
    `train.init_from` (the starting weights' digest), which `train --init-from` adds.
    A kind registered later (archspec.kinds.register) is seen: the cache is keyed on the registry's version."""
    return _known_keys(registry_version())


def is_known_key(key: str) -> bool:
    """Whether `key` is a dotted key of a recorded (canonical) spec (see known_keys), including its layer groups:
    the registry records the canonical groups, named `<component>_<n>` (`model.layers.ffn_1.ffn.kind`,
    `model.layers.attention_2.select`, `model.layers.mixer_1.mixer.L_cache`), not the names a spec file gave them."""
    if key in known_keys():
        return True
    parts = key.split(".")
    if parts[:2] != ["model", "layers"] or len(parts) < 4:
        return False
    group, rest = parts[2], parts[3:]
    component, _, n = group.rpartition("_")
    if component not in ("norm", "attention", "ffn", "mixer") or not n.isdigit():
        return False
    if rest[0] == "select":
        return len(rest) == 1 or (len(rest) == 2 and rest[1] in ("start", "stop", "step"))
    return rest[0] == component and ".".join(["model", *rest]) in known_keys()


@functools.cache
def _known_keys(version: int) -> frozenset[str]:
    keys: set[str] = {"train.data_parallel", "train.init_from"}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            members = _kind_members(field.annotation)
            nested = list(members.values()) if members else ([m] if (m := _model_of(field.annotation)) else [])
            if nested:
                for member in nested:
                    walk(member, f"{prefix}{name}.")
                if not field.is_required() and field.get_default() is None:
                    keys.add(f"{prefix}{name}")  # an optional section may be null: a leaf then (`rope.scaling`)
            else:
                keys.add(f"{prefix}{name}")

    walk(Spec, "")
    return frozenset(keys)


def _printable(text: str, limit: int = 120) -> str:
    return printable(text, limit)


def _repr(value: Any) -> str:
    """repr() for a message; an int too long for repr() (over Python's 4300-digit limit) is described instead."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 14_000:
        return f"<an integer of about {int(value.bit_length() * 0.30103):,} digits>"
    return repr(value)


def format_validation_error(err: ValidationError, prefix: str = "", data: Any = None,
                            root: type[BaseModel] = Spec) -> list[str]:
    """One line per problem: `model.attention.n_kv_heads: must divide n_heads (8), got 3`."""
    lines = []
    for e in err.errors(include_url=False):
        path = _user_path(e["loc"], root)
        msg = validation_message(e, tuple(e["loc"]), root)
        lines.append(f"{prefix}{path}: {msg}" if path else f"{prefix}{msg}")
    return lines


def validation_message(e: Any, loc: tuple, root: type[BaseModel] = Spec) -> str:
    """The message of one pydantic error `e` found at `loc` under `root` (the location as pydantic gives it, union
    tags included): what was wrong, what was given, and for an unknown key the nearest valid one. The one wording for
    every place a spec's values are validated (the spec itself, and the layer groups' merged units)."""
    msg = _printable(e["msg"], 300)
    given = _printable(_repr(e["input"])) if "input" in e else None
    if e["type"] == "string_pattern_mismatch" and loc and loc[-1] == "name":
        return ("must be a slug (lowercase letters, digits, '-' or '_', starting with a letter or digit, at most 64), "
                f"got {given}")
    if e["type"] == "extra_forbidden":
        return ("unknown field" + (_did_you_mean(loc, root) or " (check the spelling)")
                + " (`archspec schema` lists the valid fields)")
    if e["type"] == "missing":
        return "required field is missing"
    if e["type"] == "value_error":  # our own validators: the message already names what was given
        return msg.removeprefix("Value error, ")
    if e["type"] == "invalid_kind" and "input" in e:
        value = e["input"]
        if isinstance(value, dict):
            if "kind" not in value:  # a family with no default kind (token mixers): the kind must be named
                return f"kind is required: {msg.removeprefix('kind ')}"
            return f"{msg}, got {_printable(_repr(value.get('kind')))}"
        if isinstance(value, str) and repr(value) in msg:  # `mixer: short_conv`: the kind is right, the shape is not
            return f"expected a mapping, got {given}; write {{kind: {_printable(value)}}}"
        return f"expected a mapping with a kind ({msg}), got {given}"
    bound = _BOUNDS.get(e["type"])
    if bound and isinstance(v := e.get("ctx", {}).get(bound[0]), float) and "e" in repr(v):  # pydantic: 38 zeros
        msg = f"Input should be {bound[1]} {_printable(repr(e['ctx'][bound[0]]))}"
    if e["type"] not in ("spec_rule",) and "input" in e and not isinstance(e["input"], (dict, list)):
        return f"{msg}, got {given}"
    return msg


_BOUNDS = {"greater_than_equal": ("ge", "greater than or equal to"), "greater_than": ("gt", "greater than"),
           "less_than_equal": ("le", "less than or equal to"), "less_than": ("lt", "less than")}


def set_dotted(data: dict, key: str, value: Any, origin: str) -> None:
    parts = key.split(".")
    if not key or any(not p for p in parts):
        raise UserError(f"{origin}: invalid key {printable(repr(key), 120)} (expected dotted.path.to.field)")
    if len(parts) > safe_yaml.MAX_DEPTH:
        raise UserError(f"{origin}: the key has {len(parts):,} parts, more than {safe_yaml.MAX_DEPTH} levels")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            where = ".".join(parts[: i + 1])
            raise UserError(f"{origin}: {where} is a {type(child).__name__}, not a mapping; cannot set {key}")
        node = child
    node[parts[-1]] = value


def apply_overrides(data: dict, overrides: Iterable[str]) -> dict:
    """Apply `dotted.key=value` overrides; values are YAML scalars or flow maps (`{kind: mlp, hidden_dim: 64}`)."""
    for item in overrides:
        if "=" not in item:
            raise UserError(f"--set {item!r}: expected KEY=VALUE, e.g. model.attention.n_kv_heads=1")
        key, raw = item.split("=", 1)
        key = key.strip()
        shown = printable(key, 120)
        if len(raw) > safe_yaml.MAX_FILE_BYTES:
            raise UserError(f"--set {shown}: the value is {len(raw):,} characters, more than {safe_yaml.MAX_FILE_BYTES:,}")
        try:
            value = safe_yaml.parse(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise UserError(f"--set {shown}: cannot parse value {printable(repr(raw), 120)}: {problem}") from None
        safe_yaml.check_structure(value, f"--set {shown}")
        if key.endswith(".kind") and isinstance(value, str):
            section = _get_dotted(data, key.rsplit(".", 1)[0])
            if isinstance(section, dict) and section.get("kind", _omitted_kind(key) or value) != value:
                section.clear()  # another kind: its own fields, from its defaults (later --set keys refine it)
        set_dotted(data, key, value, f"--set {shown}")
    return data


def _omitted_kind(kind_key: str) -> str | None:
    """The kind an omitted `kind` means at `kind_key`'s section (`model.attention.kind` → the default attention
    kind), or None when the path is no kind union a spec has (layer groups, unknown keys)."""
    model: Any = Spec
    parts = kind_key.split(".")[:-1]
    for i, part in enumerate(parts):
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return None
        members = _kind_members(field.annotation)
        if i == len(parts) - 1:
            return next((k for k, m in (members or {}).items() if is_default_member(m)), None)
        # inside a union: its default member's field (every member holding it holds the same union there)
        model = next((m for m in members.values() if is_default_member(m)), None) if members else (
            _model_of(field.annotation))
    return None


def _get_dotted(data: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def read_yaml(path: str | Path, what: str = "spec") -> Any:
    """A spec or sweep file, parsed with safe_load semantics and the limits of `safe_yaml` (size, nesting, integer
    digits, alias expansion); every way it can be wrong is a UserError naming the file (and line and column)."""
    path = Path(path)
    text = safe_yaml.read_text(path, what)
    if not text.strip():
        raise UserError(f"{path}: empty {what} file")
    try:
        data = safe_yaml.parse(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{where}: invalid YAML: {problem}") from None
    safe_yaml.check_structure(data, str(path))
    return data


def load_spec_dict(data: Any, overrides: Iterable[str] = (), origin: str = "spec") -> Spec:
    """Validate a raw dict (after overrides); raise SpecError with one line per problem."""
    if not isinstance(data, dict):
        raise SpecError(f"{origin}: expected a mapping with name/model/train, got {type(data).__name__}")
    # deepcopy, not a JSON round trip: it keeps YAML aliases shared (no "billion laughs" expansion) and survives
    # cycles, which pydantic then reports as a field error.
    safe_yaml.check_structure(data, origin, SpecError)  # a dict built in Python gets the limits a file gets
    data = apply_overrides(copy.deepcopy(data), overrides)
    try:
        return parse_spec(data)
    except ValidationError as e:
        lines = format_validation_error(e, data=data)
        raise SpecError(f"{origin}: invalid spec" + (f" ({len(lines)} problems)" if len(lines) > 1 else ""), lines) from None


def load_spec(path: str | Path, overrides: Iterable[str] = ()) -> Spec:
    return load_spec_dict(read_yaml(path), overrides, origin=str(path))


def _normalise(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    if isinstance(value, float):
        return value + 0.0  # -0.0 → 0.0: equal values, one spelling
    return value


def canonical_dict(spec: Spec) -> dict[str, Any]:
    """The spec as plain data, every default written out but those of fields added later (`Since`): the identity."""
    return _normalise(identity_dump(spec))


def canonical_json(spec: Spec) -> str:
    """Sorted keys, no whitespace, every default written out (but a `Since` field's): the form hashed and embedded."""
    return json.dumps(canonical_dict(spec), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def canonical_text(data: Any) -> str:
    """The canonical JSON of a plain value (sorted keys, no whitespace, ASCII): what every hash here is taken over."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def model_dict(spec: Spec) -> dict[str, Any]:
    """The fully-defaulted `model:` section: the architecture, without name or recipe."""
    return canonical_dict(spec)["model"]


def model_json(spec: Spec) -> str:
    """Canonical JSON of the `model:` section: `SPEC_JSON` in the generated module, `specs.canonical_json`."""
    return canonical_text(model_dict(spec))


def model_hash(spec: Spec) -> str:
    """sha256 of `model_json`: the generated module's `SPEC_HASH` and the registry's spec key. Two names or two
    recipes over one model: one hash."""
    return text_hash(model_json(spec))


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a spec file, accepting exactly what archspec accepts: in each `kind` union only the member
    an omitted kind selects may leave `kind` out, so `{eps: 1e-6}` matches RMSNorm alone (not every norm)."""
    schema = Spec.model_json_schema()
    by_title = {getattr(m, "__name__", ""): m for m in _all_models(Spec)}
    for name, definition in schema.get("$defs", {}).items():
        model = by_title.get(name)
        props = definition.get("properties", {})
        if model is not None and "kind" in props and not is_default_member(model):
            required = definition.setdefault("required", [])
            if "kind" not in required:
                required.insert(0, "kind")
    _partial_layer_groups(schema)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "archspec spec"
    return schema


def _all_models(root: type[BaseModel]) -> list[type[BaseModel]]:
    """Every pydantic model reachable from `root`'s fields (union members included)."""
    seen: dict[type[BaseModel], None] = {}
    stack = [root]
    while stack:
        model = stack.pop()
        if model in seen:
            continue
        seen[model] = None
        for field in model.model_fields.values():
            members = _kind_members(field.annotation)
            stack.extend(members.values() if members else ([m] if (m := _model_of(field.annotation)) else []))
    return list(seen)


def _partial_layer_groups(schema: dict[str, Any]) -> None:
    """A layer group's norm/attention/ffn holds fields merged onto the model-wide component: the same shapes with
    nothing required (an omitted `kind` keeps the model-wide kind), so the schema takes partial members."""
    defs = schema.get("$defs", {})
    model, group = defs.get("ModelSpec"), defs.get("LayerGroup")
    if not model or not group:
        return

    def partial_ref(ref: str) -> str:
        name = ref.rsplit("/", 1)[-1]
        pname = f"{name}Partial"
        if pname not in defs:
            defs[pname] = {}
            d = copy.deepcopy(defs[name])
            d.pop("required", None)
            d["title"] = pname
            d["properties"] = {k: partial(v) for k, v in d.get("properties", {}).items()}
            defs[pname] = d
        return f"#/$defs/{pname}"

    def partial(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return {**node, "$ref": partial_ref(node["$ref"])}
            if "oneOf" in node or "anyOf" in node:
                members = node.get("oneOf", node.get("anyOf"))
                out = {k: v for k, v in node.items() if k not in ("oneOf", "anyOf", "discriminator")}
                out["anyOf"] = [partial(m) for m in members]
                return out
        return node

    for c in ("norm", "attention", "ffn", "mixer"):
        wide = model["properties"][c]
        node = {k: v for k, v in wide.items() if k not in ("default", "oneOf", "anyOf", "$ref", "discriminator")}
        node["anyOf"] = [partial({k: v for k, v in wide.items() if k in ("oneOf", "anyOf", "$ref")}), {"type": "null"}]
        node["default"] = None
        node["description"] = group["properties"][c].get("description", "")
        group["properties"][c] = node
