"""Multi-head latent attention (MLA; DeepSeek-V2, arXiv:2405.04434; DeepSeek-V3, arXiv:2412.19437), as transformers'
deepseek_v3 computes it.

Keys and values come from one low-rank latent per token: x → (c_kv, k_pe) = kv_a_proj(x), c_kv RMS-normalised
(KV_LORA_RANK wide), then kv_b_proj(c_kv) → each head's k_nope (QK_NOPE_HEAD_DIM) and v (V_HEAD_DIM). Positions
reach attention through a decoupled part: k_pe (QK_ROPE_HEAD_DIM) is one key shared by every head, and each query
head has a q_pe of that width; the positional unit rotates only those (`rotary_width`). A head's key is
[k_nope, k_pe], its query [q_nope, q_pe]; the query comes from a full projection (q_lora_rank null) or through a
low-rank latent of its own with its RMSNorm (q_lora_rank set). The KV cache holds c_kv (after its norm) and the
rotated k_pe only: (KV_LORA_RANK + QK_ROPE_HEAD_DIM) elements per token and layer, whatever the head count.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from archspec.kinds.base import (EPS_MIN, AttentionKind, Const, Since, bind, family, lit_float, lit_int,
                                 register)
from archspec.kinds.attention.scores import ScoreOptions, score_strategy
from archspec.kinds.hf import HFUnsupported, HFWeight
from archspec.kinds.limits import MAX_HEAD_DIM, MAX_HEADS, MAX_WIDTH

Positional = family("positional").union()
Sparsity = family("sparsity").union()


@register
class MLASpec(ScoreOptions, AttentionKind):
    kind: Literal["mla"] = "mla"
    prefix = "Latent"
    rotary_field = "qk_rope_head_dim"
    rotary_width_name: ClassVar[str] = "HEAD_DIM"  # the constant the rope template reads: = QK_ROPE_HEAD_DIM here (see constants)
    n_heads: int = Field(8, ge=1, le=MAX_HEADS)
    q_lora_rank: int | None = Field(None, ge=1, le=MAX_WIDTH,
                                    description="the query's low-rank latent width; null: a full query projection")
    kv_lora_rank: int = Field(512, ge=1, le=MAX_WIDTH, description="the shared key/value latent's width (cached)")
    qk_nope_head_dim: int = Field(128, ge=1, le=MAX_HEAD_DIM, description="each head's q/k width without positions")
    qk_rope_head_dim: int = Field(64, ge=1, le=MAX_HEAD_DIM,
                                  description="the decoupled positional part: one key for all heads (cached)")
    v_head_dim: int = Field(128, ge=1, le=MAX_HEAD_DIM)
    norm_eps: float = Field(1e-6, ge=EPS_MIN, le=0.1, description="eps of the latents' RMSNorms (transformers: 1e-6)")
    positional: Positional = Field(default_factory=lambda: family("positional").members["rope"]())
    sparsity: Sparsity = Field(default_factory=lambda: family("sparsity").members["dense"]())

    # ── rules ──
    def problems(self, m: Any, path: tuple[str, ...]) -> list:
        out, d = [], m.d_model
        # qk_rope_head_dim's parity under rope is the rope unit's rule (at `rotary_field`).
        for field, width in (("qk_nope_head_dim", self.qk_head_dim), ("v_head_dim", self.v_head_dim)):
            if self.n_heads * width > 8 * d:
                out.append((path + (field,), f"n_heads·{'(qk_nope_head_dim + qk_rope_head_dim)' if field[1] == 'k' else 'v_head_dim'} "
                            f"({self.n_heads}·{width} = {self.n_heads * width}) must be at most 8·d_model ({8 * d})",
                            getattr(self, field)))
        if self.qk_head_dim > MAX_HEAD_DIM:
            out.append((path + ("qk_nope_head_dim",), f"qk_nope_head_dim + qk_rope_head_dim must be at most "
                        f"{MAX_HEAD_DIM}, got {self.qk_head_dim}", self.qk_nope_head_dim))
        return out

    @property
    def softmax_mscale(self) -> float:
        """DeepSeek's softmax scale under yarn: 1/sqrt(QK_HEAD_DIM) times yarn_mscale(factor, mscale_all_dim)² when the
        rope is yarn-scaled with mscale_all_dim set (transformers' `yarn_apply_mscale`), else 1."""
        scaling = getattr(self.positional, "scaling", None)
        if getattr(scaling, "kind", None) != "yarn" or not scaling.mscale_all_dim:
            return 1.0
        from archspec.kinds.positional.rope import yarn_mscale

        return yarn_mscale(scaling.factor, scaling.mscale_all_dim) ** 2

    # ── what every attention kind says (archspec.kinds.base.AttentionKind) ──
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def rotary_width(self) -> int:
        return self.qk_rope_head_dim

    @property
    def rotary_kv_heads(self) -> int:
        return 1  # one rope key for all heads

    @property
    def mean_head_dim(self) -> float:
        return (self.qk_head_dim + self.v_head_dim) / 2

    score_width_name: ClassVar[str] = "QK_HEAD_DIM"  # the scores sum over the nope and rope parts

    @property
    def score_width(self) -> int:
        return self.qk_head_dim

    @property
    def cache_class(self) -> str:
        return "LatentCache" if self.sparsity.cache_class == "KVCache" else "RollingLatentCache"

    def class_label(self) -> str:
        return self.class_prefix() + type(self.sparsity).class_prefix()

    def attention_io_elements(self) -> int:
        return 2 * self.n_heads * (self.qk_head_dim + self.v_head_dim)  # q, k (every head's), v, the output

    def heads_summary(self) -> str:
        q = f"q rank {self.q_lora_rank}, " if self.q_lora_rank else ""
        return f"MLA {self.n_heads} heads ({q}kv rank {self.kv_lora_rank})"

    def doc_summary(self) -> str:
        q = f"query latent {self.q_lora_rank}, " if self.q_lora_rank else ""
        return (f"{self.n_heads} heads of multi-head latent attention ({q}KV latent {self.kv_lora_rank} + rope key "
                f"{self.qk_rope_head_dim} cached)")

    def saved_widths(self) -> tuple[int, int]:
        """Per token: the output (N_HEADS·V_HEAD_DIM), and what the projections leave for backward: the query latent
        and its norm, q, the KV latent and its norm, kv_b's output, and the concatenated q and k."""
        H = self.n_heads
        q_latent = 2 * self.q_lora_rank if self.q_lora_rank else 0
        alive = (q_latent + H * self.qk_head_dim + self.kv_lora_rank + self.qk_rope_head_dim + self.kv_lora_rank
                 + H * (self.qk_nope_head_dim + self.v_head_dim) + 2 * H * self.qk_head_dim)
        return H * self.v_head_dim, alive

    # ── accounting ──
    def _weights(self, d: int) -> int:
        H = self.n_heads
        q = d * H * self.qk_head_dim if self.q_lora_rank is None else (
            d * self.q_lora_rank + self.q_lora_rank * H * self.qk_head_dim)
        kv = d * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * H * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + H * self.v_head_dim * d

    def params(self, d_model: int) -> int:
        return (self._weights(d_model) + self.kv_lora_rank + (self.q_lora_rank or 0)  # + the latents' norm weights
                + self.sink_params())

    def projection_flops(self, d_model: int) -> int:
        return 2 * self._weights(d_model)

    def score_flops(self, seq_len: int, full_attention: bool = False) -> float:
        """QKᵀ at qk_nope + qk_rope per head and AV at v_head_dim, per key (the pattern's mean key count)."""
        keys = float(seq_len) if full_attention else self.sparsity.keys(seq_len)
        return 2 * self.n_heads * (self.qk_head_dim + self.v_head_dim) * keys

    def kv_cache_elements_per_token(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim  # the normalised latent and the rotated rope key

    def kv_cache_elements_per_sequence(self, seq_len: int) -> int:
        return self.kv_cache_elements_per_token() * self.sparsity.cached_positions(seq_len)

    # ── codegen ──
    def constants(self, m: Any) -> list[Const]:
        return [
            Const("N_HEADS", lit_int(self.n_heads), "query heads; each reads the one shared latent"),
            *([Const("Q_LORA_RANK", lit_int(self.q_lora_rank), "the query's low-rank latent")]
              if self.q_lora_rank else []),
            Const("KV_LORA_RANK", lit_int(self.kv_lora_rank), "the key/value latent: what the cache holds per token"),
            Const("QK_NOPE_HEAD_DIM", lit_int(self.qk_nope_head_dim), "each head's q/k width that positions skip"),
            Const("QK_ROPE_HEAD_DIM", lit_int(self.qk_rope_head_dim), "the decoupled positional width: one key for "
                  "all heads"),
            Const("QK_HEAD_DIM", lit_int(self.qk_head_dim), "QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM"),
            Const("V_HEAD_DIM", lit_int(self.v_head_dim)),
            # The width the positional unit works in: only the decoupled part carries positions.
            Const("HEAD_DIM", lit_int(self.rotary_width), "= QK_ROPE_HEAD_DIM: the width positions are applied to"),
            Const("LATENT_NORM_EPS", lit_float(self.norm_eps), "RMSNorm of the latents"),
        ] + ([Const("SOFTMAX_MSCALE", lit_float(self.softmax_mscale), "yarn: the softmax scale times "
                    "yarn_mscale(factor, mscale_all_dim)² (DeepSeek-V3)")] if self.softmax_mscale != 1.0 else []
        ) + self.score_constants(m)

    def describe(self, m: Any) -> str:
        return "multi-head latent attention"

    def template_context(self, m: Any) -> dict[str, Any]:
        return {"gqa": False, "q_lora": self.q_lora_rank is not None, "mscale": self.softmax_mscale != 1.0,
                "rolling": self.sparsity.cache_class != "KVCache", "first_head": type(self.positional).per_head,
                "v_head_dim": "V_HEAD_DIM",  # what attention returns per head (the sparsity patterns' shape comments)
                **self.score_context(m)}

    # ── HF transformers interop (archspec.kinds.hf): transformers' deepseek_v3 ──
    hf_block = "latent_attention"

    @classmethod
    def from_hf(cls, cfg) -> dict[str, Any]:
        n_heads = cfg.take("n_heads", int)
        n_kv = cfg.take("n_kv_heads", int, default=n_heads) if "n_kv_heads" in cfg.hf.keys else n_heads
        if n_kv != n_heads:  # transformers' MLA reads it only to repeat K/V heads it never has fewer of
            raise cfg.refuse("n_kv_heads", f"{n_kv}: multi-head latent attention has one K/V head per query head")
        for fact in ("qkv_bias", "out_bias"):
            if cfg.fact(fact):
                spelled = cfg.hf.facts.get(fact)
                raise cfg.refuse(spelled if isinstance(spelled, str) else fact,
                                 "true: biases on the latent projections; archspec's mla has none")
        q_rank = cfg.take("q_lora_rank", (int, type(None)), default=None)
        out = {"kind": "mla", "n_heads": n_heads, "q_lora_rank": q_rank,
               "kv_lora_rank": cfg.take("kv_lora_rank", int), "qk_nope_head_dim": cfg.take("qk_nope_head_dim", int),
               "qk_rope_head_dim": cfg.take("qk_rope_head_dim", int), "v_head_dim": cfg.take("v_head_dim", int)}
        # transformers saves what it derives: head_dim (the rotated width) and qk_head_dim (nope + rope)
        for key, implied in (("head_dim", out["qk_rope_head_dim"]),
                             ("qk_head_dim", out["qk_nope_head_dim"] + out["qk_rope_head_dim"])):
            cfg.mark(key)
            if cfg.data.get(key) is not None and cfg.data[key] != implied:
                raise cfg.refuse(key, f"{cfg.data[key]!r}, but the other widths imply {implied}")
        return out

    def to_hf(self, m: Any, out: dict[str, Any], hf: Any, path: tuple[str, ...] = ()) -> None:
        keys = hf.keys
        if "kv_lora_rank" not in keys:
            raise HFUnsupported(f"model.attention.kind: mla cannot be expressed as {hf.model_type}")
        if self.norm_eps != 1e-6:
            raise HFUnsupported(f"model.attention.norm_eps: {self.norm_eps} cannot be expressed as {hf.model_type} "
                                "(its latent norms use 1e-6)")
        self.scores_to_hf(out, hf, ("model", "attention"))
        out[keys["n_heads"]] = self.n_heads
        if "n_kv_heads" in keys:
            out[keys["n_kv_heads"]] = self.n_heads
        for f in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            out[keys[f]] = getattr(self, f)
        for fact in ("qkv_bias", "out_bias"):
            if isinstance(hf.facts.get(fact), str):
                out[hf.facts[fact]] = False

    def hf_weights(self, m: Any, hf: Any) -> list[HFWeight]:
        q = ([HFWeight("q_proj.weight", ("q_proj.weight",))] if self.q_lora_rank is None else
             [HFWeight("q_a_proj.weight", ("q_a_proj.weight",)), HFWeight("q_a_norm.weight", ("q_a_layernorm.weight",)),
              HFWeight("q_b_proj.weight", ("q_b_proj.weight",))])
        return q + [HFWeight("kv_a_proj.weight", ("kv_a_proj_with_mqa.weight",)),
                    HFWeight("kv_a_norm.weight", ("kv_a_layernorm.weight",)),
                    HFWeight("kv_b_proj.weight", ("kv_b_proj.weight",)), HFWeight("o_proj.weight", ("o_proj.weight",))
                    ] + ([HFWeight("sinks", ("sinks",))] if self.sinks else [])

    # ── testing ──
    @classmethod
    def strategy(cls, ctx):
        from hypothesis import strategies as st

        d, mult = ctx["d_model"], ctx.get("head_dim_multiple", 2)  # rope rotates pairs
        # a head's q/k is at least its rotated part (a layer group's: the other layers' width) and one more, and
        # n_heads of them fit 8·d_model (the rule above)
        least_rope = ctx.get("rotary_width", mult)
        max_heads = min(4, ctx.get("max_heads", 4), 8 * d // (least_rope + 1))
        if max_heads < 1:
            return st.nothing()

        @st.composite
        def draw(draw):
            n_heads = draw(st.integers(1, max_heads))
            limit = max(1, min(16, 8 * d // n_heads))
            if "rotary_width" in ctx:  # a layer group: as wide as the other layers' rotated part (one rotary table)
                rope, limit = ctx["rotary_width"], max(1, min(16, 8 * d // n_heads - ctx["rotary_width"]) + ctx["rotary_width"])
            else:
                rope = mult * draw(st.integers(1, max(1, min(8, (limit - 1) // mult) or 1)))
            out: dict[str, Any] = {"n_heads": n_heads, "kv_lora_rank": draw(st.integers(1, 24)),
                                   "qk_nope_head_dim": draw(st.integers(1, max(1, limit - rope))),
                                   "qk_rope_head_dim": rope, "v_head_dim": draw(st.integers(1, limit))}
            if draw(st.booleans()):
                out["q_lora_rank"] = draw(st.one_of(st.none(), st.integers(1, 24)))
            if draw(st.booleans()):
                out["norm_eps"] = draw(st.floats(1e-8, 0.1))
            return {**out, **score_strategy(draw)}

        return draw()

    @classmethod
    def invalid_cases(cls):
        return {"rope_width": _odd_rope_width}


def _odd_rope_width(draw, data, spec):
    """mla's decoupled rope part of odd width under rope (it rotates pairs): blamed on qk_rope_head_dim."""
    m = spec.model
    if m.attention.kind != "mla" or m.layers or type(m.attention.positional).head_dim_multiple < 2:
        return None
    att = data["model"]["attention"]
    att["qk_rope_head_dim"] = 2 * draw(__import__("hypothesis").strategies.integers(0, 3)) + 1
    positional = att.get("positional")
    if isinstance(positional, dict) and positional.get("partial", 1.0) != 1.0:  # a fraction may rotate an even part
        att["positional"] = {k: v for k, v in positional.items() if k != "partial"}  # of an odd width: whole heads
    return ("model", "attention", "qk_rope_head_dim")


bind("positional", MLASpec, "positional")
bind("sparsity", MLASpec, "sparsity")
