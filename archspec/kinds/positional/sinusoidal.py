"""Fixed sinusoidal positions (Vaswani et al., 2017), added to the token embeddings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from archspec.kinds.base import Const, PositionalKind, Split, TPPlan, lit_float, register
from archspec.kinds.limits import MAX_WIDTH


@register
class SinusoidalPositional(PositionalKind):
    kind: Literal["sinusoidal"] = "sinusoidal"  # fixed table from "Attention Is All You Need", added to embeddings
    base: float = Field(10000.0, gt=1.0, le=1e9)
    # The paper also multiplies token embeddings by sqrt(d_model) before adding the table; that is the model option
    # `model.embedding_scale: sqrt_d_model`, not this kind's: without it, N(0, 0.02) embeddings are swamped by the
    # table's unit-amplitude sinusoids (measured: docs/ABLATIONS.md). `scale_embeddings` is its old spelling here:
    # read, mapped onto the model option with a note, never written (so both spellings give one hash).
    scale_embeddings: bool | None = Field(None, exclude=True, description="old spelling of model.embedding_scale "
                                          "(true: sqrt_d_model, false: none); loaded with a note")

    def tensor_parallel(self, m):
        """Names inside the Model (its `positions` module): the sequence gathered around it; the table is a buffer."""
        return TPPlan({"positions": Split("around")})

    def model_options(self, m, written):
        if self.scale_embeddings is None:
            if "embedding_scale" in written:
                return {}, []
            return {}, ["model.attention.positional: sinusoidal positions no longer scale the token embeddings "
                        "themselves (before, they did unless told not to); this model does not scale them. For the "
                        "paper's sqrt(d_model) scaling write model.embedding_scale: sqrt_d_model"]
        old, new = self.scale_embeddings, "sqrt_d_model" if self.scale_embeddings else "none"
        object.__setattr__(self, "scale_embeddings", None)
        return {"embedding_scale": new}, [
            f"model.attention.positional.scale_embeddings: {str(old).lower()} is now model.embedding_scale: {new} "
            "(embedding scaling is a model option of its own, independent of the positional kind); loaded as that"]

    def problems(self, m, path):
        if m.d_model % 2:
            return [(("model", "d_model"), f"must be even for sinusoidal positions, got {m.d_model}", m.d_model)]
        return []

    def constants(self, m) -> list[Const]:
        return [Const("SINUSOID_BASE", lit_float(self.base))]

    def describe(self, m) -> str:
        return "sinusoidal positions"

    def buffer_elements(self, m) -> int:
        return m.context_length * m.d_model

    @classmethod
    def strategy(cls, ctx):
        return super().strategy(ctx) if ctx["d_model"] % 2 == 0 else None  # sin/cos pairs need an even width

    @classmethod
    def invalid_cases(cls):
        return {"even_d_model": _odd_d_model}


def _odd_d_model(draw, data, spec):
    """Sinusoidal positions on an odd width (the table interleaves sin/cos pairs): blamed on d_model."""
    m = spec.model
    if m.d_model % 2 == 0 and m.d_model + 1 > MAX_WIDTH:
        return None
    data["model"]["d_model"] = m.d_model + (m.d_model % 2 == 0)
    att = data["model"].setdefault("attention", {})
    att["positional"] = {"kind": "sinusoidal"}
    if "head_dim" in type(m.attention).model_fields:
        att["head_dim"] = m.attention.head_dim  # keep the heads valid at the new width
    return ("model", "d_model")
