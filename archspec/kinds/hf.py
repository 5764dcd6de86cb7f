"""HF transformers interop, the part each unit holds: how its fields are read from and written to a transformers
`config.json`, and what its weights are called there.

A unit says which HF building block it is (`hf_block`, in HF's own vocabulary: "rms_norm", "rotary",
"gated_mlp", "full_attention", ...), reads its fields from an `HFConfig` (`from_hf`), writes them back (`to_hf`)
and lists its weights as `HFWeight`s (names inside its own module on both sides). The model-level assembly —
which building blocks a model type uses, its key names, layer prefixes, embeddings, final norm and LM head — is
`archspec.hf`. Nothing here needs transformers: configs are JSON, weights are tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from archspec.errors import UserError, printable
from archspec.kinds import limits

_MISSING = object()

# Every integer a config gives is bounded before anything is sized by it (a list per layer, a tensor), with the
# spec's own bounds (archspec.kinds.limits): `num_hidden_layers: 1000000000` in a 700-byte file is refused here, not
# by the kernel's OOM killer. Roles not named take GENERIC_INT (a count or a size, never negative).
INT_BOUNDS: dict[str, tuple[int, int]] = {
    "n_layers": (1, limits.MAX_LAYERS), "vocab_size": (1, limits.MAX_VOCAB),
    "context_length": (1, limits.MAX_CONTEXT), "n_ctx": (1, limits.MAX_CONTEXT), "d_model": (1, limits.MAX_WIDTH),
    "n_heads": (1, limits.MAX_HEADS), "n_kv_heads": (1, limits.MAX_HEADS), "head_dim": (1, limits.MAX_HEAD_DIM),
    "v_head_dim": (1, limits.MAX_HEAD_DIM), "qk_rope_head_dim": (0, limits.MAX_HEAD_DIM),
    "qk_nope_head_dim": (0, limits.MAX_HEAD_DIM), "rotary_dim": (0, limits.MAX_HEAD_DIM),
    "ffn_hidden": (1, limits.MAX_HIDDEN), "expert_hidden": (1, limits.MAX_HIDDEN),
    "shared_hidden": (1, limits.MAX_HIDDEN), "kv_lora_rank": (1, limits.MAX_WIDTH),
    "q_lora_rank": (1, limits.MAX_WIDTH), "n_experts": (1, limits.MAX_LAYERS * 16),
    "top_k": (1, limits.MAX_LAYERS * 16), "sliding_window": (1, limits.MAX_CONTEXT),
}
GENERIC_INT = (0, limits.MAX_CONTEXT)
SHOWN = 80  # characters of a config value echoed in a message


class HFUnsupported(UserError):
    """An HF config field (import) or a spec field (export) that the other side cannot express: exit 2, by name."""


@dataclass(frozen=True)
class HFType:
    """One transformers model type, as the units need to see it (the table is archspec.hf.types).

    blocks: family → the HF building block this type uses ("norm": "rms_norm", "positional": "rotary", ...), or
        the words it can use where its config decides which, `pick` naming the callable (HFConfig) → word that
        decides (Mistral's sliding_window): one word for every layer, or a list, one per layer (Qwen2's layer_types,
        Qwen2-MoE's mlp_only_layers).
    place: family → the callable (config out, one word per layer) that writes a per-layer mix of that family's
        blocks into a config on export (layer_types, mlp_only_layers). A family without one: every layer alike.
    aliases: another spelling → the key it stands for (transformers' attribute_map: Qwen3-MoE's files say
        num_local_experts for num_experts).
    keys: role → config key ("d_model": "hidden_size", "norm_eps": "rms_norm_eps", ...).
    defaults: the value transformers uses when a key is absent from config.json (None: required).
    names: role → module name inside HF's model ("q": "q_proj", "attn_norm": "input_layernorm", ...).
    conv1d: weights stored (in, out), GPT-2's Conv1D, rather than nn.Linear's (out, in).
    norm_placement: where the type's blocks put their norms (archspec.spec.layers.BlockShape: pre, post, sandwich,
        output); whether its blocks are parallel, and share one input norm, are the facts "parallel" and "shared_norm".
    facts: yes/no properties units ask about ("qkv_bias", "out_bias", "qk_norm", "norm_bias", "mlp_bias",
        "partial_rotary": the rotary embedding honours partial_rotary_factor, "rope_interleaved": it rotates (2i, 2i + 1)
        pairs, "default_rope_only": it has no frequency scaling archspec has; the model's: "parallel", "shared_norm",
        "lm_head_bias", "embedding_scale" (sqrt(d_model)), "norm_unit_offset" (Gemma's (1 + w)), "qk_norm_projection"
        (OLMo 2), "qk_norm_unit_offset" (Qwen3-Next's q/k norm gains stored as w for 1 + w), "output_gate" (Qwen3-Next's
        gated attention), "qkv_per_head" (GPT-NeoX's fused q/k/v rows grouped by head)): a config key (str) that holds it, or the
        value this type always has (bool). Absent: always False.
    rewrite: (read, write): this type's own spelling of what the units read and write: `read(cfg)` turns the file's
        keys into the common ones before any unit reads (GPT-J's rotary_dim → partial_rotary_factor), `write(m, out)`
        turns the written config into the type's (and refuses what it cannot say).
    inert: keys that do not change the function the model computes (ids, generation defaults, init scale, ...).
    check: extra config rules of this type: callables (HFConfig) → None that take their keys and may refuse.
    dropout_keys: the config's dropout rates (archspec has one, model.dropout).
    fixed: keys written on export with these values (what this type needs said that no unit says).
    """

    model_type: str
    architecture: str
    blocks: dict[str, str | tuple[str, ...]]
    keys: dict[str, str]
    defaults: dict[str, Any]
    names: dict[str, str]
    conv1d: bool = False
    norm_placement: str = "pre"
    facts: dict[str, str | bool] = field(default_factory=dict)
    inert: frozenset[str] = frozenset()
    check: tuple[Callable[["HFConfig"], None], ...] = ()
    dropout_keys: tuple[str, ...] = ()
    fixed: dict[str, Any] = field(default_factory=dict)
    pick: dict[str, Callable[["HFConfig"], str | list[str]]] = field(default_factory=dict)
    place: dict[str, Callable[[dict[str, Any], list[str]], None]] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    # a config key counting decoder layers stored past num_hidden_layers that the type's model leaves out (DeepSeek-V3's
    # multi-token-prediction layers, num_nextn_predict_layers): their tensors are not imported, and the import says so
    left_out_layers: str | None = None
    # a config key counting multi-token prediction layers stored past num_hidden_layers (DeepSeek-V3's
    # num_nextn_predict_layers: enorm, hnorm, eh_proj, a decoder layer, shared_head): imported as model.mtp and written
    # back under their names on export (transformers' own model builds none of them and ignores their tensors)
    mtp_layers: str | None = None
    # (read, write), either None: this type's own spellings (GPT-J's rotary_dim; MPT's nested attn_config)
    rewrite: tuple[Callable[["HFConfig"], None] | None, Callable[[Any, dict[str, Any]], None] | None] | None = None
    # the mapping of a type whose model reads media beside the text (IDEFICS: archspec.hf.idefics.IdeficsMedia): it
    # reads and writes model.media (`from_hf(cfg, model)`, `check(m)`, `to_hf(m, out)`), names its weights
    # (`weights(m, hf)`) and prepares the files' tensors (`prepare(tensors, source)`: what it leaves out or merges)
    media: Any = None


class HFConfig:
    """A transformers config being read. Every key a reader takes is marked, so that the assembly can refuse the
    keys nobody read: no field is silently ignored."""

    def __init__(self, data: dict[str, Any], hf: HFType, source: str):
        self.hf, self.source = hf, source
        self.taken: set[str] = set()
        self.data = dict(data)
        for alias, key in hf.aliases.items():  # another spelling transformers reads as `key` (its attribute_map)
            if alias in self.data:
                self.taken.add(alias)
                value = self.data.pop(alias)
                if self.data.get(key, value) != value:
                    raise self.refuse(alias, f"{value!r}, but {key} (the same setting) is {self.data[key]!r}")
                self.data[key] = value

    def key(self, role: str) -> str:
        return self.hf.keys.get(role, role)

    def take(self, role: str, kind: type | tuple[type, ...] | None = None, default: Any = _MISSING) -> Any:
        """The value of `role`'s key, type-checked; marks it read. Absent: the model type's default for it (what
        transformers assumes), else `default`. Null: `default` (the caller says what null means)."""
        key = self.key(role)
        self.taken.add(key)
        value = self.data.get(key)
        if value is None and key in self.data and kind is bool and default is not _MISSING and default:
            # transformers tests a switch by truth (`if config.multi_query:`), so a written null is false there, while
            # the default is true: reading null as the default would build another model than transformers does
            raise self.refuse(role, "null: transformers reads it as false, its default is true; write true or false")
        if value is None:
            if key not in self.data and key in self.hf.defaults:
                value = self.hf.defaults[key]
            elif default is not _MISSING:
                value = default
            else:
                raise self.refuse(role, "required but missing")
        if kind is not None and value is not None:
            kinds = kind if isinstance(kind, tuple) else (kind,)
            if float in kinds and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
                names = " or ".join(k.__name__ for k in kinds)
                raise self.refuse(role, f"expected {names}, got {printable(repr(value), SHOWN)}")
        return bounded(self, role, value)

    def take_layers(self, role: str, n_layers: int, default: Any = _MISSING) -> list[int] | None:
        """A list of layer indices (Qwen2-MoE's mlp_only_layers, LFM2's full_attn_idxs), type-checked: each an integer
        in 0..n_layers - 1, else refused by its key (an index past the model, or `true` or `1.0` that Python's `in`
        would read as layer 1, would silently change which layers are which)."""
        value = self.take(role, list, default=default)
        if value is None:
            return None
        bad = [i for i in value if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_layers]
        if bad:
            raise self.refuse(role, f"{printable(repr(bad), SHOWN)}: expected layer indices in 0..{n_layers - 1}")
        return value

    def fact(self, name: str) -> bool:
        """A yes/no property (`HFType.facts`): the value this type always has, or read from its config key."""
        spelled = self.hf.facts.get(name, False)
        return self.take(spelled, bool, default=False) if isinstance(spelled, str) else spelled

    def mark(self, *keys: str) -> None:
        self.taken.update(keys)

    def refuse(self, role: str, why: str) -> HFUnsupported:
        return HFUnsupported(f"{self.source}: {printable(self.key(role), SHOWN)}: {printable(why, 4 * SHOWN)} "
                             f"({self.hf.model_type})")


def bounded(cfg: HFConfig, role: str, value: Any) -> Any:
    """`value` when every number in it is within bounds (INT_BOUNDS by role, else GENERIC_INT; floats finite), else
    refused by its key, before anything is sized by it. Lists (layer_types, mlp_only_layers) are checked per item."""
    import math

    items = value if isinstance(value, list) else [value]
    for v in items:
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            lo, hi = INT_BOUNDS.get(role, GENERIC_INT)
            if not lo <= v <= hi:
                raise cfg.refuse(role, f"{printable(repr(v), SHOWN)} is out of range (archspec takes {lo} to {hi})")
        elif isinstance(v, float) and not math.isfinite(v):
            raise cfg.refuse(role, f"{v!r}: expected a finite number")
    return value


def put_fact(out: dict[str, Any], hf: HFType, name: str, value: bool, path: tuple[str, ...]) -> None:
    """Write a yes/no property into a config, or refuse (naming the spec field at `path`) when `hf` fixes it."""
    spelled = hf.facts.get(name, False)
    if isinstance(spelled, str):
        if spelled in out and out[spelled] != bool(value):  # one key for two properties (LLaMA's attention_bias)
            raise HFUnsupported(f"{'.'.join(path)}: {str(bool(value)).lower()} cannot be expressed as "
                                f"{hf.model_type} (its {spelled} sets it and another property alike)")
        out[spelled] = bool(value)
    elif bool(value) != spelled:
        raise HFUnsupported(f"{'.'.join(path)}: {str(bool(value)).lower()} cannot be expressed as "
                            f"{hf.model_type} (its {name.replace('_', ' ')} is always {str(spelled).lower()})")


@dataclass(frozen=True)
class HFWeight:
    """Our parameter(s) and their HF counterpart(s), each named inside its own module (the assembly adds the layer
    prefixes). One side may hold several tensors that are the other side's one, concatenated along `dim` in order:
    several HF names, ours their concatenation (q_proj, k_proj, v_proj → our fused qkv_proj); several of ours
    (`ours` a tuple), HF's their concatenation (our experts' gate_proj and up_proj → HF's fused gate_up_proj).
    `sizes`: each part's length along `dim`. `stack`: the HF tensors are ours' slices along a new dimension `dim`
    instead (one matrix per expert in HF's files, ours stacked (n_experts, out, in)). `transpose`: HF stores it
    (in, out) (GPT-2's Conv1D; of a stack of matrices, the last two dimensions: gpt-oss's experts). `interleave`:
    ours' parts alternate element by element along `dim` in HF's tensor instead of following one another (gpt-oss's
    gate_up_proj: gate unit i at 2i, up unit i at 2i + 1)."""

    ours: str | tuple[str, ...]
    hf: tuple[str, ...]
    sizes: tuple[int, ...] | None = None
    transpose: bool = False
    dim: int = 0
    stack: bool = False
    # A fused q/k/v whose HF rows are grouped per K/V head (GPT-NeoX, BLOOM: head 0's q, k, v, then head 1's, ...;
    # Falcon: each K/V group's query heads, then its k and v), ours by part (every head's q, then k, then v);
    # `per_head` is the number of query heads, the parts are `sizes` (q, k, v rows).
    per_head: int = 0
    # HF stores it less this constant (Qwen3-Next's q/k RMSNorm gains, applied as 1 + w): ours = HF's + offset.
    offset: float = 0.0
    interleave: bool = False

    @property
    def our_names(self) -> tuple[str, ...]:
        return (self.ours,) if isinstance(self.ours, str) else tuple(self.ours)

    def to_hf(self, tensors: list[Any]) -> dict[str, Any]:
        """Ours (in `our_names` order) → {HF name: tensor}."""
        import torch

        if self.interleave:  # (.., n, ..) parts → (.., n·parts, ..): part p's element i at i·parts + p
            whole = torch.stack(list(tensors), dim=self.dim + 1).flatten(self.dim, self.dim + 1)
        else:
            whole = torch.cat(list(tensors), dim=self.dim) if len(tensors) > 1 else tensors[0]
        if self.per_head:
            whole = self._regroup(whole, by_head=True)
        if self.stack:
            parts = whole.unbind(self.dim)
        else:
            parts = whole.split(list(self.sizes), dim=self.dim) if len(self.hf) > 1 else (whole,)
        if self.offset:
            parts = [p - self.offset for p in parts]
        return {name: (_swap_last(p) if self.transpose else p).contiguous() for name, p in zip(self.hf, parts)}

    def to_ours(self, tensors: list[Any]) -> dict[str, Any]:
        """HF's (in `hf` order) → {our name: tensor}."""
        import torch

        parts = [_swap_last(t) if self.transpose else t for t in tensors]
        if self.offset:
            parts = [p + self.offset for p in parts]
        if self.stack:
            whole = torch.stack(parts, dim=self.dim)
        else:
            whole = torch.cat(parts, dim=self.dim) if len(parts) > 1 else parts[0]
        if self.per_head:
            if whole.shape[0] != sum(self.sizes):
                raise RuntimeError(f"expected {sum(self.sizes)} rows of q, k and v, got shape {tuple(whole.shape)}")
            whole = self._regroup(whole, by_head=False)
        names = self.our_names
        if self.interleave:
            if whole.ndim <= self.dim or whole.shape[self.dim] % len(names):
                raise RuntimeError(f"expected a multiple of {len(names)} along dim {self.dim} to de-interleave into "
                                   f"{', '.join(names)}, got shape {tuple(whole.shape)}")
            parts = whole.unflatten(self.dim, (-1, len(names))).unbind(self.dim + 1)
            return {n: p.contiguous() for n, p in zip(names, parts)}
        if len(names) > 1:
            if whole.ndim <= self.dim or whole.shape[self.dim] != sum(self.sizes):
                raise RuntimeError(f"expected {sum(self.sizes)} along dim {self.dim} to split into {', '.join(names)},"
                                   f" got shape {tuple(whole.shape)}")
            return {n: p.contiguous() for n, p in zip(names, whole.split(list(self.sizes), dim=self.dim))}
        return {names[0]: whole.contiguous()}


    def _regroup(self, whole: Any, by_head: bool) -> Any:
        """Rows ours (every query head, then every key head, then every value head) ↔ HF's, grouped per K/V head
        (that group's query heads, its key, its value): ours → HF's (by_head) or back. GPT-NeoX and BLOOM: one group
        per head (q, k, v of head 0, then head 1, ...); Falcon: one per K/V head (one group under multi-query)."""
        import torch

        q_rows, kv_rows = self.sizes[0], self.sizes[1]
        groups = kv_rows * self.per_head // q_rows  # K/V heads (per_head: the query heads)
        rest = tuple(whole.shape[1:])
        if by_head:
            parts = [p.reshape(groups, -1, *rest) for p in whole.split(list(self.sizes), dim=0)]
            return torch.cat(parts, dim=1).reshape(whole.shape).contiguous()
        per_group = [size // groups for size in self.sizes]
        grouped = whole.reshape(groups, sum(per_group), *rest)
        return torch.cat([p.reshape(-1, *rest) for p in grouped.split(per_group, dim=1)], dim=0).contiguous()


def _swap_last(t: Any) -> Any:
    """A matrix transposed; a stack of matrices (n, a, b) → (n, b, a); a vector as it is."""
    return t if t.ndim < 2 else t.transpose(-2, -1)


def linear(ours: str, hf: str, bias: bool, conv1d: bool) -> list[HFWeight]:
    """An nn.Linear (and its bias) that HF names `hf`."""
    out = [HFWeight(f"{ours}.weight", (f"{hf}.weight",), transpose=conv1d)]
    if bias:
        out.append(HFWeight(f"{ours}.bias", (f"{hf}.bias",)))
    return out
