"""Hypothesis properties over spec space (issue 2, item 7). The strategies live in `archspec.testing`.

Every drawn spec builds, runs, is causal and is accounted for exactly; its hash ignores key order and explicit
defaults and sees every value; its generated source is byte-identical across renders and processes; and every
invalid dict is refused with a ValidationError (SpecError through `load_spec_dict`) naming the field.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import torch
import yaml
from hypothesis import Phase, assume, example, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample
from pydantic import ValidationError

from archspec.spec import _printable

from archspec import testing as T
from archspec.accounting import account
from archspec.codegen import generate, render
from archspec.errors import UserError
from archspec.spec import (SpecError, canonical_dict, canonical_json, format_validation_error, json_schema,
                           load_spec_dict, model_hash, parse_spec)
from archspec.spec.model import AttentionSpec, ModelSpec
from archspec.spec.train import DataSpec

ROOT = Path(__file__).resolve().parent.parent

BUILDS = settings(max_examples=20, deadline=None)  # each example renders, imports and runs a module
CHEAP = settings(max_examples=25, deadline=None)  # validation and rendering only


def _model(spec, gen_dir):
    return generate(spec, out_dir=gen_dir).Model()


# ── the strategy itself ──────────────────────────────────────────────────────────────────────────────────────────

FAMILIES = [
    (ModelSpec, "norm", T.NORM_KINDS),
    (ModelSpec, "attention", T.ATTENTION_KINDS),
    (AttentionSpec, "positional", T.POSITIONAL_KINDS),
    (AttentionSpec, "sparsity", T.SPARSITY_KINDS),
    (ModelSpec, "ffn", T.FFN_KINDS),
    (DataSpec, "corpus", T.CORPUS_KINDS),
    (DataSpec, "tokenizer", T.TOKENIZER_KINDS),
]

# Where each family sits in a spec file, and its strategy for a spec of _HOST's sizes, restricted to some kinds.
_HOST = {"name": "t", "model": {"vocab_size": 300, "context_length": 32, "d_model": 64, "n_layers": 1,
                                "attention": {"n_heads": 4}}, "train": {"seq_len": 32}}
_PLACES = {
    "norm": (("model", "norm"), lambda kinds: T.norms(kinds, d_model=64)),
    "attention": (("model", "attention"), lambda kinds: T.attentions(64, 32, attention_kinds=kinds)),
    "positional": (("model", "attention", "positional"), lambda kinds: T.positionals(64, kinds)),
    "sparsity": (("model", "attention", "sparsity"), lambda kinds: T.sparsities(32, kinds)),
    "ffn": (("model", "ffn"), lambda kinds: T.ffns(64, kinds)),
    "corpus": (("train", "data", "corpus"), lambda kinds: T.corpora(kinds, seq_len=32)),
    "tokenizer": (("train", "data", "tokenizer"), lambda kinds: T.tokenizers(300, kinds)),
}


def _schema_kinds(owner, field) -> set[str]:
    """The kinds a spec file may write at `owner.field`, read from the JSON Schema alone (what an editor offers)."""
    defs = json_schema()["$defs"]
    refs = re.findall(r'"\$ref": "#/\$defs/([^"]+)"', json.dumps(defs[owner.__name__]["properties"][field]))
    return {defs[name]["properties"]["kind"]["const"] for name in refs}


# Kinds the generic strategies cannot draw, each with why and where it is tested instead. A new kind is drawn or
# listed here; nothing else.
_NOT_DRAWN = {
    # a block without a channel mixer exists only in the pre-norm sequential shape, and the drawn models draw any
    # shape: tests/test_mamba2.py builds, trains and decodes it
    "ffn": {"none": "pre-norm block only"},
    # no spec with it trains through the shared loop yet (its rule refuses it): tests/test_flamingo.py
    "corpus": {"media_text": "refused by the loop"},
}


@pytest.mark.parametrize("owner,field,table", FAMILIES, ids=[f for _, f, _ in FAMILIES])
def test_strategy_tables_draw_every_kind_the_schema_accepts(owner, field, table):
    """A kind added to a spec union (moe, sparse attention) must be drawn by archspec.testing too: the table lists
    exactly the kinds of the JSON Schema, and each entry draws a dict that the schema accepts at that place and
    that loads as that kind (not another one, not nothing)."""
    assert set(table) == _schema_kinds(owner, field)
    path, strategy = _PLACES[field]
    for kind in table:
        if kind in _NOT_DRAWN.get(field, {}):  # a kind with no strategy of its own, for the reason given
            with pytest.raises(ValueError, match="no .* kind among"):
                find(strategy([kind]), lambda d: True, settings=settings(database=None))
            continue
        body = find(strategy([kind]), lambda d: True, settings=settings(database=None))
        raw = json.loads(json.dumps(_HOST))
        node = raw
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = body
        jsonschema.validate(raw, json_schema())
        assert _dotted(load_spec_dict(raw), ".".join(path)).kind == kind, (kind, body)


def _family(spec):
    a = spec.model.attention
    if not hasattr(a, "n_kv_heads"):  # another attention kind (mla): no K/V head sharing
        return None
    return "MHA" if a.n_kv_heads == a.n_heads else "MQA" if a.n_kv_heads == 1 else "GQA"


def _reachable():
    """(label, predicate) for every variant the strategy must be able to draw."""
    where = {"norm": "model.norm", "attention": "model.attention", "positional": "model.attention.positional", "sparsity": "model.attention.sparsity",
             "ffn": "model.ffn", "corpus": "train.data.corpus", "tokenizer": "train.data.tokenizer"}
    targets = []
    for owner, field, table in FAMILIES:
        for kind in table:
            if kind in _NOT_DRAWN.get(field, {}):  # listed, with the reason, above
                continue
            targets.append((f"{field}={kind}", lambda s, p=where[field], k=kind: _dotted(s, p).kind == k))
    for kind, member in T.union_members(ModelSpec, "ffn").items():
        if "activation" not in member.model_fields:  # moe: its experts are mlp/glu, whose activations are above
            continue
        for act in member.model_fields["activation"].annotation.__args__:
            targets.append((f"{kind}/{act}",
                            lambda s, k=kind, a=act: s.model.ffn.kind == k and s.model.ffn.activation == a))
    targets += [
        ("MHA", lambda s: _family(s) == "MHA" and s.model.attention.n_heads > 1),
        ("GQA", lambda s: _family(s) == "GQA"),
        ("MQA", lambda s: _family(s) == "MQA"),
        ("head_dim != d_model // n_heads",
         lambda s: _family(s) and s.model.attention.head_dim != s.model.d_model // s.model.attention.n_heads),
        ("attention bias", lambda s: getattr(s.model.attention, "bias", False)),
        ("mla with a query latent", lambda s: getattr(s.model.attention, "q_lora_rank", None) is not None),
        ("attention kinds differ by layer", lambda s: len({b.attention.kind for b in s.model.blocks()}) > 1),
        ("ffn bias", lambda s: getattr(s.model.ffn, "bias", False)),
        ("ffn without bias", lambda s: getattr(s.model.ffn, "bias", True) is False),
        ("layernorm without bias", lambda s: s.model.norm.kind == "layernorm" and not s.model.norm.bias),
        ("tied", lambda s: s.model.tie_embeddings),
        ("untied", lambda s: not s.model.tie_embeddings),
        ("3 layers", lambda s: s.model.n_layers == 3),
    ]
    return targets


def _dotted(obj, path):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def test_strategy_reaches_every_variant():
    """valid_specs() draws every union member, activation, K/V layout and flag (not only in principle: within a few
    thousand draws). One search records what it has seen and stops once it has seen everything."""
    missing = dict(_reachable())

    def seen_everything(spec) -> bool:
        for label in [label for label, predicate in missing.items() if predicate(spec)]:
            del missing[label]
        return not missing

    # Also from larger vocabularies: a BPE tokenizer needs at least 260 ids.
    strategy = st.one_of(T.valid_specs(), T.valid_specs(min_vocab=260))
    try:
        find(strategy, seen_everything,
             settings=settings(max_examples=5000, database=None, phases=[Phase.generate], deadline=None))
    except NoSuchExample:
        pass
    assert not missing, f"never drawn: {sorted(missing)}"


@settings(max_examples=300, deadline=None, database=None)
@given(case=st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), T.corpora(seq_len=n))))
def test_every_corpus_kind_draws_what_its_own_fields_accept(case):
    """A corpus kind's strategy stays inside its own fields' bounds, whatever window it is given (the whole-spec
    searches reach each kind's corners seldom; a passkey filler past its bound came up once in thousands of them)."""
    from archspec.data.base import data_family

    seq_len, corpus = case
    cls = data_family("corpus").members[corpus.get("kind", data_family("corpus").default)]
    cls.model_validate(corpus)


# ── built modules ────────────────────────────────────────────────────────────────────────────────────────────────


@BUILDS
@given(spec=T.valid_specs())
def test_every_drawn_spec_builds_and_runs(spec, gen_dir):
    model = _model(spec, gen_dir)
    m = spec.model
    B, Tn = 2, m.context_length
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, m.vocab_size, (B, Tn), generator=g)
    targets = torch.randint(0, m.vocab_size, (B, Tn), generator=g)

    logits = model(idx)
    assert tuple(logits.shape) == (B, Tn, m.vocab_size) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    assert tuple(model(idx[:1, :1]).shape) == (1, 1, m.vocab_size)  # shortest input

    out, loss = model(idx, targets)
    assert tuple(out.shape) == (B, Tn, m.vocab_size)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@BUILDS
@given(spec=T.valid_specs(), data=st.data())
def test_changing_a_token_leaves_earlier_logits_unchanged(spec, data, gen_dir):
    assume(all(b.ffn.causal for b in spec.model.blocks()))  # not MoE dropping by probability (tests/test_moe.py)
    model = _model(spec, gen_dir)
    t = data.draw(st.integers(0, spec.model.context_length - 1), label="position")
    T.assert_causal(model, spec.model.vocab_size, spec.model.context_length, t)


def test_causality_check_catches_a_model_that_sees_the_future(tmp_path):
    """The causality property can fail: the same check on a module with is_causal=False must raise."""
    spec = load_spec_dict({"name": "peek", "model": {"vocab_size": 32, "context_length": 8, "d_model": 16,
                                                     "n_layers": 1, "attention": {"n_heads": 2}}})
    src = render(spec)
    assert "is_causal=not start" in src
    src = src.replace("is_causal=not start", "is_causal=False")
    path = tmp_path / "peek.py"
    path.write_text(src)
    from archspec.codegen import import_source

    with pytest.raises(AssertionError, match="not causal"):
        T.assert_causal(import_source(path).Model(), 32, 8, 5)


@settings(max_examples=25, deadline=None)
@given(spec=T.valid_specs())
def test_analytic_params_equal_module_numel(spec, gen_dir):
    model = _model(spec, gen_dir)
    acc = account(spec)
    assert acc.total == sum(p.numel() for p in model.parameters())
    assert acc.total == sum(acc.by_component.values())
    assert acc.embedding <= acc.total
    assert acc.active == T.module_active_params(model)  # dense: all; MoE: top_k / n_experts of the routed experts


# ── the spec hash ────────────────────────────────────────────────────────────────────────────────────────────────


@CHEAP
@given(raw=T.spec_dicts(), rnd=st.randoms(use_true_random=False))
def test_hash_ignores_key_order(raw, rnd):
    reordered = T.shuffled(raw, rnd)
    assert canonical_json(parse_spec(reordered)) == canonical_json(parse_spec(raw))
    assert model_hash(parse_spec(reordered)) == model_hash(parse_spec(raw))


def _merge_some(minimal, full, draw):
    """`minimal` with a drawn subset of the values only `full` has written in."""
    out = json.loads(json.dumps(minimal))
    for path, value in T.leaves(full):
        if isinstance(path[-1], int) or not draw(st.booleans()):
            continue  # list items come with their list
        node, source = out, full
        for key in path[:-1]:
            source = source[key]
            if key not in node:  # a new mapping: with its kind, as a union member needs
                node[key] = {"kind": source["kind"]} if "kind" in source else {}
            node = node[key]
        node.setdefault(path[-1], value)
    return out


@CHEAP
@given(raw=T.spec_dicts(), data=st.data())
def test_hash_ignores_explicit_defaults_and_comments(raw, data):
    spec = parse_spec(raw)
    full = canonical_dict(spec)
    assert model_hash(parse_spec(full)) == model_hash(spec)  # every default (and derived default) written out
    if "layers" in raw["model"]:
        return  # canonical layer groups are not the user's: tests/test_layers.py covers their hash properties
    some = _merge_some(raw, full, data.draw)
    assert model_hash(parse_spec(some)) == model_hash(spec)  # any subset of them written out
    text = "# a comment\n" + yaml.safe_dump(some, sort_keys=False).replace("\n", "  # trailing\n", 1)
    assert model_hash(load_spec_dict(yaml.safe_load(text))) == model_hash(spec)


def _other_values(value, field):
    """Other valid-looking values for a leaf, most likely valid first."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [v for v in (value + 1, value - 1, value * 2, value // 2) if v != value]
    if isinstance(value, float):
        return [v for v in (value * 2, value / 2, value + 1.0, value - 1.0, value / 3, 0.5, 0.1) if v != value]
    if isinstance(value, str):
        choices = list(getattr(field.annotation, "__args__", ())) if field is not None else []
        literal = [c for c in choices if isinstance(c, str) and c != value]
        return literal or [value[:-1] if len(value) >= 64 else value + "x", value + "0"]
    return []


@CHEAP
@given(raw=T.spec_dicts(), data=st.data())
def test_hash_changes_when_any_model_value_changes(raw, data):
    spec = parse_spec(raw)
    full = canonical_dict(spec)
    # The hash is the model's: every `model:` leaf moves it (the name and the recipe are other tests' business).
    leaves = [(p, v) for p, v in T.leaves(full) if p[0] == "model" and not isinstance(v, list) and p[-1] != "kind"]
    order = data.draw(st.permutations(leaves), label="leaf order")
    for path, value in order:
        info = T.field_at(full, path)
        for new in _other_values(value, info[1] if info else None):
            changed = json.loads(json.dumps(full))
            node = changed
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = new
            try:
                other = parse_spec(changed)
            except ValidationError:
                continue
            moved = canonical_dict(other)
            node = moved
            try:
                for key in path:
                    node = node[key]
            except (KeyError, IndexError, TypeError):
                continue  # the layer groups were laid out anew (not a change of this value in place)
            if node != new:
                continue  # normalised away (not a real change of this value)
            assert model_hash(other) != model_hash(spec), f"changing {'.'.join(map(str, path))} kept the hash"
            return
    raise AssertionError("no leaf could be changed")  # unreachable: tie_embeddings always can


@CHEAP
@given(raw=T.spec_dicts(), name=st.from_regex(r"[a-z0-9][a-z0-9_-]{0,20}", fullmatch=True),
       lr=st.floats(1e-6, 1.0), steps=st.integers(1, 1000))
def test_hash_ignores_the_name_and_the_recipe(raw, name, lr, steps):
    spec = parse_spec(raw)
    other = dict(canonical_dict(spec), name=name)
    other["train"] = {**other["train"], "lr": lr, "steps": steps, "warmup_steps": 0}
    assert model_hash(parse_spec(other)) == model_hash(spec)
    assert render(parse_spec(other)).split('"""', 2)[2] == render(spec).split('"""', 2)[2]  # code below the banner


@pytest.mark.parametrize("raw,refused_at", [
    ({"name": "t", "model": {"vocab_size": 64, "d_model": 32, "attention": {"n_heads": 4}}}, None),
    ({"name": "t", "model": {"vocab_size": 100}, "train": {"data": {"tokenizer": {"kind": "bpe"}}}},
     ("train", "data", "tokenizer", "vocab_size")),
    ({"name": "t", "model": {"d_model": 2048, "attention": {"n_heads": 1}}}, ("model", "attention", "head_dim")),
], ids=["control", "bpe-vocab-derived-below-260", "head-dim-derived-above-max"])
def test_canonical_form_of_an_accepted_spec_is_accepted(raw, refused_at):
    """Writing every default out must give the same valid spec, including derived defaults; a derived default
    that breaks a bound is refused up front, at its own path, instead of producing an unreadable canonical form."""
    if refused_at is not None:
        with pytest.raises(ValidationError) as info:
            parse_spec(raw)
        assert [e["loc"] for e in info.value.errors()] == [refused_at]
        return
    spec = parse_spec(raw)
    assert model_hash(parse_spec(canonical_dict(spec))) == model_hash(spec)


def test_equal_specs_have_equal_hashes():
    a, b = parse_spec({"name": "t", "model": {"dropout": -0.0}}), parse_spec({"name": "t", "model": {"dropout": 0.0}})
    assert a == b
    assert model_hash(a) == model_hash(b)


# ── deterministic source ─────────────────────────────────────────────────────────────────────────────────────────


@CHEAP
@given(raw=T.spec_dicts(), rnd=st.randoms(use_true_random=False))
def test_same_spec_renders_byte_identical_source(raw, rnd):
    spec = parse_spec(raw)
    text = render(spec)
    assert render(spec) == text
    assert render(parse_spec(T.shuffled(raw, rnd))) == text
    assert render(parse_spec(canonical_dict(spec))) == text


_RENDER_IN_CHILD = """
import hashlib, json, sys
from archspec.codegen import render
from archspec.spec import parse_spec
for line in sys.stdin:
    print(hashlib.sha256(render(parse_spec(json.loads(line))).encode()).hexdigest())
"""


@settings(max_examples=2, deadline=None)
@given(specs=st.lists(T.valid_specs(), min_size=4, max_size=6))
def test_same_spec_renders_byte_identical_source_in_a_fresh_process(specs):
    """Another interpreter with another hash seed (set and dict iteration order) gives the same bytes."""
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    lines = "".join(canonical_json(s) + "\n" for s in specs)
    out = subprocess.run([sys.executable, "-c", _RENDER_IN_CHILD], input=lines, capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120, check=True).stdout.split()
    assert out == [hashlib.sha256(render(s).encode()).hexdigest() for s in specs]


# ── invalid specs ────────────────────────────────────────────────────────────────────────────────────────────────


def _blamed(lines, blamed):
    """Whether some problem line is at (or under) one of the blamed paths."""
    for path in blamed:
        if not path:
            return True
        prefix = ".".join(_printable(str(p)) for p in path)  # problem lines escape unprintable key text
        if any(line.startswith(prefix + ":") or line.startswith(prefix + ".") for line in lines):
            return True
    return False


BASE = {"name": "t", "model": {"vocab_size": 32, "context_length": 8, "d_model": 16, "n_layers": 1,
                               "attention": {"n_heads": 2}}}


def _case(path, value, blame=None):
    data = json.loads(json.dumps(BASE))
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return data, [tuple(blame if blame is not None else path)], ["explicit"]


# One pinned example per kind of problem the issue lists; the strategy draws many more.
EXAMPLES = [
    _case(("model", "d_model"), "sixty-four"),  # string where an int is expected
    _case(("model", "d_model"), [64]),  # wrong type
    _case(("model", "dropout"), float("nan")),  # NaN
    _case(("model", "norm"), {"kind": "rmsnorm", "eps": float("inf")}, ("model", "norm", "eps")),  # inf
    _case(("model", "vocab_size"), 10**400),  # huge int
    _case(("model", "norm", "eps"), 10**400),  # huge int where a float is expected
    _case(("model", "n_layers"), 0),  # out of range
    _case(("model", "ffn"), {"kind": "moe-ish"}),  # bad kind
    _case(("model", "attention", "n_kv_heads"), 3),  # not dividing n_heads (2)
    _case(("model", "tie_embeddings"), None),  # None for a required value
    _case(("model", "attention", "positional"), [{"kind": "rope"}, None]),  # nested garbage
    _case(("model", "attentoin"), {"n_heads": 2}),  # unknown key
    _case(("train", "data", "corpus"), {"kind": "files", "paths": []}, ("train", "data", "corpus", "paths")),
]


def _example_all(test):
    for case in EXAMPLES:
        test = example(case=case)(test)
    return test


@CHEAP
@_example_all
@given(case=T.invalid_spec_cases())
def test_invalid_dicts_are_refused_with_a_validation_error_naming_the_field(case):
    data, blamed, applied = case
    try:
        parse_spec(data)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        assert errors
        assert all(err["loc"] for err in errors), errors  # every problem of a mapping has a field path
        lines = format_validation_error(e, data=data)
        assert _blamed(lines, blamed), (applied, blamed, lines)
    else:
        raise AssertionError(f"accepted an invalid spec ({applied})")


def test_problem_paths_when_a_key_is_spelled_like_its_kind():
    with pytest.raises(SpecError) as info:
        load_spec_dict({"name": "t", "model": {"norm": {"kind": "layernorm", "eps": "x", "layernorm": 2}}})
    assert [p.split(":")[0] for p in info.value.problems] == ["model.norm.eps", "model.norm.layernorm"]


@CHEAP
@_example_all
@given(case=T.invalid_spec_cases())
def test_invalid_dicts_become_spec_errors_one_line_per_problem(case):
    data, blamed, applied = case
    with pytest.raises(SpecError) as info:
        load_spec_dict(data, origin="specs/x.yaml")
    err = info.value
    assert isinstance(err, UserError)
    n = len(err.problems)
    assert n >= 1
    assert str(err) == "specs/x.yaml: invalid spec" + (f" ({n} problems)" if n > 1 else "")
    for line in err.problems:
        assert len(line.splitlines()) == 1, repr(line)
        path, sep, message = line.partition(": ")
        assert sep and path and message, repr(line)
    assert _blamed(err.problems, blamed), (applied, blamed, err.problems)
    if n == 1:  # one mistake, one line
        assert err.render() == f"{err}: {err.problems[0]}"
    else:
        assert err.render().splitlines()[1:] == ["  " + line for line in err.problems]
