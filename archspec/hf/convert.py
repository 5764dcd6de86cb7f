"""The model-level assembly of HF interop: a transformers config ↔ a spec, and state dicts both ways.

Each unit (archspec/kinds) maps its own fields and weights (`from_hf`, `to_hf`, `hf_weights`); this module knows
only what belongs to the model as a whole: which unit a model type's building block is, the top-level sizes,
dropout, embeddings, final norm, LM head and the layer prefixes. Nothing here names a kind.
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from collections import Counter
from typing import Any

import torch

from archspec.errors import Caution, printable
from archspec.hf.types import COMMON_INERT, EXPORT_ORDER, PENDING, TYPES, VARIANTS
from archspec.kinds import family
from archspec.kinds.hf import HFConfig, HFType, HFUnsupported, HFWeight, put_fact
from archspec.spec import Spec
from archspec.spec.model import ModelSpec

# HF tensors that are buffers, not weights: GPT-2's causal mask in old checkpoints, the rotary inverse
# frequencies some LLaMA checkpoints saved. Derived from the config; skipped on import.
_INERT_TENSORS = re.compile(r"(\.attn\.(masked_)?bias|\.rotary_emb\.inv_freq)$")

# Keys of released configs that only training reads (an auxiliary loss's weight and form in DeepSeek's original code;
# transformers' models read none of them): ignored on import with one note, never refused. Dropout rates are
# training-only too; they are mapped (model.dropout), see `_dropout`.
TRAINING_ONLY = frozenset({"aux_loss_alpha", "seq_aux"})

# The families a block is made of, in the order their `to_hf` run (the attention's q/k norm reads the norm's eps).
_FAMILIES = (("norm", ("model", "norm")), ("positional", ("model", "attention", "positional")),
             ("sparsity", ("model", "attention", "sparsity")), ("ffn", ("model", "ffn")))
# The block component (archspec.spec.layers.COMPONENTS) that holds each family; positional is model-wide.
_COMPONENT = {"norm": "norm", "positional": "attention", "sparsity": "attention", "ffn": "ffn"}


def hf_type(model_type: Any, source: str, data: Any = None) -> HFType:
    """The type that reads a config of `model_type` (`data`, the config, picks among a type's variants)."""
    if model_type in TYPES:
        pick = VARIANTS.get(model_type)
        return pick(data) if pick is not None and isinstance(data, dict) else TYPES[model_type]
    if model_type in PENDING:
        raise HFUnsupported(f"{source}: model_type: {model_type!r} needs {PENDING[model_type]}, which archspec "
                            f"does not have yet")
    raise HFUnsupported(f"{source}: model_type: {printable(repr(model_type), 80)} is not one archspec maps "
                        f"(it maps {', '.join(TYPES)})")


def _unit_class(fam: str, block: str, cfg: HFConfig):
    for cls in family(fam).members.values():
        if cls.hf_block == block:
            return cls
    fields = [k for k in getattr(cfg.hf.pick.get(fam), "fields", ()) if cfg.data.get(k) is not None]
    said = "; ".join(f"{k}: {printable(repr(cfg.data[k]), 60)}" for k in fields)
    raise HFUnsupported(f"{cfg.source}: {said + ' → ' if said else ''}{cfg.hf.model_type} uses HF's {block!r}, "
                        f"which no archspec {fam} kind provides yet")


# ── config → spec ────────────────────────────────────────────────────────────────────────────────────────────────


def spec_from_config(data: Any, source: str, name: str) -> dict[str, Any]:
    """A spec dict (name and model) from a transformers config dict. Every key is read by a unit or the assembly,
    or known not to change the computed function; anything else is refused by name (HFUnsupported)."""
    if not isinstance(data, dict):
        raise HFUnsupported(f"{source}: expected a JSON object, got {type(data).__name__}")
    hf = hf_type(data.get("model_type"), source, data)
    cfg = HFConfig(data, hf, source)
    if hf.rewrite is not None and hf.rewrite[0] is not None:  # the type's own spellings in the words units read
        hf.rewrite[0](cfg)
    for check in hf.check:
        check(cfg)
    per_layer: dict[str, list[dict[str, Any]]] = {}
    n_layers = cfg.take("n_layers", int)
    # A type without attention (mamba2: no positional or pattern block) has no attention, positions or pattern to read
    attends = all(f in hf.blocks for f, _ in _FAMILIES)
    for fam, _ in _FAMILIES if attends else tuple((f, p) for f, p in _FAMILIES if _COMPONENT[f] != "attention"):
        words = hf.pick[fam](cfg) if fam in hf.pick else hf.blocks[fam]
        words = [words] * n_layers if isinstance(words, str) else list(words)
        by_word = {w: _unit_class(fam, w, cfg).from_hf(cfg) for w in dict.fromkeys(words)}
        per_layer[fam] = [by_word[w] for w in words]
    units, groups = _model_wide_and_groups(per_layer)
    attention = None
    if attends:
        attention = _unit_class("attention", _attention_block(hf), cfg).from_hf(cfg)
        attention.update(positional=units["positional"], sparsity=units["sparsity"])
    mixer, mixer_groups = _mixers_from_hf(cfg, n_layers)
    model = {
        "vocab_size": cfg.take("vocab_size", int), "context_length": cfg.take("context_length", int),
        "d_model": cfg.take("d_model", int), "n_layers": cfg.take("n_layers", int),
        "norm": units["norm"], "attention": attention, "ffn": units["ffn"],
        "tie_embeddings": cfg.take("tie", bool), "dropout": _dropout(cfg),
    }
    if mixer is not None:  # no layer attends: the model has no attention
        model["mixer"] = mixer
        del model["attention"]
        groups = {k: v for k, v in groups.items() if not k.startswith("attention")}
    groups.update(mixer_groups)
    model.update(_model_options(cfg))
    model.update(_mtp_from_hf(cfg))
    if hf.media is not None:  # a type with media beside the text (idefics): its own mapping says model.media
        hf.media.from_hf(cfg, model)
    if cfg.fact("embedding_norm"):  # BLOOM's word_embeddings_layernorm
        model["embedding_norm"] = True
    if groups:
        model["layers"] = groups
    unread = sorted(set(data) - cfg.taken - COMMON_INERT - hf.inert)
    training = [k for k in unread if k in TRAINING_ONLY]
    if training:  # released configs carry them; the function the model computes does not depend on them
        warnings.warn(Caution(f"{source}: {', '.join(training)}: training-only settings ({hf.model_type}), which do "
                              "not change what the model computes: not imported"))
        unread = [k for k in unread if k not in TRAINING_ONLY]
    if unread:
        shown = ", ".join(f"{printable(k, 60)}: {printable(repr(data[k]), 60)}" for k in unread[:5])
        raise HFUnsupported(
            f"{source}: {len(unread)} field{'s' * (len(unread) > 1)} archspec does not map ({shown}"
            f"{', ...' if len(unread) > 5 else ''}); a {hf.model_type} model with them may compute something else, "
            "so nothing was imported")
    return {"name": name, "model": model}


def _mixers_from_hf(cfg: HFConfig, n_layers: int) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Each layer's token mixer, for a type whose layers may mix tokens by something other than attention (its
    `pick["mixer"]`: one HF word per layer, the type's attention block or another mixer kind's `hf_block`): the
    model-wide mixer when no layer attends, and the layer groups of the others."""
    if "mixer" not in cfg.hf.pick:
        return None, {}
    words = cfg.hf.pick["mixer"](cfg)
    attends = _attention_block(cfg.hf)
    by_word = {w: _unit_class("mixer", w, cfg).from_hf(cfg) for w in dict.fromkeys(words) if w != attends}
    if attends not in words:  # one word per mixer kind, and a type has one configuration of each: one mixer
        if len(by_word) > 1:
            raise cfg.refuse("layer_types", "several mixer kinds and no attention layer: not mapped yet")
        return next(iter(by_word.values())), {}
    groups: dict[str, Any] = {}
    for n, (word, unit) in enumerate(by_word.items(), 1):
        groups[f"mixer_{n}"] = {"select": [i for i, w in enumerate(words) if w == word], "mixer": unit}
    return None, groups


def _mtp_from_hf(cfg: HFConfig) -> dict[str, Any]:
    """model.mtp from the type's count of multi-token prediction layers (DeepSeek-V3's num_nextn_predict_layers); its
    loss weight is training's, which no config holds: archspec's default, said."""
    if cfg.hf.mtp_layers is None:
        return {}
    depth = cfg.take(cfg.hf.mtp_layers, int, default=0)
    if depth < 0:
        raise cfg.refuse(cfg.hf.mtp_layers, f"{depth}: a count of layers is at least 0")
    if not depth:
        return {}
    from archspec.spec.model import MTPSpec

    warnings.warn(Caution(f"{cfg.source}: {cfg.hf.mtp_layers}: {depth} → model.mtp.depth {depth}; its loss weight is "
                          f"a training setting no config holds: model.mtp.weight {MTPSpec().weight} (archspec's "
                          "default)"))
    return {"mtp": {"depth": depth}}


def _model_options(cfg: HFConfig) -> dict[str, Any]:
    """The model's own options the type fixes or its config says: the block's shape, an LM-head bias, the embedding
    scale. Written only where they differ from the defaults, so a LLaMA file gives the spec it always gave."""
    hf, out = cfg.hf, {}
    parallel = cfg.fact("parallel")
    block = {"norm_placement": hf.norm_placement} if hf.norm_placement != "pre" else {}
    if parallel:
        block.update(parallel=True, shared_norm=cfg.fact("shared_norm"))
    if block:
        out["block"] = block
    if cfg.fact("lm_head_bias"):
        out["lm_head_bias"] = True
    if cfg.fact("embedding_scale"):
        out["embedding_scale"] = "sqrt_d_model"
    if "logit_softcap" in hf.keys:  # a type that caps its logits says by how much (null: not at all)
        cap = cfg.take("logit_softcap", (int, float), default=None)
        if cap is not None:
            out["logit_softcap"] = float(cap)
    return out


def _shape_to_hf(m: ModelSpec, hf: HFType, out: dict[str, Any]) -> None:
    """The model's own options into `out`, or refused by field where `hf` cannot say them."""
    shapes = [b.block for b in m.blocks()]
    for i, shape in enumerate(shapes):
        if shape != shapes[0]:
            raise HFUnsupported(f"{_named(m, ('model', 'block'), i)}: a block shape that differs by layer: every "
                                "transformers model type archspec writes has one for every layer")
    shape = shapes[0]
    if shape.norm_placement != hf.norm_placement:
        raise HFUnsupported(f"model.block.norm_placement: {shape.norm_placement} cannot be expressed as "
                            f"{hf.model_type} (its blocks are {hf.norm_placement}-norm)")
    put_fact(out, hf, "parallel", shape.parallel, ("model", "block", "parallel"))
    if shape.parallel:
        put_fact(out, hf, "shared_norm", shape.shared_norm, ("model", "block", "shared_norm"))
    if not m.final_norm:
        raise HFUnsupported("model.final_norm: false cannot be expressed as any transformers model type archspec "
                            f"writes ({hf.model_type} has a final norm)")
    if m.logit_softcap is not None and "logit_softcap" not in hf.keys:
        raise HFUnsupported(f"model.logit_softcap: {m.logit_softcap} cannot be expressed as {hf.model_type} (it does "
                            "not cap its logits)")
    if "logit_softcap" in hf.keys:  # null written too: the type's default may be a cap (gemma2's 30)
        out[hf.keys["logit_softcap"]] = m.logit_softcap
    put_fact(out, hf, "lm_head_bias", m.lm_head_bias, ("model", "lm_head_bias"))
    put_fact(out, hf, "embedding_scale", m.embedding_scale == "sqrt_d_model", ("model", "embedding_scale"))


def _model_wide_and_groups(per_layer: dict[str, list[dict[str, Any]]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each family's unit most layers use is model-wide (ties: the earliest); the layers of each other unit are a
    layer group (archspec.spec.layers) setting it."""
    wide: dict[str, Any] = {}
    groups: dict[str, Any] = {}
    for fam, units in per_layer.items():
        keys = [json.dumps(u, sort_keys=True) for u in units]
        counts = Counter(keys)
        base = next(k for k in keys if counts[k] == max(counts.values()))
        wide[fam] = units[keys.index(base)]
        component = _COMPONENT[fam]
        for n, key in enumerate((k for k in dict.fromkeys(keys) if k != base), 1):
            unit = units[keys.index(key)]
            groups[f"{component}_{n}" if component == fam else f"{component}_{fam}_{n}"] = {
                "select": [i for i, k in enumerate(keys) if k == key],
                component: {fam: unit} if component != fam else unit}
    return wide, groups


def _dropout(cfg: HFConfig) -> float:
    """model.dropout from the config's rates. Dropout acts only in training (the imported model computes the same
    logits whatever the rate), so rates that differ (phi-2's resid_pdrop 0.1 beside embd_pdrop 0.0) are not refused:
    the largest is taken, with a note."""
    rates = {k: cfg.take(k, (int, float), default=cfg.hf.defaults.get(k, 0.0)) for k in cfg.hf.dropout_keys}
    for k, v in rates.items():
        if not 0.0 <= v < 1.0:
            raise cfg.refuse(k, f"{v}: a dropout rate is in [0, 1)")
    values = set(rates.values())
    if len(values) > 1:
        chosen = max(values)
        warnings.warn(Caution(f"{cfg.source}: dropout rates differ ({', '.join(f'{k}={v}' for k, v in rates.items())}); "
                              f"archspec has one, model.dropout = {chosen} (dropout acts only in training: the logits "
                              "are the same)"))
        return float(chosen)
    return float(values.pop()) if values else 0.0


# ── spec → config ────────────────────────────────────────────────────────────────────────────────────────────────


def config_from_spec(spec: Spec) -> tuple[HFType, dict[str, Any]]:
    """The first transformers type (EXPORT_ORDER) that expresses `spec`, and its config dict. Refuses by field name
    (the layer group's, for a per-layer setting) what no type expresses."""
    m = spec.model
    base = _attention_fields(m.attention)
    for i, block in enumerate(m.blocks()):
        if _attention_fields(block.attention) != base:
            raise HFUnsupported(f"{_named(m, ('model', 'attention'), i)}: attention settings that differ "
                                "by layer (heads, widths, biases, q/k norm): every transformers model type archspec "
                                "writes has one for every layer")
    for i, block in enumerate(m.blocks()):
        if block.attention.positional.model_dump() != m.attention.positional.model_dump():
            raise HFUnsupported(f"{_named(m, ('model', 'attention'), i)}: positions switched off for some layers: "
                                "no transformers model type archspec writes does that")
    if m.parametrization != "standard":
        raise HFUnsupported(f"model.parametrization: {m.parametrization}: transformers' models have no output "
                            "multiplier or 1/head_dim attention scale (µP); train it standard to export")
    for fam, path in _families(m):
        for i, unit in enumerate(_layer_units(m, fam)):
            if unit.hf_block is None:
                raise HFUnsupported(f"{_named(m, path, i, '.kind')}: {unit.kind!r} has no transformers "
                                    "equivalent")
    candidates = tuple(t for t in EXPORT_ORDER if (t.media is not None) == (m.media is not None))
    if m.media is not None and len(candidates) == 1:  # one type reads media (idefics): its own reason, by field
        return candidates[0], _config_as(spec, candidates[0])
    reasons = []
    for hf in candidates:
        with warnings.catch_warnings(record=True) as notes:  # what a type leaves out: said only for the one chosen
            warnings.simplefilter("always", Caution)
            try:
                config = _config_as(spec, hf)
            except HFUnsupported as e:
                reasons.append(f"{hf.model_type}: {e}")
                continue
        for note in notes:
            warnings.warn(note.message, stacklevel=2)
        return hf, config
    raise HFUnsupported("no transformers model type expresses this spec", reasons)


def _attends(m: ModelSpec) -> bool:
    """Whether some layer mixes tokens by attention (else the model has no attention, positions or pattern)."""
    return any(b.token_mixer is b.attention for b in m.blocks())


def _families(m: ModelSpec) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The block families a model's config says: without attention, no positional encoding or pattern."""
    return _FAMILIES if _attends(m) else tuple((f, p) for f, p in _FAMILIES if _COMPONENT[f] != "attention")


def _attention_fields(attention: Any) -> dict[str, Any]:
    """An attention's settings other than its pattern and positions (which their own families map)."""
    return attention.model_dump(mode="json", exclude={"sparsity", "positional"})


def _unit_at(m: ModelSpec, path: tuple[str, ...]):
    node: Any = m
    for key in path[1:]:
        node = getattr(node, key)
    return node


def _layer_units(m: ModelSpec, fam: str) -> list:
    """Family `fam`'s unit in each layer (positions are model-wide)."""
    path = dict(_FAMILIES)[fam]
    return [_unit_at(block, ("model", *path[1:])) if fam != "positional" else m.attention.positional
            for block in m.blocks()]


def _where(m: ModelSpec, path: tuple[str, ...], i: int) -> tuple[str, ...]:
    """The spec path that sets the unit at `path` (("model", "attention", "sparsity"), ...) for layer `i`: the
    model-wide field, or the layer group that overrides it there."""
    from archspec.spec.layers import layer_indices, unit_json

    if unit_json(_unit_at(m.blocks()[i], ("model", *path[1:]))) == unit_json(_unit_at(m, path)):
        return path
    for name in sorted(m.layers):
        group = m.layers[name]
        if getattr(group, path[1]) and i in layer_indices(group.select, m.n_layers, ())[0]:
            return ("model", "layers", name, *path[1:])
    return path


def _named(m: ModelSpec, path: tuple[str, ...], i: int, field: str = "") -> str:
    """`_where` as text, with the group's layers (group names in a stored spec are canonical: attention_1, ...)."""
    from archspec.spec.layers import layer_indices

    where = _where(m, path, i)
    text = ".".join(where) + field
    if where[1] == "layers":
        layers = layer_indices(m.layers[where[2]].select, m.n_layers, ())[0]
        text += f" (layer{'s' * (len(layers) > 1)} {', '.join(map(str, layers))})"
    return text


class _Recording(dict):
    """A config being written that remembers which keys a unit set."""

    def __init__(self, base: dict[str, Any]):
        super().__init__(base)
        self.written: dict[str, Any] = {}

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self.written[key] = value


def _attention_block(hf: HFType) -> str:
    """The attention kind a model type is made of, in HF's words (every type but deepseek_v3: standard attention)."""
    return hf.blocks.get("attention", "attention")


def _mixers_to_hf(m: ModelSpec, hf: HFType, out: dict[str, Any]) -> None:
    """Each layer's token mixer into the config: a type with a per-layer mixer word (`place["mixer"]`) writes them;
    any other type has attention in every layer, and refuses a layer that mixes tokens otherwise."""
    blocks = m.blocks()
    words = [_attention_block(hf) if b.token_mixer is b.attention else b.token_mixer.hf_block for b in blocks]
    allowed = hf.blocks.get("mixer", (_attention_block(hf),))
    for i, (b, word) in enumerate(zip(blocks, words)):
        if word not in allowed:
            raise HFUnsupported(f"{_named(m, ('model', 'mixer'), i, '.kind')}: {b.token_mixer.kind!r} is HF's "
                                f"{word!r}; {hf.model_type} mixes tokens by {' or '.join(map(repr, allowed))}")
    if "mixer" not in hf.place:
        return
    hf.place["mixer"](out, words)
    written: dict[str, tuple[Any, int]] = {}
    for i in _first_layers([b.token_mixer for b in blocks]):
        if blocks[i].token_mixer is blocks[i].attention:
            continue
        config = _Recording(out)
        blocks[i].token_mixer.to_hf(m, config, hf, _where(m, ("model", "mixer"), i))
        for key, value in config.written.items():
            if key in written and written[key][0] != value:
                raise HFUnsupported(f"{_named(m, ('model', 'mixer'), i)}: needs {key} = {value!r}, but layer "
                                    f"{written[key][1]} needs {written[key][0]!r}: {hf.model_type} has one {key}")
            written.setdefault(key, (value, i))
    out.update({key: value for key, (value, _) in written.items()})


def _config_as(spec: Spec, hf: HFType) -> dict[str, Any]:
    m = spec.model
    if (m.media is None) != (hf.media is None):
        raise HFUnsupported(f"model.media: {hf.model_type} " + ("has no media input" if hf.media is None else
                                                                "reads media beside the text; this model has none"))
    if hf.media is not None:  # its media settings first: the reason a media model cannot be written, by field
        hf.media.check(m)
    if m.attention.hf_block != _attention_block(hf):
        raise HFUnsupported(f"model.attention.kind: {m.attention.kind!r} is HF's {m.attention.hf_block!r}; "
                            f"{hf.model_type} has {_attention_block(hf)!r}")
    for fam, path in _families(m):
        units = _layer_units(m, fam)
        if fam not in hf.blocks:  # a type without attention (mamba2) asked for a layer that attends
            i = next(i for i, b in enumerate(m.blocks()) if b.token_mixer is b.attention)
            raise HFUnsupported(f"{_named(m, ('model', 'attention'), i)}: layer {i} attends; {hf.model_type} has no "
                                f"attention (it mixes tokens by {' or '.join(map(repr, hf.blocks.get('mixer', ())))})")
        want = hf.blocks[fam] if isinstance(hf.blocks[fam], tuple) else (hf.blocks[fam],)
        for i, unit in enumerate(units):
            if unit.hf_block not in want:
                raise HFUnsupported(f"{_named(m, path, i)}: {unit.kind!r} is HF's {unit.hf_block!r}; "
                                    f"{hf.model_type} has {hf.blocks[fam]!r}")
        words = [u.hf_block for u in units]
        if len(set(words)) > 1 and fam not in hf.place:
            wide = _unit_at(m, path).hf_block
            i = next(i for i, w in enumerate(words) if w != wide)
            raise HFUnsupported(f"{_named(m, path, i)}: HF's {words[i]!r} here, {wide!r} in the other layers: "
                                f"{hf.model_type} has one {fam} for every layer")
    if m.embedding_norm != bool(hf.facts.get("embedding_norm")):
        raise HFUnsupported(f"model.embedding_norm: {str(m.embedding_norm).lower()} cannot be expressed as "
                            f"{hf.model_type} (it {'always has' if hf.facts.get('embedding_norm') else 'has no'} norm "
                            "after its token embeddings)")
    k = hf.keys
    out: dict[str, Any] = {"model_type": hf.model_type, "architectures": [hf.architecture], **hf.fixed,
                           k["vocab_size"]: m.vocab_size, k["context_length"]: m.context_length,
                           k["d_model"]: m.d_model, k["n_layers"]: m.n_layers, k["tie"]: m.tie_embeddings,
                           "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "dtype": "float32"}
    for key in hf.dropout_keys:
        out[key] = m.dropout
    if m.dropout and not hf.dropout_keys:
        raise HFUnsupported(f"model.dropout: {m.dropout}: {hf.model_type} has no dropout")
    for fam, path in _families(m):
        units = _layer_units(m, fam)
        if fam in hf.place:
            hf.place[fam](out, [u.hf_block for u in units])
        # Each distinct unit writes its fields; two layers' units that need one key to hold two values are refused.
        written: dict[str, tuple[Any, tuple[str, ...]]] = {}
        for i in _first_layers(units):
            where = _where(m, path, i)
            config = _Recording(out)
            units[i].to_hf(m, config, hf, where)
            for key, value in config.written.items():
                if key in written and written[key][0] != value:
                    raise HFUnsupported(f"{_named(m, path, i)}: needs {key} = {value!r}, but "
                                        f"{'.'.join(written[key][1])} needs {written[key][0]!r}: {hf.model_type} has "
                                        f"one {key} for every layer")
                written.setdefault(key, (value, where))
        out.update({key: value for key, (value, _) in written.items()})
    if _attends(m):
        m.attention.to_hf(m, out, hf)
    _mixers_to_hf(m, hf, out)
    _shape_to_hf(m, hf, out)
    if hf.mtp_layers is not None:
        out[hf.mtp_layers] = m.mtp.depth if m.mtp is not None else 0
    elif m.mtp is not None:  # inference drops them: the exported model computes the same
        warnings.warn(Caution(f"model.mtp: its {m.mtp.depth} multi-token prediction module"
                              f"{'s' * (m.mtp.depth > 1)} left out: {hf.model_type} has none (inference does not use "
                              "them; the logits are the same)"))
    if hf.rewrite is not None and hf.rewrite[1] is not None:
        hf.rewrite[1](m, out)
    if hf.media is not None:
        hf.media.to_hf(m, out)
    return out


def _first_layers(units: list) -> list[int]:
    """The first layer of each distinct unit (equal layers share one unit object)."""
    seen: dict[int, int] = {}
    for i, unit in enumerate(units):
        seen.setdefault(id(unit), i)
    return list(seen.values())


# ── weights ──────────────────────────────────────────────────────────────────────────────────────────────────────


def _prefixed(weights: list[HFWeight], ours: str, hf: str) -> list[HFWeight]:
    return [dataclasses.replace(w, ours=tuple(ours + n for n in w.our_names) if not isinstance(w.ours, str)
                                else ours + w.ours, hf=tuple(hf + n for n in w.hf)) for w in weights]


def weight_map(m: ModelSpec, hf: HFType) -> list[HFWeight]:
    """Every parameter of the generated module and its HF name(s), in full."""
    n = hf.names
    base = f"{n['base']}."
    out = [HFWeight("tok_emb.weight", (f"{base}{n['embed']}.weight",))]
    if m.embedding_norm:
        out += _prefixed(m.norm.hf_weights(m, hf), "tok_norm.", f"{base}{n['embed_norm']}.")
    out += _prefixed(m.attention.positional.hf_weights(m, hf), "", base)
    for i, block in enumerate(m.blocks()):
        out += _block_weights(m, hf, block, f"blocks.{i}.", f"{base}{n['layers']}.{i}.")
    if m.final_norm:
        out += _prefixed(m.norm.hf_weights(m, hf), "final_norm.", f"{base}{n['final_norm']}.")
    head = n.get("lm_head", "lm_head")
    if not m.tie_embeddings:
        out.append(HFWeight("lm_head.weight", (f"{head}.weight",)))
    if m.lm_head_bias:
        out.append(HFWeight("lm_head.bias", (f"{head}.bias",)))
    for j, theirs in enumerate(mtp_prefixes(m, hf)):  # DeepSeek-V3's multi-token prediction layers (model.mtp)
        ours = f"mtp.{j}."
        for our_name, their_name in (("embed_norm", "enorm"), ("hidden_norm", "hnorm"), ("norm", "shared_head.norm")):
            out += _prefixed(m.norm.hf_weights(m, hf), f"{ours}{our_name}.", f"{theirs}{their_name}.")
        out.append(HFWeight(f"{ours}proj.weight", (f"{theirs}eh_proj.weight",)))  # [enorm(emb); hnorm(h)] → d
        out += _block_weights(m, hf, m.blocks()[-1], f"{ours}block.", theirs)
    if hf.media is not None:  # the cross-attention layers and the resampler (idefics)
        out += hf.media.weights(m, hf)
    return out


def _block_weights(m: ModelSpec, hf: HFType, block: Any, ours: str, theirs: str) -> list[HFWeight]:
    """One block's parameters and their HF names, under the prefixes given."""
    n, out = hf.names, []
    # a shared-norm parallel block's one norm is HF's input norm (GPT-J's ln_1, Phi's input_layernorm)
    attr = type(block.token_mixer).attribute  # the block's mixer module: HF's module of that role
    # a mixer's norms are HF's norms of the token-mixing sublayer (roles attn_norm, attn_post_norm)
    inputs, outputs = block.block.norms_of(attr, type(block.ffn).sublayer)
    norms = [(name, "attn_norm" if name == "norm" else "attn" + name.removeprefix(attr) if name.startswith(attr)
              else name, block.norm) for name in (*inputs, *outputs)]
    ffn = (("ffn", "ffn", block.ffn),) if type(block.ffn).sublayer else ()  # a block may have no channel mixer
    for our_name, role, unit in (*norms, (attr, attr, block.token_mixer), *ffn):
        out += _prefixed(unit.hf_weights(m, hf), f"{ours}{our_name}.", f"{theirs}{n[role]}.")
    return out


def mtp_prefixes(m: ModelSpec, hf: HFType) -> list[str]:
    """The HF prefix of each multi-token prediction layer: the decoder layers past num_hidden_layers (none when the
    type has none or the model no model.mtp)."""
    if m.mtp is None or hf.mtp_layers is None:
        return []
    base = f"{hf.names['base']}.{hf.names['layers']}."
    return [f"{base}{m.n_layers + j}." for j in range(m.mtp.depth)]


def _mtp_shared(m: ModelSpec, hf: HFType) -> list[tuple[str, str]]:
    """(our parameter, HF name) of the tensors each multi-token prediction layer stores again though it shares them
    with the model: its embedding (embed_tokens) and head (shared_head.head). Written back on export; on import, when
    present, they must equal the model's."""
    return [(ours, f"{prefix}{theirs}") for prefix in mtp_prefixes(m, hf)
            for ours, theirs in (("tok_emb.weight", "embed_tokens.weight"), ("lm_head.weight", "shared_head.head.weight"))]


def state_to_hf(m: ModelSpec, hf: HFType, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state_dict → HF's names and layouts (a tied LM head is HF's embeddings: stored once)."""
    out: dict[str, torch.Tensor] = {}
    for w in weight_map(m, hf):
        out.update(w.to_hf([state[name] for name in w.our_names]))
    for ours, theirs in _mtp_shared(m, hf):  # a copy each: safetensors stores no two names for one tensor
        out[theirs] = state[ours].detach().clone()
    return out


def left_out_layers(hf: HFType, data: dict) -> range:
    """The decoder layers stored past num_hidden_layers that `hf`'s model leaves out (`HFType.left_out_layers`)."""
    count = data.get(hf.left_out_layers) if hf.left_out_layers else None
    n_layers = data.get(hf.keys.get("n_layers", "num_hidden_layers"))
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0 or not isinstance(n_layers, int):
        return range(0)
    return range(n_layers, n_layers + count)


def state_from_hf(m: ModelSpec, hf: HFType, tensors: dict[str, torch.Tensor], source: str,
                  expected: dict[str, torch.Size] | None = None, skip_layers: range = range(0)
                  ) -> dict[str, torch.Tensor]:
    """HF tensors → the generated module's state_dict (fp32). Every HF tensor must be used (save known buffers and
    the tensors of `skip_layers`, layers the type's model leaves out), every parameter found, every shape the
    generated module's (`expected`, from the module on the meta device)."""
    if hf.media is not None:  # what the type's model holds besides (idefics: its vision encoder, its extra vocabulary)
        tensors = hf.media.prepare(tensors, source)
    if skip_layers:
        base = f"{hf.names.get('base', 'model')}.{hf.names.get('layers', 'layers')}."
        tensors = {k: v for k, v in tensors.items()
                   if not (k.startswith(base) and k[len(base):].split(".", 1)[0].isdigit()
                           and int(k[len(base):].split(".", 1)[0]) in skip_layers)}
    out: dict[str, torch.Tensor] = {}
    missing: list[str] = []
    used: set[str] = set()
    theirs: dict[str, str] = {}
    for w in weight_map(m, hf):
        for ours in w.our_names:
            theirs[ours] = " + ".join(w.hf)
        if any(name not in tensors for name in w.hf):
            missing += [name for name in w.hf if name not in tensors]
            continue
        for name in w.hf:  # a weight is a finite float: integer tensors or NaN/inf would import as a broken model
            t = tensors[name]
            if not t.is_floating_point():
                raise HFUnsupported(f"{source}: {printable(name, 200)}: {str(t.dtype).removeprefix('torch.')} "
                                    "tensor; a weight is floating point (quantized files are not imported)")
            if not bool(torch.isfinite(t).all()):
                raise HFUnsupported(f"{source}: {printable(name, 200)}: holds NaN or infinite values; refusing "
                                    "weights that cannot compute anything")
        used.update(w.hf)
        try:
            out.update({k: v.to(torch.float32) for k, v in w.to_ours([tensors[name] for name in w.hf]).items()})
        except RuntimeError as e:  # parts that cannot be stacked (shapes from a different config)
            raise HFUnsupported(f"{source}: {', '.join(w.hf)}: {str(e).splitlines()[0][:200]}") from None
    if missing:
        raise HFUnsupported(f"{source}: {len(missing)} weight{'s' * (len(missing) > 1)} the config implies are "
                            "missing", [printable(n, 200) for n in missing[:20]])
    embed = next(iter(weight_map(m, hf))).hf[0]
    if m.tie_embeddings:  # the generated module's state_dict names the one matrix twice, as tok_emb and lm_head
        out["lm_head.weight"] = out["tok_emb.weight"]
    for ours, theirs in _mtp_shared(m, hf):  # the MTP layer's own copies of the shared embedding and head
        if theirs in tensors:
            if not torch.equal(tensors[theirs].to(torch.float32), out[ours]):
                raise HFUnsupported(f"{source}: {printable(theirs, 200)} differs from the model's "
                                    f"{'embedding' if ours == 'tok_emb.weight' else 'head'}: archspec's multi-token "
                                    "prediction shares them with the model (DeepSeek-V3 §2.2)")
            used.add(theirs)
    if m.tie_embeddings and "lm_head.weight" in tensors:
        if not torch.equal(tensors["lm_head.weight"], tensors[embed]):
            raise HFUnsupported(f"{source}: lm_head.weight differs from {embed}, but tie_word_embeddings is true")
        used.add("lm_head.weight")
    extra = sorted(k for k in tensors if k not in used and not _INERT_TENSORS.search(k))
    if extra:
        raise HFUnsupported(f"{source}: {len(extra)} tensor{'s' * (len(extra) > 1)} the config does not account for "
                            "(a different architecture?)", [printable(n, 200) for n in extra[:20]])
    if expected is not None:
        bad = [f"{theirs.get(k, k)} (archspec {k}): {tuple(v.shape)}, the config implies {tuple(expected[k])}"
               for k, v in out.items() if tuple(v.shape) != tuple(expected[k])]
        if bad:
            raise HFUnsupported(f"{source}: weights of the wrong shape for the config", bad[:20])
    return out
