"""Spec loading, validation, overrides, canonical form and hashing.

    spec = load_spec("specs/llama-like.yaml", overrides=["model.attention.n_kv_heads=1"])
    spec_hash(spec)       # sha256 of the canonical JSON of the fully-defaulted spec
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from archspec.errors import UserError
from archspec.spec.model import SLUG as SLUG_RE
from archspec.spec.model import Spec
from archspec.spec.rules import cross_field_problems

__all__ = [
    "Spec", "SpecError", "parse_spec", "load_spec", "load_spec_dict", "apply_overrides", "canonical_json",
    "spec_hash", "json_schema", "format_validation_error", "read_yaml", "set_dotted", "SLUG_RE", "canonical_dict",
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


def _user_path(loc: tuple, data: Any) -> str:
    """Field path as the user wrote it: pydantic puts the union tag into the location (`model.ffn.glu.activation`);
    drop it where the input at that point selected that tag, so the path reads `model.ffn.activation`."""
    parts, node = [], data
    for i, part in enumerate(loc):
        is_tag = (isinstance(node, dict) and isinstance(part, str) and part not in node and i + 1 < len(loc)
                  and node.get("kind", part) == part)  # an omitted kind selects the default member
        if is_tag:
            continue
        parts.append(str(part))
        node = node.get(part) if isinstance(node, dict) else (
            node[part] if isinstance(node, list) and isinstance(part, int) and part < len(node) else None)
    return ".".join(parts)


def format_validation_error(err: ValidationError, prefix: str = "", data: Any = None) -> list[str]:
    """One line per problem: `model.attention.n_kv_heads: must divide n_heads (8), got 3`."""
    lines = []
    for e in err.errors(include_url=False):
        path = _user_path(e["loc"], data)
        msg = e["msg"]
        if e["type"] == "string_pattern_mismatch" and path.endswith("name"):
            msg = f"must be a slug (lowercase letters, digits, '-' or '_', starting with a letter or digit, at most 64), got {e['input']!r}"
        elif e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; `archspec schema` lists the valid fields)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] not in ("spec_rule",) and "input" in e and not isinstance(e["input"], (dict, list)):
            msg = f"{msg}, got {e['input']!r}"
        lines.append(f"{prefix}{path}: {msg}" if path else f"{prefix}{msg}")
    return lines


def set_dotted(data: dict, key: str, value: Any, origin: str) -> None:
    parts = key.split(".")
    if not key or any(not p for p in parts):
        raise UserError(f"{origin}: invalid key {key!r} (expected dotted.path.to.field)")
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
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise UserError(f"--set {key}: cannot parse value {raw!r}: {str(e).splitlines()[0]}") from None
        set_dotted(data, key.strip(), value, f"--set {key.strip()}")
    return data


def read_yaml(path: str | Path, what: str = "spec") -> Any:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such {what} file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected a {what} YAML file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read {what} file: {e}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{where}: invalid YAML: {problem}") from None


def load_spec_dict(data: Any, overrides: Iterable[str] = (), origin: str = "spec") -> Spec:
    """Validate a raw dict (after overrides); raise SpecError with one line per problem."""
    if not isinstance(data, dict):
        raise SpecError(f"{origin}: expected a mapping with name/model/train, got {type(data).__name__}")
    data = apply_overrides(json.loads(json.dumps(data, default=str)), overrides)
    try:
        return parse_spec(data)
    except ValidationError as e:
        lines = format_validation_error(e, data=data)
        raise SpecError(f"{origin}: invalid spec ({len(lines)} problem{'s' if len(lines) > 1 else ''})", lines) from None


def load_spec(path: str | Path, overrides: Iterable[str] = ()) -> Spec:
    return load_spec_dict(read_yaml(path), overrides, origin=str(path))


def canonical_dict(spec: Spec) -> dict[str, Any]:
    return spec.model_dump(mode="json")


def canonical_json(spec: Spec) -> str:
    """Sorted keys, no whitespace, every default written out: the form that is hashed and embedded."""
    return json.dumps(canonical_dict(spec), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def spec_hash(spec: Spec) -> str:
    return hashlib.sha256(canonical_json(spec).encode()).hexdigest()


def json_schema() -> dict[str, Any]:
    schema = Spec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "archspec spec"
    return schema
