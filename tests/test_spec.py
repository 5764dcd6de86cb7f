"""The spec language: validation messages, overrides, canonical hash, schema, YAML loading."""

from __future__ import annotations

import json

import pytest
import yaml

from archspec.errors import UserError
from archspec.spec import (SpecError, apply_overrides, canonical_dict, json_schema, load_spec, load_spec_dict,
                           model_hash)

BASE = {"name": "t", "model": {"d_model": 64, "attention": {"n_heads": 8}}}


def problems(data, overrides=()):
    with pytest.raises(SpecError) as exc:
        load_spec_dict(data, overrides)
    return exc.value.problems


def test_kv_heads_must_divide_with_path_and_range():
    assert problems(BASE, ["model.attention.n_kv_heads=3"]) == [
        "model.attention.n_kv_heads: must divide n_heads (8), got 3"
    ]


def test_every_field_problem_listed_at_once_with_paths():
    lines = problems({"name": "Bad Name", "model": {"norm": {"kind": "batchnorm"}, "d_model": 0,
                                                    "ffn": {"kind": "glu", "activation": "tanh"}, "extra": 1}})
    paths = [line.split(":")[0] for line in lines]
    assert paths == ["name", "model.d_model", "model.norm", "model.ffn.activation", "model.extra"]
    assert "greater than or equal to 1" in lines[1] and "got 0" in lines[1]
    assert "'layernorm', 'rmsnorm'" in lines[2]


def test_head_dim_default_needs_divisible_d_model():
    (line,) = problems({"name": "t", "model": {"d_model": 100, "attention": {"n_heads": 8}}})
    assert line.startswith("model.attention.n_heads: must divide d_model (100)")
    spec = load_spec_dict({"name": "t", "model": {"d_model": 100, "attention": {"n_heads": 8, "head_dim": 16}}})
    assert spec.model.attention.head_dim == 16


def test_rope_needs_even_head_dim_and_seq_len_bounded():
    lines = problems({"name": "t", "model": {"d_model": 63, "context_length": 16,
                                             "attention": {"n_heads": 7, "head_dim": 9}},
                      "train": {"seq_len": 32}})
    assert any(line.startswith("model.attention.head_dim: must be even for rope") for line in lines)
    assert "train.seq_len: must be at most model.context_length (16), got 32" in lines


@pytest.mark.parametrize("key,value", [("model.dropout", "1.0"), ("model.norm.eps", ".nan"),
                                       ("model.n_layers", "100000"), ("model.vocab_size", "1")])
def test_bounds(key, value):
    (line,) = problems(BASE, [f"{key}={value}"])
    assert line.startswith(key + ":")


def test_derived_defaults_are_written_into_the_spec():
    spec = load_spec_dict(BASE)
    a = spec.model.attention
    assert (a.n_kv_heads, a.head_dim) == (8, 8)
    assert spec.model.ffn.hidden_dim == 192  # 8/3·64 rounded up to 32
    assert spec.train.seq_len == spec.model.context_length


def test_overrides_scalars_flow_maps_and_errors():
    spec = load_spec_dict(BASE, ["model.attention.n_kv_heads=1", "model.ffn={kind: mlp, activation: relu}",
                                 "model.tie_embeddings=false", "name=renamed"])
    assert spec.model.attention.n_kv_heads == 1
    assert spec.model.ffn.kind == "mlp" and spec.model.ffn.hidden_dim == 256
    assert spec.model.tie_embeddings is False and spec.name == "renamed"
    with pytest.raises(UserError, match="expected KEY=VALUE"):
        apply_overrides({}, ["model.d_model"])
    with pytest.raises(UserError, match="model.d_model is a int, not a mapping"):
        apply_overrides({"model": {"d_model": 4}}, ["model.d_model.x=1"])
    with pytest.raises(UserError, match="cannot parse value"):
        apply_overrides({}, ["model.ffn={kind: [}"])


def test_hash_stable_under_order_comments_and_explicit_defaults(tmp_path):
    a = tmp_path / "a.yaml"
    a.write_text("name: t\nmodel:\n  d_model: 64\n  attention: {n_heads: 8}\n")
    b = tmp_path / "b.yaml"
    b.write_text("# a comment\nmodel:\n  attention:\n    n_kv_heads: 8  # explicit default\n    n_heads: 8\n"
                 "  d_model: 64\n  norm: {eps: 1.0e-5, kind: rmsnorm}\nname: t\ntrain: {}\n")
    h = model_hash(load_spec(a))
    assert model_hash(load_spec(b)) == h
    full = tmp_path / "full.yaml"
    full.write_text(yaml.safe_dump(canonical_dict(load_spec(a))))
    assert model_hash(load_spec(full)) == h
    assert model_hash(load_spec(a, ["model.norm.eps=2e-5"])) != h


def test_yaml_is_loaded_safely(tmp_path):
    evil = tmp_path / "evil.yaml"
    evil.write_text("name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(UserError, match=r"evil.yaml:1:\d+: invalid YAML"):
        load_spec(evil)


def test_schema_is_json_schema_with_unions():
    schema = json_schema()
    text = json.dumps(schema)
    for word in ("rmsnorm", "layernorm", "glu", "mlp", "rope", "sinusoidal", "learned", "n_kv_heads"):
        assert word in text
    assert schema["$schema"].startswith("https://json-schema.org/")
    # editors complete on it: it validates a real spec
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(yaml.safe_load(open("specs/llama-like.yaml")), schema)


def test_duplicate_yaml_keys_are_refused(tmp_path):
    f = tmp_path / "dup.yaml"
    f.write_text("name: a\nmodel: {d_model: 64}\nname: b\n")
    with pytest.raises(UserError, match=r"dup.yaml:3:1: invalid YAML: duplicate key 'name'"):
        load_spec(f)


def test_reserved_names_would_shadow_imports():
    (line,) = problems({"name": "torch"})
    assert line.startswith("name: 'torch' would generate torch.py, which shadows")


@pytest.mark.parametrize("override,line", [
    ("model.n_layers=true", "model.n_layers: expected a number, got true"),
    ("model.n_layers=yes", "model.n_layers: expected a number, got true"),
    ("model.dropout=false", "model.dropout: expected a number, got false"),
    ("model.attention.bias=1", "model.attention.bias: expected true or false, got 1"),
])
def test_booleans_and_numbers_do_not_mix(override, line):
    assert problems(BASE, [override]) == [line]
    assert load_spec_dict(BASE, ["train.lr=3e-4"]).train.lr == 3e-4  # PyYAML's string '3e-4' still reads as a float


def test_setting_another_kind_starts_from_its_defaults():
    spec = load_spec_dict({**BASE, "model": {**BASE["model"], "attention": {"n_heads": 8, "positional": {
        "kind": "rope", "theta": 5e5}}}}, ["model.attention.positional.kind=learned"])
    assert spec.model.attention.positional.kind == "learned"
    spec = load_spec_dict(BASE, ["model.ffn.kind=mlp", "model.ffn.hidden_dim=100"])
    assert (spec.model.ffn.kind, spec.model.ffn.hidden_dim, spec.model.ffn.activation) == ("mlp", 100, "gelu")
    # the same kind keeps the section's other fields
    spec = load_spec_dict(BASE, ["model.ffn={kind: glu, hidden_dim: 96}", "model.ffn.kind=glu"])
    assert spec.model.ffn.hidden_dim == 96
