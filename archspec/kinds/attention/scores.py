"""What an attention kind may do to its scores before the softmax, shared by the kinds that take it (gqa, mla):
`softcap` (Gemma 2: scores ← cap · tanh(scores / cap)) and `scale` (the softmax scale; null: 1/sqrt(the q·k
width); Gemma 2: query_pre_attn_scalar ** -0.5) and `sinks` (gpt-oss: a learned logit per head that joins each
softmax's denominator, a parameter `sinks` of N_HEADS). With the positional kind's bias (ALiBi's `score_args`) they
reach the sparsity's `attend` hook as keyword arguments of the runtime's kernels (`scores`); a layer that caps or
biases its scores, or has sinks, takes `score_mod_attention` on the dense path (SDPA can do none of them), and only
such a layer."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import Field

from archspec.kinds.base import Const, Since, Strict, lit_float

MAX_SOFTCAP = 1e4  # tanh(s / 1e4) · 1e4 is s to fp32 precision for any score a model reaches: no cap in effect
MAX_SCALE = 1e3


class ScoreOptions(Strict):
    """The `softcap` and `scale` fields of an attention kind, their constants and the kernels' keyword arguments."""

    softcap: Annotated[float | None, Since("0.4")] = Field(
        None, gt=0.0, le=MAX_SOFTCAP, description="scores ← softcap · tanh(scores / softcap) before the softmax "
        "(Gemma 2's attn_logit_softcapping); null: no cap")
    scale: Annotated[float | None, Since("0.4")] = Field(
        None, gt=0.0, le=MAX_SCALE, description="the softmax scale; null: 1/sqrt(head_dim) (Gemma 2: "
        "query_pre_attn_scalar ** -0.5)")
    sinks: Annotated[bool, Since("0.6")] = Field(
        False, description="attention sinks (gpt-oss): a learned logit per query head that joins every softmax's "
        "denominator as a column with no value, so a query may attend to nothing")

    takes_score_mods: ClassVar[bool] = True  # its template passes `scores` to every attention path it has

    def effective_scale(self, m: Any) -> float | None:
        """The softmax scale every attention path of this layer takes as ATTN_SCALE; None: SDPA's 1/sqrt(score_width).
        An explicit `scale` wins; else µP (model.parametrization: mup) scores by 1/score_width, so that the logits of
        correlated q and k stay Θ(1) as heads widen (Yang et al. 2022, §C)."""
        if self.scale is not None:
            return self.scale
        return 1.0 / self.score_width if m.parametrization == "mup" else None

    def sink_params(self) -> int:
        """The sink logits: one per query head."""
        return self.n_heads if self.sinks else 0

    def score_constants(self, m: Any) -> list[Const]:
        out = []
        if self.scale is not None:
            out.append(Const("ATTN_SCALE", lit_float(self.scale), f"softmax scale (not 1/sqrt({self.score_width_name}))"))
        elif self.effective_scale(m) is not None:
            out.append(Const("ATTN_SCALE", lit_float(self.effective_scale(m)), f"µP: scores times "
                             f"1/{self.score_width_name}, not 1/sqrt({self.score_width_name})"))
        if self.softcap is not None:
            out.append(Const("ATTN_SOFTCAP", lit_float(self.softcap),
                             "scores <- ATTN_SOFTCAP * tanh(scores / ATTN_SOFTCAP) before the softmax"))
        return out

    def score_context(self, m: Any) -> dict[str, Any]:
        """`scores`: the keyword arguments every attention kernel call of this layer takes (the file's constants and
        the positional kind's, and the module's sink logits); `score_mod`: whether SDPA cannot serve the dense path
        (a cap, a bias or sinks); `sinks`: whether the module holds sink logits."""
        bias = type(self.positional).score_args
        scaled = self.effective_scale(m) is not None
        kwargs = (", scale=ATTN_SCALE" if scaled else "") + (
            ", softcap=ATTN_SOFTCAP" if self.softcap is not None else "") + bias + (
            ", sinks=self.sinks" if self.sinks else "")
        return {"scores": kwargs, "score_mod": self.softcap is not None or bool(bias) or self.sinks,
                "sdpa_scale": ", scale=ATTN_SCALE" if scaled else "", "sinks": self.sinks,
                "score_changes": ", ".join(what for what, on in (("ALiBi's bias", bool(bias)),
                                                                 ("the cap", self.softcap is not None),
                                                                 ("each head's sink logit", self.sinks)) if on)}

    def score_mod_kept_bytes(self, m: Any, seq_len: int, mm: int) -> int | None:
        """Per token, what a dense layer on the score_mod path keeps for backward (archspec.memory): its q, k, v and
        output, and per query head a row of seq_len scores three times in fp32 (scaled, capped or biased, masked) and
        once as probabilities in the matmul dtype; None where the layer keeps SDPA."""
        if not self.score_context(m)["score_mod"] or self.sparsity.blockwise_kept_bytes(m, mm) is not None:
            return None  # SDPA, or a sparse pattern (its blockwise path and FlexAttention recompute the scores)
        return self.attention_io_elements() * mm + self.n_heads * seq_len * (3 * 4 + mm)

    @staticmethod
    def scores_from_hf(cfg: Any) -> dict[str, Any]:
        """Import: softcap and scale from the config keys of roles `attn_softcap` and `attn_scale`, where the model
        type has them (MPT's attn_config.softmax_scale); null there means ours."""
        out = {}
        for field, role in (("softcap", "attn_softcap"), ("scale", "attn_scale")):
            if role in cfg.hf.keys:
                value = cfg.take(role, (float, type(None)), default=None)
                if value is not None:
                    out[field] = value
        if cfg.fact("sinks"):  # gpt-oss: every attention layer has them
            out["sinks"] = True
        return out

    def scores_to_hf(self, out: dict[str, Any], hf: Any, path: tuple[str, ...]) -> None:
        """Export: written where the model type has the key; else refused unless off (no cap, 1/sqrt(head_dim))."""
        from archspec.kinds.hf import HFUnsupported, put_fact

        put_fact(out, hf, "sinks", self.sinks, (*path, "sinks"))
        for field, role in (("softcap", "attn_softcap"), ("scale", "attn_scale")):
            if role in hf.keys:
                out[hf.keys[role]] = getattr(self, field)
            elif getattr(self, field) is not None:
                raise HFUnsupported(f"{'.'.join((*path, field))}: {getattr(self, field)} cannot be expressed as "
                                    f"{hf.model_type} (its attention has no {'cap' if field == 'softcap' else 'other scale'})")

    def describe_scores(self) -> str:
        parts = ([f"scores capped at {self.softcap:g}"] if self.softcap is not None else []) + (
            [f"softmax scale {self.scale:g}"] if self.scale is not None else []) + (["sinks"] if self.sinks else [])
        return ", ".join(parts)


def score_strategy(draw) -> dict[str, Any]:
    """softcap and scale as the strategies write them: absent, null, or a value over a range a model meets (small
    caps do cap, large ones nearly not)."""
    from hypothesis import strategies as st

    return draw(st.fixed_dictionaries({}, optional={
        "softcap": st.one_of(st.none(), st.floats(0.05, 100.0)),
        "scale": st.one_of(st.none(), st.floats(0.01, 4.0)),
        "sinks": st.booleans(),
    }))
