"""The model-level assembly of HF interop: a transformers config ↔ a spec, and state dicts both ways.

Each unit (archspec/kinds) maps its own fields and weights (`from_hf`, `to_hf`, `hf_weights`); this module knows
only what belongs to the model as a whole: which unit a model type's building block is, the top-level sizes,
dropout, embeddings, final norm, LM head and the layer prefixes. Nothing here names a kind.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch

from archspec.errors import printable
from archspec.hf.types import COMMON_INERT, EXPORT_ORDER, PENDING, TYPES
from archspec.kinds import AttentionSpec, family
from archspec.kinds.hf import HFConfig, HFType, HFUnsupported, HFWeight
from archspec.spec import Spec
from archspec.spec.model import ModelSpec

# HF tensors that are buffers, not weights: GPT-2's causal mask in old checkpoints, the rotary inverse
# frequencies some LLaMA checkpoints saved. Derived from the config; skipped on import.
_INERT_TENSORS = re.compile(r"(\.attn\.(masked_)?bias|\.rotary_emb\.inv_freq)$")

# The families a block is made of, in the order their `to_hf` run (the attention's q/k norm reads the norm's eps).
_FAMILIES = (("norm", ("model", "norm")), ("positional", ("model", "attention", "positional")),
             ("sparsity", ("model", "attention", "sparsity")), ("ffn", ("model", "ffn")))


def hf_type(model_type: Any, source: str) -> HFType:
    if model_type in TYPES:
        return TYPES[model_type]
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
    hf = hf_type(data.get("model_type"), source)
    cfg = HFConfig(data, hf, source)
    for check in hf.check:
        check(cfg)
    units: dict[str, dict[str, Any]] = {}
    for fam, _ in _FAMILIES:
        block = hf.pick[fam](cfg) if fam in hf.pick else hf.blocks[fam]
        units[fam] = _unit_class(fam, block, cfg).from_hf(cfg)
    attention = AttentionSpec.from_hf(cfg)
    attention.update(positional=units["positional"], sparsity=units["sparsity"])
    model = {
        "vocab_size": cfg.take("vocab_size", int), "context_length": cfg.take("context_length", int),
        "d_model": cfg.take("d_model", int), "n_layers": cfg.take("n_layers", int),
        "norm": units["norm"], "attention": attention, "ffn": units["ffn"],
        "tie_embeddings": cfg.take("tie", bool), "dropout": _dropout(cfg),
    }
    unread = sorted(set(data) - cfg.taken - COMMON_INERT - hf.inert)
    if unread:
        raise HFUnsupported(
            f"{source}: {len(unread)} field{'s' * (len(unread) > 1)} archspec does not map; a {hf.model_type} model "
            "with them may compute something else, so nothing was imported",
            [f"{k}: {printable(repr(data[k]), 80)}" for k in unread])
    return {"name": name, "model": model}


def _dropout(cfg: HFConfig) -> float:
    rates = {k: cfg.take(k, (int, float), default=cfg.hf.defaults.get(k, 0.0)) for k in cfg.hf.dropout_keys}
    values = set(rates.values())
    if len(values) > 1:
        raise cfg.refuse(cfg.hf.dropout_keys[0], f"dropout rates differ ({', '.join(f'{k}={v}' for k, v in rates.items())}); "
                         "archspec has one, model.dropout")
    return float(values.pop()) if values else 0.0


# ── spec → config ────────────────────────────────────────────────────────────────────────────────────────────────


def config_from_spec(spec: Spec) -> tuple[HFType, dict[str, Any]]:
    """The first transformers type (EXPORT_ORDER) that expresses `spec`, and its config dict. Refuses by field name
    what no type expresses."""
    m = spec.model
    if getattr(m, "layers", None):
        raise HFUnsupported("model.layers: per-layer variation: no transformers model type archspec writes has it")
    for fam, path in _FAMILIES:
        unit = _unit_at(m, path)
        if unit.hf_block is None:
            raise HFUnsupported(f"{'.'.join(path)}.kind: {unit.kind!r} has no transformers equivalent")
    reasons = []
    for hf in EXPORT_ORDER:
        try:
            return hf, _config_as(spec, hf)
        except HFUnsupported as e:
            reasons.append(f"{hf.model_type}: {e}")
    raise HFUnsupported("no transformers model type expresses this spec", reasons)


def _unit_at(m: ModelSpec, path: tuple[str, ...]):
    node: Any = m
    for key in path[1:]:
        node = getattr(node, key)
    return node


def _config_as(spec: Spec, hf: HFType) -> dict[str, Any]:
    m = spec.model
    for fam, path in _FAMILIES:
        block, want = _unit_at(m, path).hf_block, hf.blocks[fam]
        if block not in (want if isinstance(want, tuple) else (want,)):
            raise HFUnsupported(f"{'.'.join(path)}: {_unit_at(m, path).kind!r} is HF's {block!r}; "
                                f"{hf.model_type} has {want!r}")
    k = hf.keys
    out: dict[str, Any] = {"model_type": hf.model_type, "architectures": [hf.architecture], **hf.fixed,
                           k["vocab_size"]: m.vocab_size, k["context_length"]: m.context_length,
                           k["d_model"]: m.d_model, k["n_layers"]: m.n_layers, k["tie"]: m.tie_embeddings,
                           "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "dtype": "float32"}
    for key in hf.dropout_keys:
        out[key] = m.dropout
    if m.dropout and not hf.dropout_keys:
        raise HFUnsupported(f"model.dropout: {m.dropout}: {hf.model_type} has no dropout")
    for fam, path in _FAMILIES:
        _unit_at(m, path).to_hf(m, out, hf, path)
    m.attention.to_hf(m, out, hf)
    return out


# ── weights ──────────────────────────────────────────────────────────────────────────────────────────────────────


def _prefixed(weights: list[HFWeight], ours: str, hf: str) -> list[HFWeight]:
    return [dataclasses.replace(w, ours=ours + w.ours, hf=tuple(hf + n for n in w.hf)) for w in weights]


def weight_map(m: ModelSpec, hf: HFType) -> list[HFWeight]:
    """Every parameter of the generated module and its HF name(s), in full."""
    n = hf.names
    base = f"{n['base']}."
    out = [HFWeight("tok_emb.weight", (f"{base}{n['embed']}.weight",))]
    out += _prefixed(m.attention.positional.hf_weights(m, hf), "", base)
    for i in range(m.n_layers):
        ours, theirs = f"blocks.{i}.", f"{base}{n['layers']}.{i}."
        for our_name, role, unit in (("attn_norm", "attn_norm", m.norm), ("attn", "attn", m.attention),
                                     ("ffn_norm", "ffn_norm", m.norm), ("ffn", "ffn", m.ffn)):
            out += _prefixed(unit.hf_weights(m, hf), f"{ours}{our_name}.", f"{theirs}{n[role]}.")
    out += _prefixed(m.norm.hf_weights(m, hf), "final_norm.", f"{base}{n['final_norm']}.")
    if not m.tie_embeddings:
        out.append(HFWeight("lm_head.weight", ("lm_head.weight",)))
    return out


def state_to_hf(m: ModelSpec, hf: HFType, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state_dict → HF's names and layouts (a tied LM head is HF's embeddings: stored once)."""
    out: dict[str, torch.Tensor] = {}
    for w in weight_map(m, hf):
        out.update(w.to_hf(state[w.ours]))
    return out


def state_from_hf(m: ModelSpec, hf: HFType, tensors: dict[str, torch.Tensor], source: str,
                  expected: dict[str, torch.Size] | None = None) -> dict[str, torch.Tensor]:
    """HF tensors → the generated module's state_dict (fp32). Every HF tensor must be used (save known buffers),
    every parameter found, every shape the generated module's (`expected`, from the module on the meta device)."""
    out: dict[str, torch.Tensor] = {}
    missing: list[str] = []
    used: set[str] = set()
    theirs: dict[str, str] = {}
    for w in weight_map(m, hf):
        theirs[w.ours] = " + ".join(w.hf)
        if any(name not in tensors for name in w.hf):
            missing += [name for name in w.hf if name not in tensors]
            continue
        used.update(w.hf)
        try:
            out[w.ours] = w.to_ours([tensors[name] for name in w.hf]).to(torch.float32)
        except RuntimeError as e:  # parts that cannot be stacked (shapes from a different config)
            raise HFUnsupported(f"{source}: {', '.join(w.hf)}: {str(e).splitlines()[0][:200]}") from None
    if missing:
        raise HFUnsupported(f"{source}: {len(missing)} weight{'s' * (len(missing) > 1)} the config implies are "
                            "missing", [printable(n, 200) for n in missing[:20]])
    embed = next(iter(weight_map(m, hf))).hf[0]
    if m.tie_embeddings:  # the generated module's state_dict names the one matrix twice, as tok_emb and lm_head
        out["lm_head.weight"] = out["tok_emb.weight"]
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
