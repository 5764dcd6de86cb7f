"""Quantizing a generated Model: which weights (the units say), the group size, the swap, the stored form, the bytes.

    plan = quant_plan(model, spec, "int4", group_size=None, embeddings=False)   # refuses what cannot be quantized
    report = apply_plan(model, plan)                                           # in place; bytes before and after
    state = quantized_state(model)          # plain tensors only: what a quantized checkpoint stores
    load_quantized_state(fresh_model_with_plan_applied, state)

Which weights: each layer's attention and FFN units name theirs (`KindUnit.quantized_weights`: their matrices; a MoE
keeps its router), norms and positions none; the token embedding and the output head only with `embeddings` (a tied
pair is one matrix, quantized once).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from archspec.errors import UserError, printable
from archspec.quant.weights import (
    GROUP_SIZES,
    SCHEMES,
    Int4Linear,
    QuantizedEmbedding,
    quantized_parameters,
    QWeight,
    int8_parts,
    quantize,
    torchao,
)

EMBEDDING, HEAD = "tok_emb.weight", "lm_head.weight"


@dataclass
class QuantPlan:
    scheme: str
    group_size: int | None  # int4's group; None for int8 (one scale per output row)
    embeddings: bool
    weights: list[str]  # parameter names in the model, in order
    kept: dict[str, str] = field(default_factory=dict)  # what stays as trained, and why (for the record)

    def to_json(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "group_size": self.group_size, "embeddings": self.embeddings,
                "weights": list(self.weights)}

    @classmethod
    def from_json(cls, data: Any, where: str) -> "QuantPlan":
        ok = (isinstance(data, dict) and data.get("scheme") in SCHEMES and isinstance(data.get("embeddings"), bool)
              and isinstance(data.get("weights"), list) and all(isinstance(w, str) for w in data["weights"])
              and (data.get("group_size") is None or type(data.get("group_size")) is int))
        if not ok:
            raise UserError(f"{where}: its quantization record is malformed")
        return cls(data["scheme"], data["group_size"], data["embeddings"], list(data["weights"]))


def _unit_weights(model: nn.Module, spec) -> tuple[list[str], dict[str, str]]:
    """Each layer asks its units: its token mixer and FFN name their quantized matrices (names inside their
    module)."""
    names: list[str] = []
    kept: dict[str, str] = {}
    blocks = spec.model.blocks()
    for i, (block, bspec) in enumerate(zip(model.blocks, blocks)):
        for attr, unit in ((type(bspec.token_mixer).attribute, bspec.token_mixer), ("ffn", bspec.ffn)):
            module = getattr(block, attr)
            chosen = unit.quantized_weights(module)
            names += [f"blocks.{i}.{attr}.{n}" for n in chosen]
            for n, p in module.named_parameters():
                if n not in chosen and p.ndim >= 2 and "bias" not in n.rsplit(".", 1)[-1]:
                    kept[f"blocks.{i}.{attr}.{n}"] = f"{type(unit).__name__} keeps it"
    return names, kept


def quant_plan(model: nn.Module, spec, scheme: str, group_size: int | None = None, embeddings: bool = False
               ) -> QuantPlan:
    """What `scheme` quantizes in this model and at which group size; a UserError for a scheme, group size or layer
    that cannot be (never a layer skipped silently)."""
    if scheme not in SCHEMES:
        raise UserError(f"--scheme: expected one of {', '.join(SCHEMES)}, got {printable(repr(scheme), 60)}")
    names, kept = _unit_weights(model, spec)
    params = dict(model.named_parameters(remove_duplicate=False))
    tied = params.get(EMBEDDING) is not None and params.get(EMBEDDING) is params.get(HEAD)
    if embeddings:
        names += [HEAD] + ([] if tied else [EMBEDDING])  # a tied pair: the head's quantized matrix embeds too
    else:
        kept.update({EMBEDDING: "embedding (--embeddings quantizes it)", HEAD: "output head (--embeddings)"})
    for name in [n for n in names if params[n].shape[-1] < 2]:  # one scale per weight: nothing to save (and
        names.remove(name)  # torchao's per-row int8 cannot reshape it); kept, and said so in the record
        kept[name] = "input width 1: a scale per weight would save nothing"
    if not names:
        raise UserError("this model has no weight its units let quantization store in low precision")
    widths = {n: params[n].shape[-1] for n in names}
    if scheme == "int8":
        if group_size is not None:
            raise UserError(f"--group-size: int8 keeps one scale per output row; --group-size applies to int4, got "
                            f"{group_size}")
        return QuantPlan(scheme, None, embeddings, names, kept)
    if group_size is None:
        for g in GROUP_SIZES:
            if all(w % g == 0 for w in widths.values()):
                group_size = g
                break
        else:
            bad = next(n for n, w in widths.items() if w % GROUP_SIZES[-1])
            raise UserError(f"--scheme int4: {bad} has input width {widths[bad]}, which none of the group sizes "
                            f"{', '.join(map(str, GROUP_SIZES))} divides; pass --group-size G with G an even divisor "
                            "of every quantized layer's input width")
    if group_size < 2 or group_size % 2:
        raise UserError(f"--group-size: must be an even number of at least 2 (two 4-bit values per byte), got "
                        f"{group_size}")
    bad = [n for n, w in widths.items() if w % group_size]
    if bad:
        raise UserError(f"--group-size {group_size}: does not divide the input width of {bad[0]} ({widths[bad[0]]})"
                        + (f" nor of {len(bad) - 1} other weight{'s' * (len(bad) > 2)}" if len(bad) > 1 else "")
                        + f"; valid: a divisor of every quantized layer's input width, e.g. "
                        f"{_common_divisors(list(widths.values()))}")
    return QuantPlan(scheme, group_size, embeddings, names, kept)


def _common_divisors(widths: list[int]) -> str:
    from math import gcd

    g = 0
    for w in widths:
        g = gcd(g, w)
    found = [d for d in range(2, min(g, 256) + 1, 2) if g % d == 0]
    return ", ".join(map(str, found[-4:])) or "none (an input width is odd)"


def apply_plan(model: nn.Module, plan: QuantPlan) -> dict[str, int]:
    """Quantize the plan's weights in place: an nn.Linear's weight through torchao (int8) or an Int4Linear (int4);
    a container's stacked weights (experts) as QuantizedParameters; the embedding as a QuantizedEmbedding (sharing
    the head's parts when tied). Returns the byte counts (see `weight_bytes`)."""
    if plan.scheme == "int8":
        torchao()
    before_all = weight_bytes(model)
    params = dict(model.named_parameters(remove_duplicate=False))
    tied = params.get(EMBEDDING) is not None and params.get(EMBEDDING) is params.get(HEAD)
    before_q = sum(params[n].numel() * params[n].element_size() for n in plan.weights)
    by_owner: dict[str, list[str]] = {}
    for name in plan.weights:
        by_owner.setdefault(name.rpartition(".")[0], []).append(name)
    after_q = 0
    head_q: QWeight | None = None
    for path, names in by_owner.items():
        owner = model.get_submodule(path)
        if isinstance(owner, nn.Linear) and names == [f"{path}.weight"]:
            q = _quantize_linear(model, path, owner, plan)
            if path == HEAD.rpartition(".")[0]:
                head_q = q
        elif isinstance(owner, nn.Embedding) and names == [f"{path}.weight"]:
            q = quantize(owner.weight, plan.scheme, plan.group_size)
            _replace(model, path, QuantizedEmbedding(q))
        else:
            quantized = {n.rpartition(".")[2]: quantize(params[n], plan.scheme, plan.group_size) for n in names}
            _replace(model, path, quantized_parameters(owner, quantized))
            q = None
            after_q += sum(x.nbytes for x in quantized.values())
        if q is not None:
            after_q += q.nbytes
    if plan.embeddings and tied and head_q is not None:  # one matrix: the embedding reads the head's parts
        _replace(model, EMBEDDING.rpartition(".")[0], QuantizedEmbedding(head_q))
    return {"weight_bytes_before": before_all, "weight_bytes_after": weight_bytes(model),
            "quantized_bytes_before": before_q, "quantized_bytes_after": after_q}


def _quantize_linear(model: nn.Module, path: str, linear: nn.Linear, plan: QuantPlan) -> QWeight:
    if plan.scheme == "int8":
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        quantize_(linear, Int8WeightOnlyConfig(), filter_fn=lambda m, fqn: m is linear)
        return QWeight("int8", tuple(linear.weight.shape), None, int8_parts(linear.weight))
    q = quantize(linear.weight, "int4", plan.group_size)
    _replace(model, path, Int4Linear(q, linear.bias))
    return q


def _replace(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, attr = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, attr, module)


# ── the stored form ───────────────────────────────────────────────────────────────────────────────────────────


def quantized_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state_dict with torchao's int8 weights as their plain parts (`<name>__qdata`, ...): every value a
    plain tensor, so a safe load reads it and the checkpoint digest covers every byte."""
    out: dict[str, torch.Tensor] = {}
    for name, value in model.state_dict().items():
        if _is_int8_subclass(value):
            out.update({f"{name}__{k}": v for k, v in int8_parts(value).items()})
        else:
            out[name] = value
    return out


def _is_int8_subclass(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and type(t) is not torch.Tensor and type(t) is not nn.Parameter \
        and hasattr(t, "qdata")


MAX_DEQUANTIZED = 1e4  # |weight| a scale may give (255 levels at most): trained weights are O(1)


def load_quantized_state(model: nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Load a `quantized_state` into a model the same plan was applied to; a UserError names the mismatch."""
    expected = quantized_state(model)
    missing = [k for k in expected if k not in state]
    extra = [k for k in state if k not in expected]
    wrong = [k for k in expected if k in state and (state[k].shape != expected[k].shape
                                                    or state[k].dtype != expected[k].dtype)]
    if missing or extra or wrong:
        lines = ([f"missing {k}" for k in missing[:3]] + [f"unexpected {k}" for k in extra[:3]]
                 + [f"{k}: {tuple(state[k].shape)} {state[k].dtype}, expected {tuple(expected[k].shape)} "
                    f"{expected[k].dtype}" for k in wrong[:3]])
        raise UserError(f"{where}: quantized weights do not fit the model its spec builds", lines)
    for k, v in state.items():  # a tampered file (its digest rewritten) cannot make weights that overflow fp32
        if k.endswith(("__scale", ".scale", ".minimum")) and v.is_floating_point() and v.numel():
            top = float(v.abs().max())
            if not top <= MAX_DEQUANTIZED / 255:
                raise UserError(f"{where}: {printable(k, 120)} holds a quantization scale of {top:.3g}, beyond any "
                                f"weight a model is trained to (dequantized weights up to {MAX_DEQUANTIZED:g}); the "
                                "file is refused")
    with torch.no_grad():
        for name, value in model.state_dict().items():
            if _is_int8_subclass(value):
                for k, part in int8_parts(value).items():
                    part.copy_(state[f"{name}__{k}"])
            else:
                value.copy_(state[name])
    for module in model.modules():
        if isinstance(module, Int4Linear):
            module._kernel = None


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's stored tensors (the stored form: quantized parts, not what they stand for), each storage
    once (tied weights, parts an embedding shares with its head)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in quantized_state(model).values():
        key = (t.untyped_storage().data_ptr(), t.storage_offset()) if t.numel() else (id(t), 0)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def load_quantized_model(model: nn.Module, spec, state: dict[str, Any], where: str) -> QuantPlan:
    """A quantized checkpoint's weights into a freshly generated Model: the recorded plan applied, then its parts
    loaded (checked name by name, shape by shape)."""
    plan = QuantPlan.from_json(state["quant"], where)
    fresh = quant_plan(model, spec, plan.scheme, plan.group_size, plan.embeddings)
    if fresh.weights != plan.weights:
        raise UserError(f"{where}: its quantized weights are not those its spec's units quantize now",
                        sorted(set(plan.weights) ^ set(fresh.weights))[:5])
    apply_plan(model, plan)
    load_quantized_state(model, state["model"], where)
    return plan
