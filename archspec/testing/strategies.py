"""Hypothesis strategies for valid specs: raw dicts as a user writes them, and the `Spec` objects they validate to.

Shape. One strategy per union family — `norms()`, `positionals(d_model)`, `sparsities(context_length)`,
`ffns(d_model)`, `corpora()`, `tokenizers(vocab_size)` — each a choice over one strategy per `kind`, listed in a
table beside it (`NORM_KINDS`, `POSITIONAL_KINDS`, `SPARSITY_KINDS`, `FFN_KINDS`, ...). The model's four tables are
read from the kinds registry: each kind draws itself (its unit's `strategy`), so a kind registered later is drawn
too. `attentions()` and `model_dicts()` combine the families under the cross-field rules; `spec_dicts()` adds a name
and a recipe.

Per-kind strategies derive each field's range from the pydantic field itself (`field_values`,
archspec.kinds.introspect), so a new field is drawn over its declared bounds unless an override keeps it small
(sizes) or ties it to another field (rules).

Strategies draw raw dicts as a user would write them: an optional field (a default, the `kind` of a defaulted
union member, a derived default such as head_dim) is sometimes omitted and sometimes written out, so that hash
properties see both forms. Sizes stay small by default (vocab 16-300, d_model 8-64, 1-3 layers, context 4-32) so
that a drawn spec builds and runs in milliseconds on a CPU.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, get_args

from hypothesis import strategies as st
from pydantic import BaseModel

from archspec.kinds import family
from archspec.kinds.attention.scores import score_strategy
from archspec.kinds.introspect import field_values, fields_of
from archspec.spec import parse_spec
from archspec.spec.model import MAX_HEAD_DIM, MAX_HEADS, MAX_WIDTH, AttentionSpec, ModelSpec
from archspec.data.base import data_family, task_kinds, task_tokenizer
from archspec.spec.train import DataSpec, LogSink, MuonOptimizer, TrainSpec
from archspec.testing.introspect import kind_omittable

Strategy = st.SearchStrategy


def _tagged(owner: type[BaseModel], field_name: str, kind: str, body: Strategy) -> Strategy:
    """`body` with its `kind` written, or omitted where the union's default member is meant."""
    omittable = kind_omittable(owner, field_name) == kind

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
ATTENTION_KINDS = _KindTable("attention")
MIXER_KINDS = _KindTable("mixer")  # token mixers other than attention (attention kinds are ATTENTION_KINDS)


def _ctx(d_model: int = 64, context_length: int = 32, max_hidden: int = 128) -> dict[str, int]:
    return {"d_model": d_model, "context_length": context_length, "max_hidden": max_hidden}


def norms(kinds=None, d_model: int = 64) -> Strategy:
    return _family(ModelSpec, "norm", NORM_KINDS, kinds, _ctx(d_model))


def positionals(d_model: int = 64, kinds=None) -> Strategy:
    return _family(AttentionSpec, "positional", POSITIONAL_KINDS, kinds, _ctx(d_model))


def sparsities(context_length: int = 32, kinds=None) -> Strategy:
    return _family(AttentionSpec, "sparsity", SPARSITY_KINDS, kinds, _ctx(context_length=context_length))


def mixers(d_model: int = 64, kinds=None, context_length: int = 32) -> Strategy:
    """Token mixer dicts of the kinds that are not attention (`model.mixer`, a layer group's `mixer`), each kind's
    fields from its own strategy; `kind` always written (a group's mixer merges onto the model-wide one)."""
    return _family(ModelSpec, "mixer", MIXER_KINDS, kinds, _ctx(d_model, context_length)).map(
        lambda d: {"kind": family("mixer").default, **d})


def mixer_patterns(n_layers: int, d_model: int, context_length: int = 32, kinds=None) -> Strategy:
    """`model` fields choosing each layer's token mixer: {} (attention everywhere), `mixer` (no layer attends: the
    model has no attention), or a layer group giving some layers, never all, another mixer."""

    @st.composite
    def draw_pattern(draw):
        mixer = draw(mixers(d_model, kinds, context_length))
        choice = draw(st.sampled_from(["attention", "every", "some"] if n_layers > 1 else ["attention", "every"]))
        if choice == "attention":
            return {}
        if choice == "every":
            return {"mixer": mixer}
        layers = draw(st.lists(st.integers(0, n_layers - 1), min_size=1, max_size=n_layers - 1, unique=True))
        return {"layers": {"mix": {"select": sorted(layers), "mixer": mixer}}}

    return draw_pattern()


def ffns(d_model: int = 64, kinds=None, max_hidden: int = 128) -> Strategy:
    """FFN dicts; every activation of each kind comes from the spec's own Literal."""
    return _family(ModelSpec, "ffn", FFN_KINDS, kinds, _ctx(d_model, max_hidden=max_hidden))


# ── attention ────────────────────────────────────────────────────────────────────────────────────────────────────


@st.composite
def attentions(draw, d_model: int = 64, context_length: int = 32, *, max_heads: int = 8, max_head_dim: int = 16,
               positional_kinds=None, sparsity_kinds=None, attention_kinds=None) -> dict:
    """Attention dicts valid for `d_model`, of every attention kind (`attention_kinds`: some of them). The default
    kind: MHA / GQA / MQA (n_kv_heads over the divisors of n_heads, or omitted), head_dim omitted (derived), written
    equal to the derived value, or free (≠ d_model // n_heads). Another kind draws its own fields (its unit's
    `strategy`, told the positional kind's `head_dim_multiple`); positional and sparsity as for the default."""
    out: dict[str, Any] = {}
    positional = draw(positionals(d_model, positional_kinds))
    pos_kind = positional.get("kind", kind_omittable(AttentionSpec, "positional"))
    mult = family("positional").members[pos_kind].head_dim_step(positional)  # e.g. rope rotates pairs of dimensions
    kinds = list(attention_kinds) if attention_kinds is not None else list(ATTENTION_KINDS)
    kind = draw(st.sampled_from(kinds))
    if kind != family("attention").default:
        ctx = {**_ctx(d_model, context_length), "head_dim_multiple": mult, "max_heads": max_heads}
        out = {"kind": kind, **draw(ATTENTION_KINDS[kind](ctx))}
        if positional or draw(st.booleans()):
            out["positional"] = positional
        if draw(st.booleans()):
            out["sparsity"] = draw(sparsities(context_length, sparsity_kinds))
        return out
    if draw(st.booleans()):
        out["kind"] = kind  # the default kind, written (a Since field: hashes alike)
    max_heads = max(1, min(max_heads, MAX_HEADS, 4 * d_model))

    # The K/V layout first, then head counts that allow it: n_kv_heads = n_heads (MHA, or omitted), 1 (MQA), or a
    # divisor in between (GQA).
    kv = draw(st.sampled_from(["grouped", "mqa", "mha", "omit"]))
    fits = (lambda h: any(1 < k < h for k in divisors(h))) if kv == "grouped" else (lambda h: True)
    derivable = [h for h in divisors(d_model) if h <= max_heads and d_model // h <= MAX_HEAD_DIM
                 and (d_model // h) % mult == 0 and fits(h)]
    def limit(h: int) -> int:  # the widest head h heads may have: n_heads·head_dim ≤ 8·d_model
        return min(max(max_head_dim, mult), MAX_HEAD_DIM, 8 * d_model // h)

    # a free width is a multiple of the positional step (rope at partial 0.375: 16), so few heads can take it
    free = ([h for h in range(1, max_heads + 1) if fits(h) and limit(h) >= mult]
            or [h for h in range(1, max_heads + 1) if limit(h) >= mult] or [1])
    mode = draw(st.sampled_from(["omit", "written", "free"])) if derivable else "free"
    if mode == "free":
        n_heads = draw(st.sampled_from(free))
        limit = limit(n_heads)
        head_dim = mult * draw(st.integers(1, max(1, limit // mult)))
        out.update(n_heads=n_heads, head_dim=head_dim)
    else:
        n_heads = draw(st.sampled_from(derivable))
        out["n_heads"] = n_heads
        if mode == "written":
            out["head_dim"] = d_model // n_heads
    grouped = [k for k in divisors(n_heads) if 1 < k < n_heads]
    if kv == "grouped" and grouped:
        out["n_kv_heads"] = draw(st.sampled_from(grouped))
    elif kv == "mqa":
        out["n_kv_heads"] = 1
    elif kv == "mha":
        out["n_kv_heads"] = n_heads  # written out; omitted means the same
    for bias in ("bias", "qkv_bias", "out_bias"):
        if draw(st.booleans()):
            out[bias] = draw(st.booleans())
    if draw(st.booleans()):  # q/k norm: absent, null, or on with its own eps, per head or over the projection
        out["qk_norm"] = draw(st.one_of(st.none(), st.fixed_dictionaries({}, optional={
            "eps": st.floats(1e-8, 0.1), "scope": st.sampled_from(["head", "projection"])})))
    out.update(score_strategy(draw))  # softcap and scale: absent, null or drawn
    if positional or draw(st.booleans()):  # {} is the default member with its defaults: written or not
        out["positional"] = positional
    if draw(st.booleans()):
        out["sparsity"] = draw(sparsities(context_length, sparsity_kinds))
    return out


# ── the block's shape ────────────────────────────────────────────────────────────────────────────────────────────


@st.composite
def block_shapes(draw) -> dict:
    """`block:` dicts (archspec.spec.layers.BlockShape) under its rules: shared_norm only with parallel, a parallel
    block pre- or sandwich-norm. Each field written or left at its default."""
    parallel = draw(st.booleans())
    placements = ["pre", "sandwich"] if parallel else ["pre", "post", "sandwich", "output"]
    out: dict[str, Any] = {}
    placement = draw(st.sampled_from(placements))
    if placement != "pre" or draw(st.booleans()):
        out["norm_placement"] = placement
    if parallel or draw(st.booleans()):
        out["parallel"] = parallel
    shared = parallel and draw(st.booleans())
    if shared or draw(st.booleans()):
        out["shared_norm"] = shared
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
        "embedding_norm": st.booleans(),
        "dropout": dropout if dropout is not None else st.just(0.0),
        "block": block_shapes(),
        "final_norm": st.booleans(),
        "lm_head_bias": st.booleans(),
        "logit_softcap": st.one_of(st.none(), st.floats(0.5, 50.0)),
    }
    out.update(draw(st.fixed_dictionaries({}, optional=optional)))
    if draw(st.booleans()):  # µP (Since 0.4: omitted above so old draws stay as they were); its base width any
        out["parametrization"] = draw(st.sampled_from(["standard", "mup"]))
        if out["parametrization"] == "mup":
            if out.get("embedding_scale", "none") != "none":  # µP keeps the embeddings' scale (archspec.spec.rules)
                del out["embedding_scale"]
            if draw(st.booleans()):
                out["mup_base_width"] = draw(st.integers(1, 256))
    if per_layer and out["n_layers"] > 1 and draw(st.booleans()):
        out["layers"] = draw(layer_groups(out["n_layers"], d_model, context, out["attention"]["n_heads"],
                                          max_hidden=max_hidden, norm_kinds=norm_kinds, ffn_kinds=ffn_kinds,
                                          sparsity_kinds=sparsity_kinds, attention=out["attention"]))
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
                 norm_kinds=None, ffn_kinds=None, sparsity_kinds=None, attention: dict | None = None) -> dict:
    """`model.layers` dicts: up to two named groups that never disagree where they overlap (one varies the FFN
    and/or norm, the other the attention: K/V heads, pattern or biases; or, for another attention kind than the
    model-wide one, its pattern, or another kind for some layers, keeping the width positions are applied to)."""
    out: dict[str, Any] = {}
    names = draw(st.permutations(["a", "wide", "g-1", "mix_2"]))
    if draw(st.booleans()):
        group: dict[str, Any] = {"select": draw(selections(n_layers))}
        parts = draw(st.sampled_from([("ffn",), ("norm",), ("ffn", "norm"), ("block",), ("ffn", "block")]))
        if "ffn" in parts:
            # kind written: fields merge onto the model-wide FFN, which may be another kind
            ffn = draw(ffns(d_model, ffn_kinds, max_hidden))
            if ffn and "kind" not in ffn:  # merged onto the model's FFN: an omitted kind would inherit that kind,
                ffn = {"kind": family("ffn").default, **ffn}  # not the default one these fields were drawn for
            group["ffn"] = ffn or {"kind": family("ffn").default, "hidden_dim": draw(st.integers(1, max_hidden))}
        if "norm" in parts:
            group["norm"] = {"kind": family("norm").default, **draw(norms(norm_kinds, d_model))}
        if "block" in parts:  # every field written: merged onto the model-wide shape, a left-out one would inherit
            shape = draw(block_shapes())
            group["block"] = {"norm_placement": "pre", "parallel": False, "shared_norm": False, **shape}
        out[names[0]] = group
    default_kind = family("attention").default
    kind = (attention or {}).get("kind", default_kind)
    other = [k for k in ATTENTION_KINDS if k != kind]
    wants_attention = not out or draw(st.booleans())
    if wants_attention and (kind != default_kind or (other and draw(st.booleans()))):
        sparsity = sparsities(context_length, sparsity_kinds).map(lambda d: {"kind": family("sparsity").default, **d})
        if kind != default_kind and draw(st.booleans()):  # the model's own kind, another pattern for these layers
            group_att = {"sparsity": draw(sparsity)}
        else:  # another kind for these layers, rotating as many dims as the model-wide one
            new = draw(st.sampled_from([default_kind, *other] if kind != default_kind else other))
            wide = parse_spec({"name": "x", "model": {"d_model": d_model, "attention": attention or {}}}).model.attention
            group_att = {"kind": new, **draw(ATTENTION_KINDS[new]({**_ctx(d_model, context_length), "max_heads": 1,
                                                                 "rotary_width": wide.rotary_width}))}
            if draw(st.booleans()):
                group_att["sparsity"] = draw(sparsity)
        out[names[1]] = _positions_off(draw, {"select": draw(selections(n_layers)), "attention": group_att},
                                       n_layers, attention)
    elif wants_attention:
        wide = attention
        grouped = [k for k in divisors(n_heads)]
        attention = draw(st.fixed_dictionaries({}, optional={
            "n_kv_heads": st.sampled_from(grouped),
            "sparsity": sparsities(context_length, sparsity_kinds).map(
                lambda d: {"kind": family("sparsity").default, **d}),
            "qkv_bias": st.booleans(),
            "out_bias": st.booleans(),
        }))
        out[names[1]] = _positions_off(draw, {"select": draw(selections(n_layers)),
                                              "attention": attention or {"qkv_bias": True}}, n_layers, wide)
    return out


def _positions_off(draw, group: dict, n_layers: int, attention: dict | None) -> dict:
    """Sometimes switch positions off for the group's layers (NoPE layers, SmolLM3), where the model's positional
    kind allows it (acts inside attention) and the group leaves some layer its positions."""
    from archspec.spec.layers import LayerRange, layer_indices

    positional = (attention or {}).get("positional") or {}
    kind = family("positional").members[positional.get("kind", family("positional").default)]
    select = group["select"]
    chosen = layer_indices(LayerRange(**select) if isinstance(select, dict) else select, n_layers, ())[0]
    if kind.in_attention and len(chosen) < n_layers and draw(st.booleans()):
        off = next(k for k, cls in family("positional").members.items() if cls.inert)
        group["attention"] = {**group["attention"], "positional": {"kind": off}}
    return group


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
        "log_to": st.lists(st.sampled_from(get_args(LogSink)), unique=True),
        "fp8_scaling": None,  # drawn below: only with precision fp8
        "optimizer": None,  # drawn below: muon is not built under fsdp (nor µP: spec_dicts drops it there)
    }
    out = dict(draw(fields_of(TrainSpec, overrides)))
    if draw(st.booleans()):
        fsdp = out.get("parallel", {}).get("kind") == "fsdp"
        out["optimizer"] = draw(st.just({"kind": "adamw"}) if fsdp else st.one_of(
            st.sampled_from([{}, {"kind": "adamw"}]),
            fields_of(MuonOptimizer).map(lambda d: {"kind": "muon", **d})))
    if out.get("precision") == "fp8" and draw(st.booleans()):
        out["fp8_scaling"] = draw(field_values(fields["fp8_scaling"]))
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
        if model.get("parametrization") == "mup" and out["train"].get("optimizer", {}).get("kind") == "muon":
            out["train"]["optimizer"] = {"kind": "adamw"}  # muon with µP is refused (archspec.spec.rules)
    return out


def valid_specs(**kwargs: Any) -> Strategy:
    """Validated `Spec` objects: `spec_dicts(**kwargs).map(parse_spec)`."""
    return spec_dicts(**kwargs).map(parse_spec)


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

