"""Hypothesis strategies over spec space, and the checks that tests of generated modules share.

Needs the test extra (`pip install -e '.[test]'`): hypothesis is a test dependency, not a runtime one.

    from archspec.testing import valid_specs, spec_dicts, invalid_spec_cases

    @given(valid_specs())
    def test_builds(spec): ...

Shape. One strategy per union family — `norms()`, `positionals(d_model)`, `sparsities(context_length)`,
`ffns(d_model)`, `corpora()`, `tokenizers(vocab_size)` — each a choice over one strategy per `kind`, listed in a
table beside it (`NORM_KINDS`, `POSITIONAL_KINDS`, `SPARSITY_KINDS`, `FFN_KINDS`, ...). `attentions()` and
`model_dicts()` combine the families under the cross-field rules; `spec_dicts()` adds a name and a recipe.
A new union member (the moe FFN, a sparse attention pattern) is one more function and one more table entry; every
property over `valid_specs()` then covers it, and `tests/test_properties.py` fails until the table lists every
member of the spec's unions.

Per-kind strategies derive each field's range from the pydantic field itself (`field_values`), so a new field is
drawn over its declared bounds unless an override keeps it small (sizes) or ties it to another field (rules).

Strategies draw raw dicts as a user would write them: an optional field (a default, the `kind` of a defaulted
union member, a derived default such as head_dim) is sometimes omitted and sometimes written out, so that hash
properties see both forms. Sizes stay small by default (vocab 16-300, d_model 8-64, 1-3 layers, context 4-32) so
that a drawn spec builds and runs in milliseconds on a CPU.

`invalid_spec_cases()` mutates valid dicts into invalid ones and says where the problem must be reported;
`invalid_spec_dicts()` is the same without the location.
"""

from __future__ import annotations

import copy
import math
import types
from functools import lru_cache
from typing import Any, Callable, Iterator, Literal, Union, get_args, get_origin

from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from archspec.data.base import data_family, task_kinds, task_tokenizer
from archspec.kinds import family
from archspec.spec import parse_spec
from archspec.spec.model import MAX_HEAD_DIM, MAX_HEADS, MAX_WIDTH, AttentionSpec, ModelSpec, Spec
from archspec.spec.train import BPETokenizer, DataSpec, TrainSpec

__all__ = [
    "field_values", "names", "norms", "positionals", "sparsities", "ffns", "attentions", "model_dicts",
    "corpora", "tokenizers", "train_dicts", "spec_dicts", "valid_specs", "invalid_spec_cases",
    "invalid_spec_dicts", "MUTATIONS", "selections", "layer_groups", "NORM_KINDS", "POSITIONAL_KINDS", "SPARSITY_KINDS", "FFN_KINDS", "CORPUS_KINDS",
    "TOKENIZER_KINDS", "union_members", "field_at", "leaves", "shuffled", "divisors", "assert_causal",
]

Strategy = st.SearchStrategy
Path = tuple  # a field path: ("model", "attention", "n_kv_heads"); list items by index

# Defaults used when a field has no upper bound of its own: large enough to matter, small enough to stay cheap.
UNBOUNDED_INT_CAP = 10**6
UNBOUNDED_FLOAT_CAP = 1e6


# ── introspection of the pydantic models ─────────────────────────────────────────────────────────────────────────


def _bounds(field: FieldInfo) -> dict[str, Any]:
    """The numeric and length bounds pydantic keeps in a field's metadata (annotated_types Ge/Gt/Le/Lt/MinLen...)."""
    out: dict[str, Any] = {}
    for m in field.metadata:
        for attr in ("ge", "gt", "le", "lt", "min_length", "max_length"):
            if getattr(m, attr, None) is not None:
                out[attr] = getattr(m, attr)
    return out


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    """(annotation without None, whether None is allowed)."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        optional = len(args) < len(get_args(annotation))
        if len(args) == 1:
            return args[0], optional
        return Union[tuple(args)], optional
    return annotation, False


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    origin = get_origin(annotation)
    if origin is not None and getattr(annotation, "__metadata__", None) is not None:  # Annotated[X, ...]
        return _models_in(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [m for a in get_args(annotation) for m in _models_in(a)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def union_members(owner: type[BaseModel], field_name: str) -> dict[str, type[BaseModel]]:
    """The members of a `kind` union field, by kind: `union_members(ModelSpec, "norm")` → {"layernorm": ..., ...}."""
    return {m.model_fields["kind"].default: m for m in _models_in(owner.model_fields[field_name].annotation)
            if "kind" in m.model_fields}


@lru_cache(maxsize=None)
def _kind_omittable(owner: type[BaseModel], field_name: str) -> str | None:
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
        models = _models_in(field.annotation)
        if not models or not isinstance(child, dict):
            return None
        if len(models) > 1:
            kind = child.get("kind", _kind_omittable(cls, key))
            members = union_members(cls, key)
            if not isinstance(kind, str) or kind not in members:
                return None
            cls = members[kind]
        else:
            cls = models[0]
        node = child
    return None


def field_values(field: FieldInfo, *, int_cap: int = UNBOUNDED_INT_CAP,
                 float_cap: float = UNBOUNDED_FLOAT_CAP) -> Strategy | None:
    """Every valid value of a scalar field, from its annotation and bounds (None: not a scalar this knows)."""
    base, _ = _strip_optional(field.annotation)
    b = _bounds(field)
    if base is bool:
        return st.booleans()
    if get_origin(base) is Literal:
        return st.sampled_from(get_args(base))
    if base is int:
        lo = b.get("ge", b["gt"] + 1 if "gt" in b else -int_cap)
        hi = b.get("le", b["lt"] - 1 if "lt" in b else max(lo, int_cap))
        return st.integers(lo, hi)
    if base is float:
        lo, hi = b.get("ge", b.get("gt", -float_cap)), b.get("le", b.get("lt", float_cap))
        return st.floats(lo, hi, exclude_min="gt" in b, exclude_max="lt" in b, allow_nan=False,
                         allow_infinity=False)
    return None


def _fields(cls: type[BaseModel], overrides: dict[str, Strategy | None] | None = None) -> Strategy:
    """A dict of `cls`'s own fields (not `kind`), each optional, drawn by `field_values` unless overridden
    (an override of None leaves the field out)."""
    overrides = overrides or {}
    optional: dict[str, Strategy] = {}
    for name, field in cls.model_fields.items():
        if name == "kind" or field.exclude:  # an old spelling, read but never written (archspec.spec.legacy)
            continue
        strategy = overrides[name] if name in overrides else field_values(field)
        if strategy is None:
            if name not in overrides:
                raise TypeError(f"archspec.testing: no strategy for {cls.__name__}.{name}; add an override")
            continue
        optional[name] = strategy
    return st.fixed_dictionaries({}, optional=optional)


fields_of = _fields  # what a kind's default `strategy` uses (archspec.kinds.base.KindUnit.strategy)


def _tagged(owner: type[BaseModel], field_name: str, kind: str, body: Strategy) -> Strategy:
    """`body` with its `kind` written, or omitted where the union's default member is meant."""
    omittable = _kind_omittable(owner, field_name) == kind

    @st.composite
    def build(draw):
        out = dict(draw(body))
        if not omittable or draw(st.booleans()):
            out = {"kind": kind, **out}
        return out

    return build()


def _family(owner: type[BaseModel], field_name: str, table: dict[str, Callable[..., Strategy | None]],
            kinds: Iterator[str] | None, *args: Any) -> Strategy:
    chosen = list(kinds) if kinds is not None else list(table)
    parts = [(k, table[k](*args)) for k in chosen]
    parts = [_tagged(owner, field_name, k, s) for k, s in parts if s is not None]
    if not parts:
        raise ValueError(f"archspec.testing: no {field_name} kind among {chosen} fits {args}")
    return st.one_of(parts)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ── names ────────────────────────────────────────────────────────────────────────────────────────────────────────


def names() -> Strategy:
    """Valid spec names (slugs), short, minus the few reserved ones (see archspec.spec.rules.RESERVED_NAMES)."""
    from archspec.spec.rules import RESERVED_NAMES

    return st.from_regex(r"[a-z0-9][a-z0-9_-]{0,15}", fullmatch=True).filter(lambda n: n not in RESERVED_NAMES)


# ── the model's families: each kind draws itself (its unit's `strategy`), so a registered kind is drawn too ───


class _KindTable(dict):
    """kind → strategy factory of one family, read from the kinds registry each time (a kind registered later by a
    plugin appears here). Factories take the drawing context: d_model, context_length, max_hidden."""

    def __init__(self, family_name: str) -> None:
        super().__init__()
        self.family_name = family_name

    def _members(self) -> dict[str, Any]:
        return family(self.family_name).members

    def __iter__(self):
        return iter(self._members())

    def __len__(self) -> int:
        return len(self._members())

    def __contains__(self, kind: object) -> bool:
        return kind in self._members()

    def __getitem__(self, kind: str) -> Callable[..., Strategy | None]:
        return self._members()[kind].strategy

    def keys(self):
        return self._members().keys()

    def items(self):
        return [(k, m.strategy) for k, m in self._members().items()]


NORM_KINDS = _KindTable("norm")
POSITIONAL_KINDS = _KindTable("positional")
SPARSITY_KINDS = _KindTable("sparsity")
FFN_KINDS = _KindTable("ffn")


def _ctx(d_model: int = 64, context_length: int = 32, max_hidden: int = 128) -> dict[str, int]:
    return {"d_model": d_model, "context_length": context_length, "max_hidden": max_hidden}


def norms(kinds=None, d_model: int = 64) -> Strategy:
    return _family(ModelSpec, "norm", NORM_KINDS, kinds, _ctx(d_model))


def positionals(d_model: int = 64, kinds=None) -> Strategy:
    return _family(AttentionSpec, "positional", POSITIONAL_KINDS, kinds, _ctx(d_model))


def sparsities(context_length: int = 32, kinds=None) -> Strategy:
    return _family(AttentionSpec, "sparsity", SPARSITY_KINDS, kinds, _ctx(context_length=context_length))


def ffns(d_model: int = 64, kinds=None, max_hidden: int = 128) -> Strategy:
    """FFN dicts; every activation of each kind comes from the spec's own Literal."""
    return _family(ModelSpec, "ffn", FFN_KINDS, kinds, _ctx(d_model, max_hidden=max_hidden))


# ── attention ────────────────────────────────────────────────────────────────────────────────────────────────────


@st.composite
def attentions(draw, d_model: int = 64, context_length: int = 32, *, max_heads: int = 8, max_head_dim: int = 16,
               positional_kinds=None, sparsity_kinds=None) -> dict:
    """Attention dicts valid for `d_model`: MHA / GQA / MQA (n_kv_heads over the divisors of n_heads, or omitted),
    head_dim omitted (derived), written equal to the derived value, or free (≠ d_model // n_heads)."""
    out: dict[str, Any] = {}
    positional = draw(positionals(d_model, positional_kinds))
    pos_kind = positional.get("kind", _kind_omittable(AttentionSpec, "positional"))
    mult = family("positional").members[pos_kind].head_dim_multiple  # e.g. rope rotates pairs of dimensions
    max_heads = max(1, min(max_heads, MAX_HEADS, 4 * d_model))

    # The K/V layout first, then head counts that allow it: n_kv_heads = n_heads (MHA, or omitted), 1 (MQA), or a
    # divisor in between (GQA).
    kv = draw(st.sampled_from(["gqa", "mqa", "mha", "omit"]))
    fits = (lambda h: any(1 < k < h for k in divisors(h))) if kv == "gqa" else (lambda h: True)
    derivable = [h for h in divisors(d_model) if h <= max_heads and d_model // h <= MAX_HEAD_DIM
                 and (d_model // h) % mult == 0 and fits(h)]
    free = [h for h in range(1, max_heads + 1) if fits(h)] or list(range(1, max_heads + 1))
    mode = draw(st.sampled_from(["omit", "written", "free"])) if derivable else "free"
    if mode == "free":
        n_heads = draw(st.sampled_from(free))
        limit = min(max_head_dim, MAX_HEAD_DIM, 8 * d_model // n_heads)  # n_heads·head_dim ≤ 8·d_model
        head_dim = mult * draw(st.integers(1, max(1, limit // mult)))
        out.update(n_heads=n_heads, head_dim=head_dim)
    else:
        n_heads = draw(st.sampled_from(derivable))
        out["n_heads"] = n_heads
        if mode == "written":
            out["head_dim"] = d_model // n_heads
    grouped = [k for k in divisors(n_heads) if 1 < k < n_heads]
    if kv == "gqa" and grouped:
        out["n_kv_heads"] = draw(st.sampled_from(grouped))
    elif kv == "mqa":
        out["n_kv_heads"] = 1
    elif kv == "mha":
        out["n_kv_heads"] = n_heads  # written out; omitted means the same
    for bias in ("bias", "qkv_bias", "out_bias"):
        if draw(st.booleans()):
            out[bias] = draw(st.booleans())
    if draw(st.booleans()):  # q/k norm: absent, null, or on with its own eps
        out["qk_norm"] = draw(st.one_of(st.none(), st.builds(dict), st.floats(1e-8, 0.1).map(lambda e: {"eps": e})))
    if positional or draw(st.booleans()):  # {} is the default member with its defaults: written or not
        out["positional"] = positional
    if draw(st.booleans()):
        out["sparsity"] = draw(sparsities(context_length, sparsity_kinds))
    return out


# ── the model ────────────────────────────────────────────────────────────────────────────────────────────────────


@st.composite
def model_dicts(draw, *, min_vocab: int = 16, max_vocab: int = 300, min_d_model: int = 8, max_d_model: int = 64,
                max_layers: int = 3, min_context: int = 4, max_context: int = 32, max_heads: int = 8,
                max_head_dim: int = 16, max_hidden: int = 128, dropout: Strategy | None = None,
                norm_kinds=None, positional_kinds=None, sparsity_kinds=None, ffn_kinds=None,
                per_layer: bool = True) -> dict:
    """`model:` dicts. Sizes are always written (the defaults are far too large to build in a test); every other
    field may be omitted. `dropout` defaults to exactly 0.0 (written or omitted) so that outputs are deterministic.
    With `per_layer`, some draws add layer groups (`layer_groups`) that vary norm, attention or FFN by layer."""
    vocab = draw(st.integers(min_vocab, max_vocab))
    context = draw(st.integers(min_context, max_context))
    d_model = draw(st.integers(min_d_model, min(max_d_model, MAX_WIDTH)))
    out: dict[str, Any] = {"vocab_size": vocab, "context_length": context, "d_model": d_model,
                           "n_layers": draw(st.integers(1, max_layers))}
    out["attention"] = draw(attentions(d_model, context, max_heads=max_heads, max_head_dim=max_head_dim,
                                       positional_kinds=positional_kinds, sparsity_kinds=sparsity_kinds))
    optional = {
        "norm": norms(norm_kinds, d_model),
        "ffn": ffns(d_model, ffn_kinds, max_hidden),
        "tie_embeddings": st.booleans(),
        "embedding_scale": st.sampled_from(["none", "sqrt_d_model"]),
        "dropout": dropout if dropout is not None else st.just(0.0),
    }
    out.update(draw(st.fixed_dictionaries({}, optional=optional)))
    if per_layer and out["n_layers"] > 1 and draw(st.booleans()):
        out["layers"] = draw(layer_groups(out["n_layers"], d_model, context, out["attention"]["n_heads"],
                                          max_hidden=max_hidden, norm_kinds=norm_kinds, ffn_kinds=ffn_kinds,
                                          sparsity_kinds=sparsity_kinds))
    return out


def selections(n_layers: int) -> Strategy:
    """`select:` values for a model of `n_layers`: an explicit list, or a range written with any of its fields."""
    listed = st.lists(st.integers(0, n_layers - 1), min_size=1, max_size=n_layers, unique=True)

    @st.composite
    def ranged(draw):
        start = draw(st.integers(0, n_layers - 1))
        out: dict[str, int] = {}
        if start or draw(st.booleans()):
            out["start"] = start
        if draw(st.booleans()):
            out["stop"] = draw(st.integers(start + 1, n_layers))
        if draw(st.booleans()):
            out["step"] = draw(st.integers(1, n_layers))
        return out

    return st.one_of(listed, ranged())


@st.composite
def layer_groups(draw, n_layers: int, d_model: int, context_length: int, n_heads: int, *, max_hidden: int = 128,
                 norm_kinds=None, ffn_kinds=None, sparsity_kinds=None) -> dict:
    """`model.layers` dicts: up to two named groups that never disagree where they overlap (one varies the FFN
    and/or norm, the other the attention: K/V heads, pattern or biases)."""
    out: dict[str, Any] = {}
    names = draw(st.permutations(["a", "wide", "g-1", "mix_2"]))
    if draw(st.booleans()):
        group: dict[str, Any] = {"select": draw(selections(n_layers))}
        parts = draw(st.sampled_from([("ffn",), ("norm",), ("ffn", "norm")]))
        if "ffn" in parts:
            # kind written: fields merge onto the model-wide FFN, which may be another kind
            ffn = draw(ffns(d_model, ffn_kinds, max_hidden))
            if ffn and "kind" not in ffn:  # merged onto the model's FFN: an omitted kind would inherit that kind,
                ffn = {"kind": family("ffn").default, **ffn}  # not the default one these fields were drawn for
            group["ffn"] = ffn or {"kind": family("ffn").default, "hidden_dim": draw(st.integers(1, max_hidden))}
        if "norm" in parts:
            group["norm"] = {"kind": family("norm").default, **draw(norms(norm_kinds, d_model))}
        out[names[0]] = group
    if not out or draw(st.booleans()):
        grouped = [k for k in divisors(n_heads)]
        attention = draw(st.fixed_dictionaries({}, optional={
            "n_kv_heads": st.sampled_from(grouped),
            "sparsity": sparsities(context_length, sparsity_kinds).map(
                lambda d: {"kind": family("sparsity").default, **d}),
            "qkv_bias": st.booleans(),
            "out_bias": st.booleans(),
        }))
        out[names[1]] = {"select": draw(selections(n_layers)), "attention": attention or {"qkv_bias": True}}
    return out


# ── the training recipe ──────────────────────────────────────────────────────────────────────────────────────────

# Each corpus kind given the training window (train.seq_len): capability tasks must fit it, and need at least 3;
# each tokenizer kind given model.vocab_size. The strategies are the units' own (archspec.data), so a registered
# kind is drawn too (the tables are read when drawing, not frozen at import).
class _DataKindTable(_KindTable):
    def _members(self) -> dict[str, Any]:
        return data_family(self.family_name).members


CORPUS_KINDS = _DataKindTable("corpus")
TOKENIZER_KINDS = _DataKindTable("tokenizer")


def corpora(kinds=None, seq_len: int = 128) -> Strategy:
    return _family(DataSpec, "corpus", CORPUS_KINDS, kinds, seq_len)


def tokenizers(vocab_size: int, kinds=None) -> Strategy:
    return _family(DataSpec, "tokenizer", TOKENIZER_KINDS, kinds, vocab_size)


@st.composite
def train_dicts(draw, context_length: int, vocab_size: int) -> dict:
    """`train:` dicts: any subset of the recipe's fields over their declared ranges, under the cross-field rules
    (seq_len ≤ context_length, warmup_steps ≤ steps, BPE vocab ≤ model vocab)."""
    fields = TrainSpec.model_fields
    steps = draw(st.none() | st.integers(1, 1000))
    eff_steps = steps if steps is not None else fields["steps"].default
    overrides: dict[str, Strategy | None] = {
        "steps": None, "warmup_steps": None, "data": None,  # drawn below: they depend on each other
        "seq_len": st.integers(1, context_length),
        # how the work is spread and activations kept: an omitted kind is the default member (ddp, none)
        "parallel": st.sampled_from([{}, {"kind": "ddp"}, {"kind": "fsdp"}, {"kind": "fsdp", "reshard_after_forward": False}]),
        "activation_checkpointing": st.one_of(
            st.sampled_from([{}, {"kind": "none"}, {"kind": "full"}]),
            st.integers(1, 4096).map(lambda k: {"kind": "every_k", "k": k})),
    }
    out = dict(draw(_fields(TrainSpec, overrides)))
    if steps is not None:
        out["steps"] = steps
    if eff_steps < fields["warmup_steps"].default or draw(st.booleans()):
        out["warmup_steps"] = draw(st.integers(0, eff_steps))
    if draw(st.booleans()):
        data = {}
        if draw(st.booleans()):
            data["corpus"] = draw(corpora(seq_len=out.get("seq_len") or context_length))
        if draw(st.booleans()):  # capability tasks are written in byte ids: byte tokenizer only
            task = data.get("corpus", {}).get("kind") in task_kinds()
            data["tokenizer"] = draw(tokenizers(vocab_size, [task_tokenizer().kind_name()] if task else None))
        if draw(st.booleans()):
            data["val_fraction"] = draw(field_values(DataSpec.model_fields["val_fraction"]))
        out["data"] = data
    return out


# ── whole specs ──────────────────────────────────────────────────────────────────────────────────────────────────


@st.composite
def spec_dicts(draw, *, train: bool = True, **model_kwargs: Any) -> dict:
    """Valid raw spec dicts (as a user writes them). `model_kwargs` go to `model_dicts` (sizes, kinds)."""
    model = draw(model_dicts(**model_kwargs))
    out: dict[str, Any] = {"name": draw(names()), "model": model}
    if train and draw(st.booleans()):
        out["train"] = draw(train_dicts(model["context_length"], model["vocab_size"]))
    return out


def valid_specs(**kwargs: Any) -> Strategy:
    """Validated `Spec` objects: `spec_dicts(**kwargs).map(parse_spec)`."""
    return spec_dicts(**kwargs).map(parse_spec)


# ── invalid specs ────────────────────────────────────────────────────────────────────────────────────────────────

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


def _nodes(data: dict, path: Path = ()) -> Iterator[tuple[Path, dict]]:
    """Every mapping in a spec dict with its path (the root first)."""
    yield path, data
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _nodes(value, path + (key,))


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


def _get(data: Any, path: Path) -> Any:
    for key in path:
        data = data[key]
    return data


def _set(data: dict, path: Path, value: Any) -> None:
    node = data
    for key in path[:-1]:
        node = node[key] if isinstance(node, list) else node.setdefault(key, {})
    node[path[-1]] = value


def _invalid_values(field: FieldInfo, draw) -> list[Any]:
    """Values no lax coercion turns into a valid value of `field`."""
    base, optional = _strip_optional(field.annotation)
    b = _bounds(field)
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
    path, node = draw(st.sampled_from(list(_nodes(data))))
    key = draw(_JUNK_KEYS)
    node[key] = draw(_JUNK)
    return path + ((key,) if isinstance(key, str) else ())


def _mutate_bad_kind(draw, data, spec):
    unions = [p for p, _ in _nodes(data) if p and (info := field_at(data, p)) and union_members(info[0], p[-1])]
    if not unions:
        return None
    path = draw(st.sampled_from(unions))
    owner, field = field_at(data, path)
    kinds = set(union_members(owner, path[-1]))
    _get(data, path)["kind"] = draw(st.one_of(
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
    _set(data, path, draw(st.sampled_from(_invalid_values(field, draw))))
    return path


def _mutate_list_item(draw, data, spec):
    items = [p for p, _ in leaves(data) if p and isinstance(p[-1], int) and field_at(data, p[:-1]) is not None]
    if not items:
        return None
    path = draw(st.sampled_from(items))
    _set(data, path, draw(st.sampled_from([None, 1, 2.5, True, [], ["x"], {"x-": 1}])))
    return path


def _mutate_subtree(draw, data, spec):
    candidates = [p for p, _ in _nodes(data) if p]
    if not candidates:
        return None
    path = draw(st.sampled_from(candidates))
    garbage = draw(st.one_of(
        st.none(), st.integers(), st.floats(), st.text(max_size=8), st.lists(_JUNK, max_size=3),
        st.dictionaries(_JUNK_KEYS.filter(lambda k: isinstance(k, str)), _JUNK, min_size=1, max_size=3),
    ))
    _set(data, path, garbage)
    try:
        parse_spec(data)
    except Exception:  # noqa: BLE001
        return path
    return None  # the garbage is valid there (null for an optional field such as attention.qk_norm): no mutation


def _mutate_remove_name(draw, data, spec):
    data.pop("name", None)
    return ("name",)


# Cross-field rules: each sets fields so that exactly this rule is broken, and blames the path it reports.


def _rule_kv_heads(draw, data, spec):
    n_heads = spec.model.attention.n_heads
    bad = [k for k in range(2, min(MAX_HEADS, 64) + 1) if n_heads % k or k > n_heads]
    _set(data, ("model", "attention", "n_kv_heads"), draw(st.sampled_from(bad)))
    return ("model", "attention", "n_kv_heads")


def _rule_heads_divide_d_model(draw, data, spec):
    d_model = spec.model.d_model
    bad = [h for h in range(2, min(MAX_HEADS, 64) + 1) if d_model % h]
    if not bad:
        return None
    att = data["model"].setdefault("attention", {})
    att["n_heads"] = draw(st.sampled_from(bad))
    att.pop("head_dim", None)
    att.pop("n_kv_heads", None)
    return ("model", "attention", "n_heads")


def _rule_rope_even_head_dim(draw, data, spec):
    att = data["model"].setdefault("attention", {})
    att["positional"] = {"kind": "rope"}
    att["head_dim"] = 2 * draw(st.integers(0, 3)) + 1  # n_heads·head_dim ≤ 8·d_model holds for these sizes
    if att.get("n_heads", spec.model.attention.n_heads) * att["head_dim"] > 8 * spec.model.d_model:
        return None
    return ("model", "attention", "head_dim")


def _rule_width(draw, data, spec):
    m = spec.model
    n_heads = m.attention.n_heads
    head_dim = 8 * m.d_model // n_heads + 2
    head_dim += head_dim % 2
    if head_dim > MAX_HEAD_DIM:
        return None
    _set(data, ("model", "attention", "head_dim"), head_dim)
    return ("model", "attention", "head_dim")


def _rule_sinusoidal_even(draw, data, spec):
    m = spec.model
    if m.d_model % 2 == 0 and m.d_model + 1 > MAX_WIDTH:
        return None
    data["model"]["d_model"] = m.d_model + (m.d_model % 2 == 0)
    att = data["model"].setdefault("attention", {})
    att["positional"] = {"kind": "sinusoidal"}
    att["head_dim"] = m.attention.head_dim  # keep the heads valid at the new width
    return ("model", "d_model")


def _rule_seq_len(draw, data, spec):
    ctx = spec.model.context_length
    _set(data, ("train", "seq_len"), ctx + draw(st.integers(1, 10**6)))
    return ("train", "seq_len")


def _rule_warmup(draw, data, spec):
    steps = spec.train.steps
    _set(data, ("train", "warmup_steps"), steps + draw(st.integers(1, 1000)))
    return ("train", "warmup_steps")


def _rule_bpe_vocab(draw, data, spec):
    vocab = spec.model.vocab_size
    lo = max(vocab + 1, 260)
    if lo + 1000 > _bounds(BPETokenizer.model_fields["vocab_size"])["le"]:
        return None
    _set(data, ("train", "data", "tokenizer"), {"kind": BPETokenizer.kind_name(),
                                                 "vocab_size": draw(st.integers(lo, lo + 1000))})
    return ("train", "data", "tokenizer", "vocab_size")


# The first entry is the most frequent draw (Hypothesis favours small indices): the richest mutation goes there.
MUTATIONS: dict[str, Callable] = {
    "bad_value": _mutate_leaf,
    "bad_kind": _mutate_bad_kind,
    "unknown_key": _mutate_unknown_key,
    "bad_list_item": _mutate_list_item,
    "garbage_subtree": _mutate_subtree,
    "missing_name": _mutate_remove_name,
    "rule_kv_heads": _rule_kv_heads,
    "rule_heads_divide_d_model": _rule_heads_divide_d_model,
    "rule_rope_even_head_dim": _rule_rope_even_head_dim,
    "rule_width": _rule_width,
    "rule_sinusoidal_even": _rule_sinusoidal_even,
    "rule_seq_len": _rule_seq_len,
    "rule_warmup": _rule_warmup,
    "rule_bpe_vocab": _rule_bpe_vocab,
}


@st.composite
def invalid_spec_cases(draw, max_mutations: int = 2, mutations=None, **spec_kwargs: Any) -> tuple[dict, list, list]:
    """(invalid dict, blamed paths, mutation names): a valid spec dict with 1..max_mutations mutations applied.

    Every case is invalid; validation must report a problem at (or under) at least one blamed path. A blamed path
    is given as the user writes it (no union tag), with list items by index; () blames nothing in particular
    (a key that is not a string)."""
    data = draw(spec_dicts(**spec_kwargs))
    table = {k: MUTATIONS[k] for k in mutations} if mutations is not None else MUTATIONS
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


# ── helpers for properties ───────────────────────────────────────────────────────────────────────────────────────


def shuffled(obj: Any, rnd) -> Any:
    """The same value with every mapping's keys in a random order (`rnd`: a random.Random, e.g. st.randoms())."""
    if isinstance(obj, dict):
        items = list(obj.items())
        rnd.shuffle(items)
        return {k: shuffled(v, rnd) for k, v in items}
    if isinstance(obj, list):
        return [shuffled(v, rnd) for v in obj]
    return obj


def assert_causal(model, vocab_size: int, seq_len: int, position: int, *, batch: int = 2, seed: int = 0,
                  atol: float = 1e-5) -> None:
    """Change the token at `position` and check that logits before it are unchanged (within atol) and logits at
    it changed (so the check cannot pass on a model that ignores its input). Puts the model in eval mode."""
    import torch

    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab_size, (batch, seq_len), generator=g)
    changed = idx.clone()
    changed[:, position] = (idx[:, position] + torch.randint(1, vocab_size, (batch,), generator=g)) % vocab_size
    model.eval()
    with torch.no_grad():
        before, after = model(idx), model(changed)
    leak = (before[:, :position] - after[:, :position]).abs().max().item() if position else 0.0
    assert leak <= atol, f"logits before position {position} changed by {leak:.3g} (> {atol}): not causal"
    moved = (before[:, position] - after[:, position]).abs().max().item()
    assert moved > 0.0, f"logits at position {position} did not change with its token: the check is vacuous"


def module_active_params(model) -> int:
    """Parameters one token uses, counted on a built module: all of them, except that a module holding stacked
    routed `experts` (leading dim n_experts) with `top_k` counts top_k / n_experts of its experts' parameters."""
    total = sum(p.numel() for p in model.parameters())
    for module in model.modules():
        experts, top_k = getattr(module, "experts", None), getattr(module, "top_k", None)
        if experts is None or top_k is None:
            continue
        stacked = list(experts.parameters())
        n_experts = stacked[0].shape[0]
        routed = sum(p.numel() for p in stacked)
        assert routed % n_experts == 0
        total -= routed - routed // n_experts * top_k
    return total
