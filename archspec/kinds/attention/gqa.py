"""Standard attention, the attention family's default kind (`kind: gqa`, written or omitted): projections, K/V head
sharing (MHA/GQA/MQA), biases, q/k norm, and the two families it holds: `positional` (how positions reach q and k)
and `sparsity` (which keys each query sees). Its template, gqa.py.j2, is the Attention module; the families' hook
macros fill it in."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from archspec.kinds.base import (EPS_MIN, AttentionKind, Const, Divides, Since, Split, Strict, TPPlan, bind, family,
                                 lit_bool, lit_float, lit_int, register)
from archspec.kinds.attention.scores import ScoreOptions, score_strategy
from archspec.kinds.hf import HFUnsupported, HFWeight, linear, put_fact
from archspec.kinds.limits import MAX_HEAD_DIM, MAX_HEADS

Positional = family("positional").union()
Sparsity = family("sparsity").union()


class QKNorm(Strict):
    """An RMSNorm over q and k, applied before the rotation: it bounds the attention logits. scope `head`: over each
    head (HEAD_DIM wide, one weight per dimension shared by all heads: Qwen3, Gemma 3); `projection`: over the whole
    projection (N_HEADS·HEAD_DIM of q, N_KV_HEADS·HEAD_DIM of k, one weight each: OLMo 2)."""

    eps: float = Field(1e-6, ge=EPS_MIN, le=0.1)
    scope: Annotated[Literal["head", "projection"], Since("0.4")] = "head"

    def params(self, q_width: int, kv_width: int, head_dim: int) -> int:
        return q_width + kv_width if self.scope == "projection" else 2 * head_dim


@register
class AttentionSpec(ScoreOptions, AttentionKind):
    # Written or omitted: specs from before attention had kinds have no `kind`, and keep their hashes (Since).
    kind: Annotated[Literal["gqa"], Since("0.4")] = "gqa"
    n_heads: int = Field(8, ge=1, le=MAX_HEADS)
    n_kv_heads: int | None = Field(None, ge=1, le=MAX_HEADS, description="= n_heads: MHA; 1: MQA; between: GQA")
    head_dim: int | None = Field(None, ge=1, le=MAX_HEAD_DIM, description="default d_model // n_heads")
    bias: bool = False
    qkv_bias: bool | None = Field(None, description="bias on the q/k/v projections (default: bias)")
    out_bias: bool | None = Field(None, description="bias on the output projection (default: bias)")
    qk_norm: QKNorm | None = Field(None, description="RMSNorm over each head's q and k before the rotation (Qwen3)")
    output_gate: Annotated[bool, Since("0.6")] = Field(
        False, description="gated attention (Qwen3-Next): the query projection also gives each head a gate, and the "
        "attention output is multiplied by sigmoid(gate) before the output projection")
    positional: Positional = Field(default_factory=lambda: family("positional").members["rope"]())
    sparsity: Sparsity = Field(default_factory=lambda: family("sparsity").members["dense"]())

    def fill_defaults(self, d_model: int) -> None:
        # Written into the spec so that the explicit and the omitted forms hash alike. `bias` is then normalised to
        # "both projections have a bias", so {bias: true} and {qkv_bias: true, out_bias: true} are one model.
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.head_dim is None and d_model % self.n_heads == 0:
            object.__setattr__(self, "head_dim", d_model // self.n_heads)
        if self.qkv_bias is None:
            object.__setattr__(self, "qkv_bias", self.bias)
        if self.out_bias is None:
            object.__setattr__(self, "out_bias", self.bias)
        object.__setattr__(self, "bias", bool(self.qkv_bias and self.out_bias))

    def problems(self, m: Any, path: tuple[str, ...]) -> list:
        d_model, out = m.d_model, []
        if self.n_kv_heads is not None and (self.n_kv_heads > self.n_heads or self.n_heads % self.n_kv_heads):
            out.append((path + ("n_kv_heads",), f"must divide n_heads ({self.n_heads}), got {self.n_kv_heads}",
                        self.n_kv_heads))
        if self.head_dim is None:
            out.append((path + ("n_heads",), f"must divide d_model ({d_model}) when head_dim is not given, got "
                        f"{self.n_heads}; set head_dim or pick n_heads in {_divisors(d_model)}", self.n_heads))
        else:
            width = self.head_dim * self.n_heads
            if width > 8 * d_model:
                out.append((path + ("head_dim",), f"n_heads·head_dim ({self.n_heads}·{self.head_dim} = {width}) must "
                            f"be at most 8·d_model ({8 * d_model})", self.head_dim))
            if self.head_dim > MAX_HEAD_DIM:
                out.append((path + ("head_dim",), f"must be at most {MAX_HEAD_DIM}, got {self.head_dim} (d_model // "
                            "n_heads when not given: raise n_heads or set head_dim)", self.head_dim))
        return out

    # ── tensor parallelism (archspec.train.tensor_parallel) ──
    def tensor_parallel(self, m: Any) -> TPPlan:
        """Split by heads: rank r computes query heads r·N_HEADS/tp onwards and the K/V heads they share (GQA groups
        stay whole), so attention itself needs no communication. The fused qkv_proj is colwise by parts: q, k and v
        each split by heads, rank r holding [q_r | k_r | v_r] (archspec.train.tensor_parallel permutes its rows in
        memory so that each rank's slice is contiguous, and converts back at the checkpoint boundary); o_proj rowwise,
        reduce-scattered over the sequence. A per-head q/k norm works on each rank's heads, its gain replicated."""
        if self.qk_norm is not None and self.qk_norm.scope == "projection":
            return TPPlan(refused=(("qk_norm", "scope"), "projection normalises q and k over all heads at once, and "
                                   "tensor parallelism puts the heads on different processes (no reduction is done); "
                                   "use scope: head, or tp 1"))
        if self.sinks:
            return TPPlan(refused=(("sinks",), "the sink logits are per head and tensor parallelism does not split "
                                   "them with the heads yet; use sinks: false, or tp 1"))
        splits = {"": Split("gather"), "qkv_proj": Split("colwise", parts=(self.q_proj_width, self.kv_width,
                                                                          self.kv_width)),
                  "o_proj": Split("rowwise")}
        if self.qk_norm is not None:  # on (B, heads, T, HEAD_DIM): each rank's heads, dim 1
            splits |= {"q_norm": Split("sequence", dim=1), "k_norm": Split("sequence", dim=1)}
        return TPPlan(splits, sliced={"heads": self.n_heads} if type(self.positional).per_head else {},
                      divides=(Divides(("n_heads",), self.n_heads, "n_heads"),
                               Divides(("n_kv_heads",), self.n_kv_heads, "n_kv_heads")))

    # ── what the other units and the accounting ask every attention kind (archspec.kinds.base.AttentionKind) ──
    @property
    def rotary_kv_heads(self) -> int:
        return self.n_kv_heads

    @property
    def mean_head_dim(self) -> float:
        return self.head_dim

    def saved_widths(self) -> tuple[int, int]:
        """(attention output width, what the projections leave alive for backward) per token (archspec.memory):
        one qkv projection, v a view of it, so the whole output stays alive (with `output_gate`: the gate in it, and
        the gated output, which the output projection keeps beside the attention output)."""
        if self.output_gate:
            return self.q_width, self.q_proj_width + 2 * self.kv_width + self.q_width
        return self.q_width, self.q_width + 2 * self.kv_width

    def attention_io_elements(self) -> int:
        """Per token: q, k, v and the output of the attention product (what a kernel that recomputes scores keeps)."""
        return (2 * self.n_heads + 2 * self.n_kv_heads) * self.head_dim

    def heads_summary(self) -> str:
        return f"{self.layout} {self.n_heads}/{self.n_kv_heads} heads" + (" with sinks" if self.sinks else "")

    def doc_summary(self) -> str:
        return f"{self.n_heads} heads ({self.n_kv_heads} KV heads, {self.layout})"

    # ── accounting ──
    @property
    def q_width(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def q_proj_width(self) -> int:
        """Rows of the query part of qkv_proj: the queries, and with `output_gate` each head's gate beside its query."""
        return 2 * self.q_width if self.output_gate else self.q_width

    # The width a positional kind rotates within (rope: the first int(partial · rotary_width) dimensions of each
    # head), and the constant the generated file calls it by. An attention kind with a separate rope part (MLA's
    # qk_rope_head_dim) gives that part's width and name instead.
    @property
    def rotary_width(self) -> int | None:
        return self.head_dim

    rotary_width_name: ClassVar[str] = "HEAD_DIM"

    def params(self, d_model: int) -> int:
        weights = d_model * self.q_proj_width + 2 * d_model * self.kv_width + self.q_width * d_model
        biases = (self.q_proj_width + 2 * self.kv_width if self.qkv_bias else 0) + (d_model if self.out_bias else 0)
        return weights + biases + (self.qk_norm.params(self.q_width, self.kv_width, self.head_dim) if self.qk_norm
                                   else 0) + self.sink_params()

    def projection_flops(self, d_model: int) -> int:
        return 2 * (d_model * self.q_proj_width + 2 * d_model * self.kv_width + self.q_width * d_model)

    def score_flops(self, seq_len: int, full_attention: bool = False) -> float:
        """QKᵀ and AV per token: each 2 · head_dim · keys per query head (keys: the pattern's mean key count)."""
        keys = float(seq_len) if full_attention else self.sparsity.keys(seq_len)
        return 2 * 2 * self.n_heads * self.head_dim * keys

    def kv_cache_elements_per_token(self) -> int:
        return 2 * self.n_kv_heads * self.head_dim  # K and V

    def kv_cache_elements_per_sequence(self, seq_len: int) -> int:
        """K and V of one sequence of `seq_len` tokens, as this layer's cache holds them: a window layer keeps at most
        its window (the pattern's `cached_positions`)."""
        return self.kv_cache_elements_per_token() * self.sparsity.cached_positions(seq_len)

    # ── codegen ──
    @property
    def layout(self) -> str:
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"

    def constants(self, m: Any) -> list[Const]:
        return [
            Const("N_HEADS", lit_int(self.n_heads), "query heads"),
            Const("N_KV_HEADS", lit_int(self.n_kv_heads), {
                "MHA": "= N_HEADS: multi-head attention",
                "MQA": "1: multi-query attention, one K/V head for all queries",
                "GQA": f"grouped-query attention, {self.n_heads // self.n_kv_heads} query heads per K/V head",
            }[self.layout]),
            Const("HEAD_DIM", lit_int(self.head_dim)),
            Const("QKV_BIAS", lit_bool(self.qkv_bias), "bias on the q, k, v projections"),
            Const("OUT_BIAS", lit_bool(self.out_bias), "bias on the output projection"),
        ] + ([Const("QK_NORM_EPS", lit_float(self.qk_norm.eps), "RMSNorm over each head's q and k"
                    if self.qk_norm.scope == "head" else "RMSNorm over the whole q and k projections")]
             if self.qk_norm else []) + self.score_constants(m)

    def template_context(self, m: Any) -> dict[str, Any]:
        return {"layout": self.layout, "gqa": self.n_kv_heads != self.n_heads,
                "first_head": type(self.positional).per_head,
                "qkv_bias": bool(self.qkv_bias), "out_bias": bool(self.out_bias), "qk_norm": self.qk_norm is not None,
                "qk_norm_projection": self.qk_norm is not None and self.qk_norm.scope == "projection",
                "output_gate": self.output_gate, **self.score_context(m)}

    # ── testing ──
    @classmethod
    def strategy(cls, ctx):
        """Heads and widths as a layer group writes them (archspec.testing.attentions draws the model-wide one):
        head_dim the `rotary_width` asked for, when asked."""
        from hypothesis import strategies as st

        @st.composite
        def draw(draw):
            n_heads = draw(st.integers(1, max(1, min(4, ctx.get("max_heads", 4)))))
            head_dim = ctx.get("rotary_width") or ctx.get("head_dim_multiple", 2) * draw(st.integers(1, 8))
            out = {"n_heads": n_heads, "head_dim": head_dim,
                   "n_kv_heads": draw(st.sampled_from([k for k in range(1, n_heads + 1) if n_heads % k == 0]))}
            if draw(st.booleans()):
                out["bias"] = draw(st.booleans())
            return {**out, **score_strategy(draw)}

        return draw()

    # ── HF transformers interop (archspec.kinds.hf) ──
    hf_block = "attention"  # what every model type archspec maps but deepseek_v3 has

    @classmethod
    def from_hf(cls, cfg) -> dict[str, Any]:
        """Heads, K/V heads, head width, biases and q/k norm; positional and sparsity come from their own units."""
        d_model, n_heads = cfg.take("d_model", int), cfg.take("n_heads", int)
        n_kv_heads = cfg.take("n_kv_heads", int, default=n_heads) if "n_kv_heads" in cfg.hf.keys else n_heads
        head_dim = cfg.take("head_dim", int, default=d_model // n_heads) if "head_dim" in cfg.hf.keys else None
        out = {"n_heads": n_heads, "n_kv_heads": n_kv_heads, "head_dim": head_dim or d_model // n_heads,
               "qkv_bias": cfg.fact("qkv_bias"), "out_bias": cfg.fact("out_bias")}
        if cfg.fact("output_gate"):  # Qwen3-Next: q_proj gives each head's query and its output gate
            out["output_gate"] = True
        if cfg.fact("qk_norm"):
            out["qk_norm"] = {"eps": cfg.take("norm_eps", float)}  # Qwen3: the model's rms_norm_eps
            if cfg.fact("qk_norm_projection"):  # OLMo 2: over all heads' q and k at once
                out["qk_norm"]["scope"] = "projection"
        return {**out, **cls.scores_from_hf(cfg)}

    def to_hf(self, m: Any, out: dict[str, Any], hf: Any, path: tuple[str, ...] = ()) -> None:
        path = ("model", "attention")
        out[hf.keys["n_heads"]] = self.n_heads
        for field, key in (("n_kv_heads", "n_kv_heads"), ("head_dim", "head_dim")):
            value, implied = getattr(self, field), (self.n_heads if field == "n_kv_heads" else m.d_model // self.n_heads)
            if key in hf.keys:
                out[hf.keys[key]] = value
            elif value != implied:
                raise HFUnsupported(f"{'.'.join((*path, field))}: {value} cannot be expressed as {hf.model_type} "
                                    f"(it has {implied})")
        self.scores_to_hf(out, hf, path)
        put_fact(out, hf, "qkv_bias", self.qkv_bias, (*path, "qkv_bias"))
        put_fact(out, hf, "out_bias", self.out_bias, (*path, "out_bias"))
        put_fact(out, hf, "qk_norm", self.qk_norm is not None, (*path, "qk_norm"))
        put_fact(out, hf, "output_gate", self.output_gate, (*path, "output_gate"))  # Qwen3-Next: always gated
        if self.qk_norm is not None:
            put_fact(out, hf, "qk_norm_projection", self.qk_norm.scope == "projection", (*path, "qk_norm", "scope"))
        if self.qk_norm is not None and self.qk_norm.eps != out.get(hf.keys["norm_eps"]):
            raise HFUnsupported(f"model.attention.qk_norm.eps: {self.qk_norm.eps} cannot be expressed as "
                                f"{hf.model_type} (its q/k norm uses {hf.keys['norm_eps']}, here "
                                f"{out.get(hf.keys['norm_eps'])})")

    def hf_weights(self, m: Any, hf: Any) -> list[HFWeight]:  # noqa: D417
        """Our fused qkv_proj is HF's c_attn (GPT-2, Conv1D) or its q_proj, k_proj, v_proj stacked by rows."""
        names = hf.names
        if "qkv" in names and hf.facts.get("qkv_per_head"):  # GPT-NeoX, BLOOM: rows by head, (q, k, v) in each
            sizes, heads = (self.q_width, self.kv_width, self.kv_width), self.n_heads
            out = [HFWeight("qkv_proj.weight", (f"{names['qkv']}.weight",), sizes, per_head=heads)]
            if self.qkv_bias:
                out.append(HFWeight("qkv_proj.bias", (f"{names['qkv']}.bias",), sizes, per_head=heads))
        elif "qkv" in names:
            out = linear("qkv_proj", names["qkv"], self.qkv_bias, hf.conv1d)
        else:
            sizes = (self.q_proj_width, self.kv_width, self.kv_width)  # a gate: q_proj's rows hold each head's too
            parts = tuple(names.get(p, f"{p}_proj") for p in "qkv")
            out = [HFWeight("qkv_proj.weight", tuple(f"{p}.weight" for p in parts), sizes, hf.conv1d)]
            if self.qkv_bias:
                out.append(HFWeight("qkv_proj.bias", tuple(f"{p}.bias" for p in parts), sizes))
        out += linear("o_proj", names.get("o", "o_proj"), self.out_bias, hf.conv1d)
        if self.sinks:  # gpt-oss: self_attn.sinks, one logit per query head
            out.append(HFWeight("sinks", (names.get("sinks", "sinks"),)))
        if self.qk_norm is not None:
            offset = 1.0 if hf.facts.get("qk_norm_unit_offset") else 0.0  # Qwen3-Next stores w of (1 + w)
            out += [HFWeight(f"{p}_norm.weight", (f"{names.get(f'{p}_norm', f'{p}_norm')}.weight",), offset=offset)
                    for p in "qk"]
        return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, min(n, 64) + 1) if n % d == 0]


bind("positional", AttentionSpec, "positional")
bind("sparsity", AttentionSpec, "sparsity")
