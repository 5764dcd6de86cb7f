"""Per-layer variation: model-wide block components plus named layer groups that override them.

    model:
      n_layers: 8
      ffn: {kind: glu, hidden_dim: 1376}          # every layer, unless a group says otherwise
      layers:
        wide:                                     # a name: --set model.layers.wide.ffn.hidden_dim=2752
          select: {start: 1, step: 2}             # layers 1, 3, 5, 7 (a Python range; stop defaults to n_layers)
          ffn: {hidden_dim: 2752}                 # merged onto the model-wide ffn: only hidden_dim changes
        first:
          select: [0]                             # or an explicit list
          attention: {sparsity: {kind: dense}}
        post:
          select: [0]
          block: {norm_placement: post}           # the block's shape (BlockShape) is a component too

Rules (docs/guides/per-layer.md):
- A group's `norm`, `attention` or `ffn` is merged onto the model-wide component the way `--set` is: fields refine it;
  a different `kind` starts from that kind's defaults. Positional settings are model-wide (position tables and
  rotary angles are shared by every layer): a group may only switch positions off for its layers
  (`attention: {positional: {kind: none}}`, SmolLM3's NoPE layers) where the model's kind acts inside each layer's
  attention (rope, alibi: `PositionalKind.in_attention`), and not in every layer (then the model has none).
- Groups may overlap. Where they do, they may not disagree: two groups that set the same field of the same layer
  to different values are an error at both paths. Group order never matters (YAML order is not part of a hash).
- The canonical form (and so the hash) is a function of the resolved per-layer model alone: group names and how
  selections were written are labels. A uniform setting written once or repeated per layer hashes alike.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from typing import Annotated, Literal, Union

from pydantic import BaseModel, Discriminator, Field, StrictInt, Tag, TypeAdapter, ValidationError

from archspec.kinds import family, registry_version
from archspec.kinds.base import Problem, Since, Strict, identity_dump

COMPONENTS = ("norm", "attention", "ffn", "block", "mixer")  # the block components a group may set
GROUP_NAME = r"^[a-z0-9][a-z0-9_-]{0,31}$"

NormPlacement = Literal["pre", "post", "sandwich", "output"]


class BlockShape(Strict):
    """How a block wires its norms and sublayers around the residual stream (`model.block`, or a layer group's).

    norm_placement: `pre` x + f(norm(x)) (GPT-2, Llama) · `post` norm(x + f(x)) (GPT-1, the original Transformer) ·
    `sandwich` x + norm2(f(norm1(x))) (Gemma 2/3, GLM-4) · `output` x + norm(f(x)), no input norm (OLMo 2).
    parallel: attention and FFN read the same x and add to it together, x + attn(n1(x)) + ffn(n2(x)) (GPT-NeoX's
    use_parallel_residual, GPT-J, Falcon, PaLM); shared_norm: one input norm feeds both (GPT-J, Phi, Falcon-7B)."""

    norm_placement: Annotated[NormPlacement, Since("0.4")] = "pre"
    parallel: Annotated[bool, Since("0.4")] = False
    shared_norm: Annotated[bool, Since("0.4")] = False

    def fill_defaults(self, m: Any) -> None:
        return None

    def problems(self, m: Any, path: tuple) -> list[Problem]:
        out: list[Problem] = []
        if self.shared_norm and not self.parallel:
            out.append((path + ("shared_norm",), "only a parallel block shares its input norm: set parallel: true, "
                        "or leave shared_norm out", self.shared_norm))
        if self.parallel and self.norm_placement not in ("pre", "sandwich"):
            # post and output put no norm in front of the sublayers, so the two branches would read the raw stream
            # and a parallel block's one normed input (what NeoX, GPT-J, PaLM share) would not exist.
            out.append((path + ("norm_placement",), "a parallel block normalises the input its two branches share: "
                        f"must be pre or sandwich, got {self.norm_placement}", self.norm_placement))
        return out

    # ── what the block holds ──
    @property
    def input_norms(self) -> tuple[str, ...]:
        """The block's norms in front of (pre, sandwich) or, post-norm, after the residual add of its sublayers, in a
        block whose token mixer is attention; `norms_of` names them for another mixer."""
        return self.norms_of(family("attention").base.attribute)[0]

    @property
    def output_norms(self) -> tuple[str, ...]:
        """The norms on a sublayer's output before it joins the residual stream (sandwich, output)."""
        return self.norms_of(family("attention").base.attribute)[1]

    def norms_of(self, mixer: str, ffn: bool = True) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(input norms, output norms) of a block whose token mixer is its attribute `mixer`
        (archspec.kinds.base.MixerKind.attribute): each mixer's norms are named after it, so a layer whose mixer is not
        attention holds nothing called attention. `ffn` false: the block has no channel mixer, nor its norms."""
        inputs = () if self.norm_placement == "output" else (
            ("norm",) if self.parallel and self.shared_norm else (f"{mixer}_norm", "ffn_norm"))
        outputs = (f"{mixer}_post_norm", "ffn_post_norm") if self.norm_placement in ("sandwich", "output") else ()
        if not ffn:
            inputs, outputs = (tuple(n for n in names if not n.startswith("ffn_")) for names in (inputs, outputs))
        return inputs, outputs

    def tensor_parallel(self, m: Any) -> "TPPlan":
        """Any wiring splits alike: attention and the FFN take this rank's sequence shard and hand one back, so the
        residual adds stay local; the norms (input_norms, output_norms) take their kind's plan
        (archspec.spec.parallel_plan)."""
        from archspec.kinds.base import TPPlan

        return TPPlan()

    @property
    def n_norms(self) -> int:
        return len(self.input_norms) + len(self.output_norms)

    def label(self) -> str:
        """The block class's name part (`PostNormBlock`, `ParallelBlock`); "" for the pre-norm sequential block."""
        if self.parallel:
            return {"pre": "", "sandwich": "Sandwich"}[self.norm_placement] + (
                "SharedNorm" if self.shared_norm else "") + "Parallel"
        return {"pre": "", "post": "PostNorm", "sandwich": "SandwichNorm", "output": "OutputNorm"}[self.norm_placement]

    def describe(self) -> str:
        if self.parallel:
            return ("parallel" + (" shared-norm" if self.shared_norm else "")
                    + (" sandwich-norm" if self.norm_placement == "sandwich" else "") + " blocks")
        return f"{self.norm_placement}-norm blocks"


class LayerRange(Strict):
    """Layers start, start + step, ... below stop (Python's range; stop defaults to n_layers)."""

    start: int = Field(0, ge=0)
    stop: int | None = Field(None, ge=1)
    step: int = Field(1, ge=1)


def _selection_form(value: Any) -> str | None:
    if isinstance(value, list):
        return "list"
    return "range" if isinstance(value, (dict, LayerRange)) else None


# A list or a range, told apart by shape, so an error names the form the user wrote (the tag is dropped from paths).
SELECTION_TAGS = ("list", "range")
Selection = Annotated[
    Union[Annotated[list[StrictInt], Tag("list")], Annotated[LayerRange, Tag("range")]],
    Discriminator(_selection_form, custom_error_type="selection",
                  custom_error_message="expected a list of layer indices or {start, stop, step}"),
]


class LayerGroup(Strict):
    select: Selection = Field(description="an explicit list of layer indices, or {start, stop, step}")
    norm: dict[str, Any] | None = Field(None, description="fields merged onto model.norm for these layers")
    attention: dict[str, Any] | None = Field(None, description="fields merged onto model.attention (positional: only "
                                             "{kind: none}, positions off for these layers)")
    ffn: dict[str, Any] | None = Field(None, description="fields merged onto model.ffn for these layers")
    block: Annotated[dict[str, Any] | None, Since("0.4")] = Field(
        None, description="fields merged onto model.block (norm placement, parallel) for these layers")
    mixer: Annotated[dict[str, Any] | None, Since("0.5")] = Field(
        None, description="these layers' token mixer when it is not attention ({kind: short_conv, ...}), merged onto "
                          "model.mixer")


@dataclass(frozen=True)
class BlockSpec:
    """The resolved components of one layer."""

    norm: Any
    attention: Any  # the layer's attention kind (archspec.kinds.attention)
    ffn: Any
    block: Any = None  # the layer's BlockShape
    mixer: Any = None  # the layer's token mixer when it is not attention (archspec.kinds.mixer); None: attention

    @property
    def token_mixer(self) -> Any:
        """What mixes tokens in this layer (archspec.kinds.base.MixerKind): its mixer, else its attention."""
        return self.attention if self.mixer is None else self.mixer

    def key(self) -> str:
        return json.dumps([unit_json(getattr(self, c)) for c in COMPONENTS], sort_keys=True)

    def norms(self) -> tuple[str, ...]:
        """The block's norm modules by attribute name: its shape's, for its token mixer, without the FFN's when it has
        no channel mixer (BlockShape.norms_of)."""
        inputs, outputs = self.block.norms_of(type(self.token_mixer).attribute, type(self.ffn).sublayer)
        return inputs + outputs

    @property
    def n_norms(self) -> int:
        return len(self.norms())


def unit_json(unit: BaseModel | None) -> str:
    if unit is None:
        return "null"
    return json.dumps(unit.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


# ── selections ───────────────────────────────────────────────────────────────────────────────────────────────────


def layer_indices(select: list[int] | LayerRange, n_layers: int, path: tuple) -> tuple[list[int], list[Problem]]:
    problems: list[Problem] = []
    if isinstance(select, LayerRange):
        stop = n_layers if select.stop is None else select.stop
        if select.start >= n_layers:
            problems.append((path + ("start",), f"must be below n_layers ({n_layers}), got {select.start}",
                             select.start))
        if stop > n_layers:
            problems.append((path + ("stop",), f"must be at most n_layers ({n_layers}), got {stop}", stop))
        indices = list(range(select.start, min(stop, n_layers), select.step))
        if not problems and not indices:
            problems.append((path, f"selects no layer (start {select.start}, stop {stop})", select.start))
        return indices, problems
    if not select:
        return [], [(path, "selects no layer: give at least one index", select)]
    for j, i in enumerate(select):
        if not 0 <= i < n_layers:
            problems.append((path + (j,), f"layer index must be in 0..{n_layers - 1}, got {i}", i))
    dupes = sorted(i for i, c in Counter(select).items() if c > 1)
    if dupes:
        problems.append((path, f"lists layers more than once: {dupes}", dupes))
    return sorted({i for i in select if 0 <= i < n_layers}), problems


def canonical_select(indices: list[int]) -> list[int] | dict[str, int]:
    """One spelling per set of layers: a range when they are evenly spaced (3 or more), else the list."""
    if len(indices) >= 3:
        step = indices[1] - indices[0]
        if all(b - a == step for a, b in zip(indices, indices[1:])):
            return {"start": indices[0], "stop": indices[-1] + 1, "step": step}
    return list(indices)


# ── merging ──────────────────────────────────────────────────────────────────────────────────────────────────────


def user_dict(obj: Any) -> Any:
    """What the user set on a validated spec object (derived defaults left out), with `kind` always written, so a
    group's fields merge onto what was written, not onto values derived from it."""
    if isinstance(obj, BaseModel):
        out = {k: user_dict(getattr(obj, k)) for k in obj.model_fields_set}
        if "kind" in type(obj).model_fields:
            out["kind"] = obj.kind
        return out
    if isinstance(obj, list):
        return [user_dict(v) for v in obj]
    return obj


def leaves(data: dict, prefix: tuple = ()) -> dict[tuple, Any]:
    out: dict[tuple, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out.update(leaves(v, prefix + (k,)))
        else:
            out[prefix + (k,)] = v
    return out


def merge(base: dict, override: dict) -> dict:
    """`override` onto `base`: nested fields refine; a node whose `kind` changes starts from the override alone."""
    if "kind" in override and base.get("kind", override["kind"]) != override["kind"]:
        return dict(override)
    out = dict(base)
    for k, v in override.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _unflatten(flat: dict[tuple, Any]) -> dict:
    out: dict = {}
    for path, v in flat.items():
        node = out
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = v
    return out


def _str_keys(value: Any) -> Any:
    """For a cache key only: a hostile mapping may mix int and str keys, which json cannot sort."""
    if isinstance(value, dict):
        return {repr(k): _str_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_str_keys(v) for v in value]
    return value


@lru_cache(maxsize=8)
def _adapter(family_name: str, version: int) -> TypeAdapter:
    return TypeAdapter(family(family_name).union())


def _validate(component: str, data: dict) -> Any:
    if component == "block":  # a plain class, not a family of kinds
        return BlockShape.model_validate(data)
    return _adapter(component, registry_version()).validate_python(data)


def _error_path(component: str, loc: tuple) -> tuple:
    """Pydantic puts a union's tag into an error's location (`ffn.mlp.activation`, `ffn.moe.expert.glu.x`): drop
    each, at any depth (the spec's one walker)."""
    from archspec.spec import untagged  # a cycle at import time

    if component == "block":  # a plain class, not a family of kinds
        return untagged(loc, model=BlockShape)
    return untagged(loc, members=family(component).members)


# ── resolution ───────────────────────────────────────────────────────────────────────────────────────────────────


def resolve(m: Any, written: dict[str, Any] | None = None) -> tuple[list[BlockSpec], list[Problem]]:
    """Every layer's components, and the problems of the groups (each at its own path). `written`: what the user set
    on each model-wide component, taken before derived defaults were filled in (a group's fields merge onto that)."""
    base = {c: getattr(m, c) for c in COMPONENTS}
    uniform = BlockSpec(**base)
    if not m.layers:
        return [uniform] * m.n_layers, []
    problems: list[Problem] = []
    selected: dict[str, list[int]] = {}
    for name in sorted(m.layers):
        group = m.layers[name]
        path = ("model", "layers", name)
        selected[name], errs = layer_indices(group.select, m.n_layers, path + ("select",))
        problems += errs
        if group.attention is not None and "positional" in group.attention:
            problems += _layer_positional_problems(m, path + ("attention", "positional"), group.attention["positional"])
        empty = [c for c in COMPONENTS if c in group.model_fields_set and not getattr(group, c)]
        for c in empty:  # `ffn:` with nothing under it (null or {}): blamed where it is written
            problems.append((path + (c,), f"is empty: give {c} fields for the selected layers, or leave {c} out",
                             getattr(group, c)))
        if not empty and not any(getattr(group, c) for c in COMPONENTS):
            problems.append((path, "sets nothing: give norm, attention, ffn, block or mixer fields for the "
                             "selected layers", name))

    per_layer: dict[str, list[Any]] = {c: [base[c]] * m.n_layers for c in COMPONENTS}
    cache: dict[tuple[str, str], Any] = {}
    by_value: dict[tuple[str, str], Any] = {(c, unit_json(base[c])): base[c] for c in COMPONENTS}  # equal → shared
    reported: set = set()
    for c in COMPONENTS:
        base_user = written[c] if written is not None else user_dict(base[c])
        if base_user is None:  # no model-wide mixer (attention mixes tokens): a group's mixer starts from its kind
            base_user = {}
        for i in range(m.n_layers):
            setters = [n for n in sorted(m.layers) if i in selected[n] and getattr(m.layers[n], c)]
            if not setters:
                continue
            flat: dict[tuple, tuple[Any, str]] = {}
            for name in setters:
                for key, value in leaves(getattr(m.layers[name], c)).items():
                    if key in flat and flat[key][0] != value:
                        other = flat[key][1]
                        if (other, name, key) not in reported:
                            reported.add((other, name, key))
                            dotted = ".".join(map(str, key))
                            for who, val, peer in ((other, flat[key][0], name), (name, value, other)):
                                problems.append((("model", "layers", who, c) + key,
                                                 f"layer {i} is also selected by group {peer!r}, which sets {c}."
                                                 f"{dotted} to {json.dumps(flat[key][0] if who == name else value)}; "
                                                 "overlapping groups may not disagree", val))
                        continue
                    flat[key] = (value, name)
            positional = {}
            # `positional: 7` (not a mapping) stays in the unit, so validation refuses it as model-wide (it was dropped)
            odd_positional = c == "attention" and not isinstance(flat.get(("positional",), ({},))[0], dict)
            if c == "attention" and not odd_positional:  # a group's positional replaces the model's for its layers
                positional = {k[1:]: v for k, (v, _) in flat.items() if k[0] == "positional" and k[1:]}
                flat = {k: v for k, v in flat.items() if k[0] != "positional"}
            merged = merge(base_user, _unflatten({k: v for k, (v, _) in flat.items()}))
            if c == "attention" and not odd_positional and ("positional" in base_user or positional):
                merged["positional"] = merge(base_user.get("positional", {}), _unflatten(positional))
            ck = (c, json.dumps(_str_keys(merged), sort_keys=True, default=repr))
            if ck not in cache:
                try:
                    unit = _validate(c, merged)
                    if c == "attention":
                        unit.fill_defaults(m.d_model)
                        for sub in (unit.positional, unit.sparsity):
                            sub.fill_defaults(m)
                    else:
                        unit.fill_defaults(m)
                    cache[ck] = by_value.setdefault((c, unit_json(unit)), unit)
                except ValidationError as err:
                    from archspec.spec import validation_message  # the spec's own wording (a cycle at import time)

                    cache[ck] = None
                    for e in err.errors():
                        loc = _error_path(c, tuple(e["loc"]))
                        owner = next((n for n in setters if loc[:1] and loc[0] in getattr(m.layers[n], c)), setters[0])
                        problems.append((("model", "layers", owner, c) + loc,
                                         validation_message(e, ("model", c) + tuple(e["loc"])), e.get("input")))
            if cache[ck] is not None:
                per_layer[c][i] = cache[ck]
    problems += _mixer_problems(m, selected, per_layer)
    wide_positional = unit_json(m.attention.positional)
    attending = [a for a, mixer in zip(per_layer["attention"], per_layer["mixer"]) if mixer is None]
    if not problems and attending and all(unit_json(a.positional) != wide_positional for a in attending):
        name = next(n for n in sorted(m.layers) if "positional" in (m.layers[n].attention or {}))
        problems.append((("model", "layers", name, "attention", "positional"), "switches positions off in every "
                         "layer: write model.attention.positional instead", m.layers[name].attention["positional"]))
    if problems:
        return [uniform] * m.n_layers, problems
    # One object per distinct configuration, so equal layers share their specs.
    distinct: dict[str, BlockSpec] = {}
    blocks = []
    for i in range(m.n_layers):
        b = BlockSpec(**{c: per_layer[c][i] for c in COMPONENTS})
        blocks.append(distinct.setdefault(b.key(), b))
    return blocks, []


def _mixer_problems(m: Any, selected: dict[str, list[int]], per_layer: dict[str, list[Any]]) -> list[Problem]:
    """A layer whose token mixer is not attention has no attention to configure; and a model none of whose layers
    mixes tokens by attention says so once, model-wide (`model.mixer`), so it has no positions to render."""
    out: list[Problem] = []
    mixed = {i for i, mixer in enumerate(per_layer["mixer"]) if mixer is not None}
    for name in sorted(m.layers):
        group = m.layers[name]
        clash = sorted(set(selected[name]) & mixed)
        if group.attention and clash:
            kinds = sorted({per_layer["mixer"][i].kind for i in clash})
            out.append((("model", "layers", name, "attention"), f"layers {clash} mix tokens by {', '.join(kinds)}, "
                        "not attention: they have no attention to configure", group.attention))
    if m.mixer is None and len(mixed) == m.n_layers:
        name = next(n for n in sorted(m.layers) if m.layers[n].mixer)
        out.append((("model", "layers", name, "mixer"), "gives every layer a mixer other than attention: write "
                    "model.mixer instead (the model then has no attention and no positions)", m.layers[name].mixer))
    return out


def _layer_positional_problems(m: Any, path: tuple, value: Any) -> list[Problem]:
    """A group's `attention.positional`: the model's own (nothing changes), or positions off (an `inert` kind, e.g.
    none) under a kind that acts inside each layer's attention; anything else would need tables of its own."""
    wide = m.attention.positional
    try:
        unit = _validate("positional", merge(user_dict(wide), value) if isinstance(value, dict) else value)
    except ValidationError:
        return []  # reported where the layer's merged attention is validated, at this path
    if unit_json(unit) == unit_json(wide) or (type(unit).inert and type(wide).in_attention):
        return []
    off = [k for k, cls in family("positional").members.items() if cls.inert]
    inside = [k for k, cls in family("positional").members.items() if cls.in_attention]
    if not type(unit).inert:
        why = (f"a layer group may only switch positions off ({{kind: {' | '.join(off)}}}): position tables and "
               "rotary angles are the model's, shared by every layer; set model.attention.positional")
    else:
        why = (f"positions cannot be switched off per layer under {wide.kind}: it acts on the embeddings, not inside "
               f"each layer's attention (only {', '.join(inside)} can be)")
    return [(path, why, value)]


def _keep_overrides(full: Any, dropped: Any, wide: Any) -> Any:
    """A group's identity dump (`dropped`: fields added later left out at their defaults) with those fields put back
    where the model-wide component has them: a group is laid over the model-wide component, so a field it leaves
    out would take the model-wide value."""
    if not (isinstance(full, dict) and isinstance(dropped, dict) and isinstance(wide, dict)):
        return dropped
    out = {}
    for key, value in full.items():
        if key in dropped:
            out[key] = _keep_overrides(value, dropped[key], wide.get(key))
        elif key in wide:
            out[key] = value
    return out


def canonical_layers(m: Any, blocks: list[BlockSpec]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model-wide components, groups) in canonical form: per component, the configuration most layers use is
    model-wide (ties: the earliest), and each other configuration is one group named `<component>_<n>` selecting
    exactly its layers."""
    wide: dict[str, Any] = {}
    groups: dict[str, Any] = {}
    attending = [b for b in blocks if b.mixer is None]  # the layers whose token mixer is their attention
    for c in COMPONENTS:
        if c == "mixer":
            _canonical_mixers(blocks, wide, groups)
            continue
        if c == "attention" and not attending:
            continue  # no layer has attention: none of it is part of the model
        values = [getattr(b, c) for b in blocks]
        keys = [unit_json(v) for v in values]
        if c == "attention":  # only the layers that attend: another mixer's layer has no attention
            keys = [k if b.mixer is None else None for k, b in zip(keys, blocks)]
        counts = Counter(k for k in keys if k is not None)
        top = max(counts.values())
        if c == "attention":  # the model-wide attention has the model's positions (layers may switch them off)
            wide_positional = unit_json(m.attention.positional)
            own = {k for k, v in zip(keys, values) if unit_json(v.positional) == wide_positional}
            top = max(counts[k] for k in own)
            counts = Counter({k: n for k, n in counts.items() if k in own})
        # The model-wide norm is also the final norm, so it stays model-wide whatever the layers use.
        base_key = unit_json(m.norm) if c == "norm" else next(k for k in keys if counts[k] == top)
        # identity_dump: a field added later (Since) at its default leaves a layer group's hash as it was too
        wide[c] = identity_dump(m.norm if c == "norm" else values[keys.index(base_key)])
        order = [k for k in dict.fromkeys(keys) if k != base_key and k is not None]
        for n, k in enumerate(order, 1):
            unit = values[keys.index(k)]
            dump = _keep_overrides(unit.model_dump(mode="json"), identity_dump(unit), wide[c])
            if c == "attention" and unit_json(unit.positional) == unit_json(m.attention.positional):
                dump.pop("positional", None)
            groups[f"{c}_{n}"] = {"select": canonical_select([i for i, kk in enumerate(keys) if kk == k]), c: dump}
    if not wide["block"]:  # the pre-norm sequential block (a Since field at its default): not written, as before
        del wide["block"]
    return wide, groups


def _canonical_mixers(blocks: list[BlockSpec], wide: dict[str, Any], groups: dict[str, Any]) -> None:
    """The token mixers in canonical form: when some layer attends, attention is model-wide (no `mixer`) and each
    other mixer configuration is a group `mixer_<n>`; when none does, the commonest mixer is `model.mixer`."""
    keys = [unit_json(b.mixer) for b in blocks]
    counts = Counter(keys)
    base_key = "null" if "null" in counts else next(k for k in keys if counts[k] == max(counts.values()))
    if base_key != "null":
        wide["mixer"] = identity_dump(blocks[keys.index(base_key)].mixer)
    for n, k in enumerate((k for k in dict.fromkeys(keys) if k != base_key), 1):
        groups[f"mixer_{n}"] = {"select": canonical_select([i for i, kk in enumerate(keys) if kk == k]),
                                "mixer": identity_dump(blocks[keys.index(k)].mixer)}
