"""Invalid specs: valid dicts mutated so that validation must refuse them, each with the path the problem must be
reported at.

`invalid_spec_cases()` applies one or more mutations from `MUTATIONS` to a drawn valid dict; `invalid_spec_dicts()`
is the same without the location. `MUTATIONS` holds the generic mutations (a bad value, a bad kind, an unknown key,
...), the model's and the recipe's cross-field rules, and every registered kind's own rules (`KindUnit.invalid_cases`,
collected each time it is read, so a kind registered later is covered too).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any, Callable, Literal, get_args, get_origin

from hypothesis import strategies as st
from pydantic.fields import FieldInfo

from archspec.kinds import families
from archspec.kinds.introspect import bounds, strip_optional
from archspec.spec import parse_spec
from archspec.spec.model import MAX_HEAD_DIM, MAX_HEADS, ModelSpec
from archspec.spec.train import BPETokenizer
from archspec.testing.introspect import Path, field_at, get_at, leaves, nodes, set_at, union_members
from archspec.testing.strategies import Strategy, spec_dicts


# Keys that are never field names nor kinds, and bad kinds: any text but lone surrogates (which no YAML or JSON file
# can hold). Problem lines escape unprintable characters, so control and line-break characters are fair game.
_SAFE_TEXT = st.characters(blacklist_categories=("Cs",))
_JUNK_KEYS = st.one_of(
    st.text(_SAFE_TEXT, min_size=1, max_size=12).map(lambda s: "x-" + s),  # '-' never appears in a field name
    st.sampled_from(["__class__", "__init__", "model_config", "model_fields", "__proto__", "Kind", "KIND", " kind"]),
    st.integers(-5, 5), st.none(), st.booleans(), st.floats(allow_nan=False),
)
_JUNK_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(_SAFE_TEXT, max_size=8))
_JUNK = st.recursive(
    _JUNK_SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_JUNK_KEYS, children, max_size=3),
    max_leaves=6,
)
_JUNK_STRINGS = ["", "eight", "12abc", "1e3x", "x'; import os #", "\n", "None", "null", "[]", "{}", "0x10", "--"]
_BAD_SLUGS = ["", "Upper", "has space", "-lead", "_lead", "a" * 65, "x'; import os #", "a\n", "é", "a/b", "a.b",
              "a\x00", "..", "a:b", "a\\b"]

def _invalid_values(field: FieldInfo, draw) -> list[Any]:
    """Values no lax coercion turns into a valid value of `field`."""
    base, optional = strip_optional(field.annotation)
    b = bounds(field)
    out: list[Any] = [draw(st.lists(_JUNK, min_size=1, max_size=2)),
                      {draw(_JUNK_KEYS): draw(_JUNK)}]  # containers are never scalars
    if not optional:
        out.append(None)
    if base is bool:
        out += ["maybe", 2, -1, 0.5, "", "tru", [True]]
    elif get_origin(base) is Literal:
        allowed = get_args(base)
        out += [s for s in _JUNK_STRINGS if s not in allowed]
        out += [draw(st.text(max_size=8).filter(lambda s: s not in allowed)), 1, 2.5,
                str(allowed[0]).upper() if str(allowed[0]).upper() not in allowed else "#"]
    elif base is int:
        out += _JUNK_STRINGS
        out += [2.5, float("nan"), float("inf"), "1.5"]
        if "ge" in b or "gt" in b:
            lo = b.get("ge", b.get("gt", 0) + 1)
            out += [lo - 1, lo - draw(st.integers(1, 10**40)), -10**30]
        if "le" in b or "lt" in b:
            hi = b.get("le", b.get("lt", 0) - 1)
            out += [hi + 1, hi + draw(st.integers(1, 10**40)), 10**30, str(hi + 1)]
    elif base is float:
        out += _JUNK_STRINGS + ["nan", "-inf", float("nan"), float("inf"), float("-inf"), 10**400]
        if "ge" in b:
            out += [b["ge"] - max(1.0, abs(b["ge"])), math.nextafter(b["ge"], -math.inf)]
        if "gt" in b:
            out += [b["gt"], b["gt"] - 1.0]
        if "le" in b:
            out += [b["le"] + max(1.0, abs(b["le"])), math.nextafter(b["le"], math.inf), 1e308]
        if "lt" in b:
            out += [b["lt"], b["lt"] + 1.0]
        if "ge" in b or "gt" in b:
            out.append(-1e308)
    elif base is str:  # the name: a slug
        out += _BAD_SLUGS + [5, 1.5, True]
    elif get_origin(base) is list:  # list[str] (corpus paths)
        out = [{draw(_JUNK_KEYS): 1}, "a-string", 5, [None], [1], [["nested"]], [{}]]
        if b.get("min_length"):
            out.append([])
    return out


def _mutate_unknown_key(draw, data, spec):
    path, node = draw(st.sampled_from(list(nodes(data))))
    key = draw(_JUNK_KEYS)
    node[key] = draw(_JUNK)
    return path + ((key,) if isinstance(key, str) else ())


def _mutate_bad_kind(draw, data, spec):
    unions = [p for p, _ in nodes(data) if p and (info := field_at(data, p)) and union_members(info[0], p[-1])]
    if not unions:
        return None
    path = draw(st.sampled_from(unions))
    owner, field = field_at(data, path)
    kinds = set(union_members(owner, path[-1]))
    get_at(data, path)["kind"] = draw(st.one_of(
        st.text(_SAFE_TEXT, max_size=12).filter(lambda s: s not in kinds),  # see _SAFE_TEXT
        st.sampled_from(["MLP", "RMSNorm", " glu", "glu "]),
        st.integers(), st.none(), st.lists(st.sampled_from(sorted(kinds)), min_size=1, max_size=2),
        st.just({"kind": sorted(kinds)[0]}),
    ))
    return path


def _scalar_leaves(data):
    out = []
    for path, value in leaves(data):
        if path and isinstance(path[-1], str) and path[-1] != "kind" and field_at(data, path) is not None:
            out.append(path)
    return out


def _mutate_leaf(draw, data, spec):
    candidates = _scalar_leaves(data)
    if not candidates:
        return None
    path = draw(st.sampled_from(candidates))
    _, field = field_at(data, path)
    set_at(data, path, draw(st.sampled_from(_invalid_values(field, draw))))
    return path


def _mutate_list_item(draw, data, spec):
    items = [p for p, _ in leaves(data) if p and isinstance(p[-1], int) and field_at(data, p[:-1]) is not None]
    if not items:
        return None
    path = draw(st.sampled_from(items))
    set_at(data, path, draw(st.sampled_from([None, 1, 2.5, True, [], ["x"], {"x-": 1}])))
    return path


def _mutate_subtree(draw, data, spec):
    candidates = [p for p, _ in nodes(data) if p]
    if not candidates:
        return None
    path = draw(st.sampled_from(candidates))
    garbage = draw(st.one_of(
        st.none(), st.integers(), st.floats(), st.text(max_size=8), st.lists(_JUNK, max_size=3),
        st.dictionaries(_JUNK_KEYS.filter(lambda k: isinstance(k, str)), _JUNK, min_size=1, max_size=3),
    ))
    set_at(data, path, garbage)
    try:
        parse_spec(data)
    except Exception:  # noqa: BLE001
        return path
    return None  # the garbage is valid there (null for an optional field such as attention.qk_norm): no mutation


def _mutate_remove_name(draw, data, spec):
    data.pop("name", None)
    return ("name",)


# Cross-field rules: each sets fields so that exactly this rule is broken, and blames the path it reports. A rule of
# one kind's (rope's even head_dim) lives in that kind's unit: KindUnit.invalid_cases.


def _rule_kv_heads(draw, data, spec):
    if "n_kv_heads" not in type(spec.model.attention).model_fields:  # an attention kind without it (mla)
        return None
    n_heads = spec.model.attention.n_heads
    bad = [k for k in range(2, min(MAX_HEADS, 64) + 1) if n_heads % k or k > n_heads]
    set_at(data, ("model", "attention", "n_kv_heads"), draw(st.sampled_from(bad)))
    return ("model", "attention", "n_kv_heads")


def _rule_heads_divide_d_model(draw, data, spec):
    if "head_dim" not in type(spec.model.attention).model_fields:  # an attention kind without it (mla)
        return None
    d_model = spec.model.d_model
    bad = [h for h in range(2, min(MAX_HEADS, 64) + 1) if d_model % h]
    if not bad:
        return None
    att = data["model"].setdefault("attention", {})
    att["n_heads"] = draw(st.sampled_from(bad))
    att.pop("head_dim", None)
    att.pop("n_kv_heads", None)
    return ("model", "attention", "n_heads")


def _rule_width(draw, data, spec):
    if "head_dim" not in type(spec.model.attention).model_fields:  # an attention kind without it (mla)
        return None
    m = spec.model
    n_heads = m.attention.n_heads
    head_dim = 8 * m.d_model // n_heads + 2
    head_dim += head_dim % 2
    if head_dim > MAX_HEAD_DIM:
        return None
    set_at(data, ("model", "attention", "head_dim"), head_dim)
    return ("model", "attention", "head_dim")


def _rule_shared_norm_without_parallel(draw, data, spec):
    block = data["model"].setdefault("block", {})
    block.update(shared_norm=True, parallel=False)  # any placement: a sequential block has no shared norm
    return ("model", "block", "shared_norm")


def _rule_parallel_placement(draw, data, spec):
    block = data["model"].setdefault("block", {})
    block.update(parallel=True, norm_placement=draw(st.sampled_from(["post", "output"])))
    block.pop("shared_norm", None)
    return ("model", "block", "norm_placement")


def _rule_mup_base_width(draw, data, spec):
    """A base width under the standard parametrization, where it means nothing."""
    data["model"]["parametrization"] = "standard"
    default = ModelSpec.model_fields["mup_base_width"].default
    data["model"]["mup_base_width"] = draw(st.integers(1, 4096).filter(lambda w: w != default))
    return ("model", "mup_base_width")


def _rule_mup_embedding_scale(draw, data, spec):
    """sqrt(d_model)-scaled embeddings under µP, which keeps their scale."""
    data["model"]["parametrization"] = "mup"
    data["model"]["embedding_scale"] = "sqrt_d_model"
    return ("model", "embedding_scale")


def _rule_seq_len(draw, data, spec):
    ctx = spec.model.context_length
    set_at(data, ("train", "seq_len"), ctx + draw(st.integers(1, 10**6)))
    return ("train", "seq_len")


def _rule_warmup(draw, data, spec):
    steps = spec.train.steps
    set_at(data, ("train", "warmup_steps"), steps + draw(st.integers(1, 1000)))
    return ("train", "warmup_steps")


def _rule_bpe_vocab(draw, data, spec):
    vocab = spec.model.vocab_size
    lo = max(vocab + 1, 260)
    if lo + 1000 > bounds(BPETokenizer.model_fields["vocab_size"])["le"]:
        return None
    set_at(data, ("train", "data", "tokenizer"), {"kind": BPETokenizer.kind_name(),
                                                "vocab_size": draw(st.integers(lo, lo + 1000))})
    return ("train", "data", "tokenizer", "vocab_size")


# The first entry is the most frequent draw (Hypothesis favours small indices): the richest mutation goes there.
_MODEL_MUTATIONS: dict[str, Callable] = {
    "bad_value": _mutate_leaf,
    "bad_kind": _mutate_bad_kind,
    "unknown_key": _mutate_unknown_key,
    "bad_list_item": _mutate_list_item,
    "garbage_subtree": _mutate_subtree,
    "missing_name": _mutate_remove_name,
    "rule_kv_heads": _rule_kv_heads,
    "rule_heads_divide_d_model": _rule_heads_divide_d_model,
    "rule_width": _rule_width,
    "rule_shared_norm_without_parallel": _rule_shared_norm_without_parallel,
    "rule_parallel_placement": _rule_parallel_placement,
    "rule_mup_base_width": _rule_mup_base_width,
    "rule_mup_embedding_scale": _rule_mup_embedding_scale,
}
_RECIPE_RULES: dict[str, Callable] = {
    "rule_seq_len": _rule_seq_len,
    "rule_warmup": _rule_warmup,
    "rule_bpe_vocab": _rule_bpe_vocab,
}


def kind_rules() -> dict[str, Callable]:
    """Every registered kind's own rules (`KindUnit.invalid_cases`), as `rule_<kind>_<name>`."""
    return {f"rule_{kind}_{name}": case
            for fam in families().values() for kind, cls in fam.members.items()
            for name, case in cls.invalid_cases().items()}


class _Mutations(Mapping):
    """name → mutation `(draw, data, spec) -> blamed path | None`: the model's, every registered kind's (read from
    the registry each time), then the recipe's. A name starting with `rule_` breaks a cross-field rule: it needs
    `spec`, the validated `data`."""

    def _table(self) -> dict[str, Callable]:
        return {**_MODEL_MUTATIONS, **kind_rules(), **_RECIPE_RULES}

    def __getitem__(self, name: str) -> Callable:
        return self._table()[name]

    def __iter__(self):
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


MUTATIONS = _Mutations()


@st.composite
def invalid_spec_cases(draw, max_mutations: int = 2, mutations=None, **spec_kwargs: Any) -> tuple[dict, list, list]:
    """(invalid dict, blamed paths, mutation names): a valid spec dict with 1..max_mutations mutations applied.

    Every case is invalid; validation must report a problem at (or under) at least one blamed path. A blamed path
    is given as the user writes it (no union tag), with list items by index; () blames nothing in particular
    (a key that is not a string)."""
    data = draw(spec_dicts(**spec_kwargs))
    table = {k: MUTATIONS[k] for k in mutations} if mutations is not None else dict(MUTATIONS)
    blamed: list[Path] = []
    applied: list[str] = []
    for _ in range(draw(st.integers(1, max_mutations))):
        try:
            spec = parse_spec(data)  # cross-field rules read the current values; none once the dict is invalid
        except Exception:  # noqa: BLE001
            spec = None
        names = [n for n in table if spec is not None or not n.startswith("rule_")]
        i = draw(st.integers(0, len(names) - 1))
        for name in names[i:] + names[:i]:  # the drawn one, else the next that applies
            trial = copy.deepcopy(data)
            path = table[name](draw, trial, spec)
            if path is not None:
                data = trial
                blamed.append(tuple(path))
                applied.append(name)
                break
    return data, blamed, applied


def invalid_spec_dicts(**kwargs: Any) -> Strategy:
    """Invalid spec dicts (`invalid_spec_cases` without the blame)."""
    return invalid_spec_cases(**kwargs).map(lambda case: case[0])


