"""Flamingo's media input (Alayrac et al. 2022): gated cross-attention layers (GATED XATTN-DENSE) from the text to
media tokens, inserted in front of chosen blocks, and an optional Perceiver resampler that maps each media item's
features (any number of tokens) to a fixed number of media tokens. The media's features come in precomputed (by any
encoder, left out of the model): `model.media` says their width, the tokens per item the text attends to, how many
items a sequence may hold and the token that marks where each item sits in the text.

A GATED XATTN-DENSE layer (IDEFICS' IdeficsGatedCrossAttentionLayer, whose module names it keeps):
    x = x + tanh(alpha_cross_attn) · cross_attn(input_layernorm(x), media)
    x = x + tanh(alpha_dense) · mlp(post_attention_layernorm(x))
both alphas start at 0, so an untrained model is the language model alone. Which media a token sees: the
immediately preceding item (archspec.runtime.media). The layers sit beside the blocks (`xattn.<layer>`), not inside
them: a block's state_dict keys, and so every existing checkpoint, stay as they are.

The cross-attention unit is a token mixer (archspec.kinds.base.MixerKind: its parameters, FLOPs at a sequence length
and decoding state are what accounting reads) held by `model.media`, not a layer's mixer: it adds to a layer, it
does not replace the layer's own token mixer, so it is not registered in the layer families.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from archspec.kinds.base import Const, MixerKind, Strict, lit_int
from archspec.kinds.limits import MAX_HEAD_DIM, MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_WIDTH

MAX_MEDIA_TOKENS = 4096  # per item, into the resampler or the cross-attention
MAX_ITEMS = 256


class GatedCrossAttentionSpec(MixerKind):
    """`model.media.cross_attention`: where the gated cross-attention layers sit and their sizes."""

    every: int | None = Field(1, ge=1, le=MAX_LAYERS, description="a layer in front of blocks 0, every, 2·every, ... "
                              "(Flamingo: every block of the small model, IDEFICS' cross_layer_interval)")
    layers: list[int] | None = Field(None, description="or: in front of exactly these blocks (then every: null)")
    n_heads: int = Field(8, ge=1, le=MAX_HEADS)
    head_dim: int | None = Field(None, ge=1, le=MAX_HEAD_DIM, description="default d_model // n_heads")
    ffn_hidden: int | None = Field(None, ge=1, le=MAX_HIDDEN, description="the gated dense layer's SwiGLU width "
                                   "(default 4 · d_model)")

    attribute: ClassVar[str] = "xattn"
    component: ClassVar[str] = "cross_attention"
    base_class: ClassVar[str] = "GatedCrossAttention"
    section: ClassVar[str] = "media"
    template: ClassVar[str | None] = "cross_attention.py.j2"

    @classmethod
    def template_path(cls) -> Path:
        return Path(__file__).with_name(cls.template)  # one unit, no `kind`: it sits in no union

    def fill_defaults(self, m: Any) -> None:  # type: ignore[override]
        if self.head_dim is None and m.d_model % self.n_heads == 0:
            object.__setattr__(self, "head_dim", m.d_model // self.n_heads)
        if self.ffn_hidden is None:
            object.__setattr__(self, "ffn_hidden", 4 * m.d_model)

    def positions(self, n_layers: int) -> list[int]:
        """The blocks a cross-attention layer sits in front of."""
        if self.layers is not None:
            return sorted(set(self.layers))
        return list(range(0, n_layers, self.every or 1))

    def problems(self, m: Any, path: tuple[str, ...]) -> list:
        out = []
        if (self.every is None) == (self.layers is None):
            out.append((path + ("every",), "give one of every (a layer each `every` blocks) and layers (a list of "
                        "blocks); set the other to null", self.every))
        for i in self.layers or []:
            if not 0 <= i < m.n_layers:
                out.append((path + ("layers",), f"must be block indices below n_layers ({m.n_layers}), got {i}", i))
        if self.head_dim is None:
            out.append((path + ("n_heads",), f"must divide d_model ({m.d_model}) unless head_dim is given, got "
                        f"{self.n_heads}", self.n_heads))
        return out

    # ── the mixer contract ──
    @property
    def inner(self) -> int:
        return self.n_heads * (self.head_dim or 0)

    def mixer_params(self, m: Any) -> int:
        """One GATED XATTN-DENSE layer: q, o (d_model ↔ heads), k, v (media width → heads), the SwiGLU, two norms,
        two gates."""
        d, w, h = m.d_model, m.media.width, self.ffn_hidden
        norms = 2 * m.norm.params(d)
        return 2 * d * self.inner + 2 * w * self.inner + 3 * d * h + norms + 2

    def mixer_flops(self, m: Any, seq_len: int, full_attention: bool = False) -> dict[str, float]:
        """Per text token at `seq_len` text tokens and the most media a sequence holds (max_items · tokens): q and
        o projections, scores and values over every media token (what the masked kernel multiplies: a token sees one
        item's, the others are masked), the SwiGLU, and the media's k and v projections, made once per sequence and
        shared by its seq_len tokens."""
        d, w, s = m.d_model, m.media.width, m.media.max_items * m.media.tokens
        return {"cross_attention": 2 * 2 * d * self.inner + 2 * 2 * self.inner * s + 2 * 3 * d * self.ffn_hidden
                + 2 * 2 * w * self.inner * s / seq_len}

    def state_bytes_per_token(self, m: Any, element_bytes: int) -> int:
        return 0  # the media's keys and values do not grow with the text

    def state_bytes_per_sequence(self, m: Any, seq_len: int, element_bytes: int) -> int:
        return 2 * self.inner * m.media.max_items * m.media.tokens * element_bytes  # K and V of every media token

    def saved_bytes(self, m: Any, seq_len: int, mm: int, device: str) -> int:
        # per text token: the normed input, q, the attention output, the gated sum, the normed input of the MLP and
        # its three hidden-width tensors (gate, up, their product)
        return (3 * m.d_model + 2 * self.inner + 3 * self.ffn_hidden) * mm

    @property
    def cache_class(self) -> str:
        return "MediaCache"

    def quantized_weights(self, module: Any) -> list[str]:
        return [n for n, p in module.named_parameters() if p.ndim == 2]

    def describe(self, m: Any) -> str:
        where = f"every {self.every} blocks" if self.layers is None else f"blocks {self.positions(m.n_layers)}"
        return f"gated cross-attention to media ({self.n_heads} heads, {where})"

    def constants(self, m: Any) -> list[Const]:
        at = [lit_int(i) for i in self.positions(m.n_layers)]
        return [Const("XATTN_LAYERS", "(" + ", ".join(at) + ("," if len(at) == 1 else "") + ")",
                      "blocks a gated cross-attention layer sits in front of"),
                Const("XATTN_HEADS", lit_int(self.n_heads)),
                Const("XATTN_HEAD_DIM", lit_int(self.head_dim)),
                Const("XATTN_FFN_HIDDEN", lit_int(self.ffn_hidden), "the gated dense layer's SwiGLU width")]


class ResamplerSpec(Strict):
    """`model.media.resampler`: Flamingo's Perceiver resampler (IDEFICS' IdeficsPerceiverResampler): `tokens` learned
    latents (model.media.tokens) attend to [item features; latents], then a ReLU MLP, `depth` times, then a
    LayerNorm: any number of features per item (at most max_input_tokens) in, `tokens` media tokens out."""

    depth: int = Field(2, ge=1, le=16)
    n_heads: int = Field(4, ge=1, le=MAX_HEADS)
    head_dim: int = Field(32, ge=1, le=MAX_HEAD_DIM)
    max_input_tokens: int = Field(64, ge=1, le=MAX_MEDIA_TOKENS, description="the most features one item may have")

    def params(self, width: int, tokens: int) -> int:
        inner = self.n_heads * self.head_dim
        attn = 2 * 2 * width + 3 * width * inner + inner * width  # two LayerNorms, q k v, output
        mlp = 2 * width + 2 * width * 4 * width  # LayerNorm, fc, c_proj
        return tokens * width + self.depth * (attn + mlp) + 2 * width

    def flops_per_item(self, width: int, tokens: int, inputs: int) -> int:
        inner, keys = self.n_heads * self.head_dim, inputs + tokens
        attn = 2 * width * inner * (tokens + 2 * keys) + 2 * 2 * inner * tokens * keys + 2 * inner * width * tokens
        mlp = 2 * 2 * width * 4 * width * tokens
        return self.depth * (attn + mlp)

    def saved_bytes_per_item(self, width: int, tokens: int, inputs: int, mm: int) -> int:
        """Activations one item keeps for backward at `inputs` features, `mm` bytes per element (the norms' per-row
        statistics left out): the item's features once; per layer the concatenation [normed features; normed
        latents] (k and v's input), the normed latents (q's), q, k and v, the attention's output and its log-sum-exp,
        the latents (the norm's input; the first layer's are the parameter), the MLP norm's input and output and its
        ReLU output; then the final norm's input. Checked against the tensors autograd saves (tests/test_media_training.py)."""
        inner, keys = self.n_heads * self.head_dim, inputs + tokens
        layer = (keys * width + inner * (2 * tokens + 2 * keys) + self.n_heads * tokens + 8 * tokens * width)
        # the first layer's latents (the parameter) are not an activation; the final norm's input is: they cancel
        return (inputs * width + self.depth * layer) * mm


class MediaSpec(Strict):
    """`model.media`: what the model reads besides text. Features precomputed per item (items × tokens × width)."""

    width: int = Field(ge=1, le=MAX_WIDTH, description="the media features' width (the encoder's)")
    tokens: int = Field(ge=1, le=MAX_MEDIA_TOKENS, description="media tokens per item the text attends to: the "
                        "resampler's latents, or (no resampler) the features per item")
    max_items: int = Field(4, ge=1, le=MAX_ITEMS, description="the most media items one sequence holds")
    marker_id: int = Field(ge=0, description="the token that marks where an item sits in the text")
    cross_attention: GatedCrossAttentionSpec = Field(default_factory=GatedCrossAttentionSpec)
    resampler: ResamplerSpec | None = None

    def fill_defaults(self, m: Any) -> None:
        self.cross_attention.fill_defaults(m)

    def problems(self, m: Any, path: tuple[str, ...]) -> list:
        out = []
        if self.marker_id >= m.vocab_size:
            out.append((path + ("marker_id",), f"must be a token below vocab_size ({m.vocab_size}), got "
                        f"{self.marker_id}", self.marker_id))
        return out + self.cross_attention.problems(m, path + ("cross_attention",))

    def positions(self, m: Any) -> list[int]:
        return self.cross_attention.positions(m.n_layers)

    def params(self, m: Any) -> dict[str, int]:
        """Parameters by accounting column: the cross-attention layers, the resampler."""
        out = {"cross_attention": len(self.positions(m)) * self.cross_attention.mixer_params(m)}
        if self.resampler is not None:
            out["resampler"] = self.resampler.params(self.width, self.tokens)
        return out

    def flops(self, m: Any, seq_len: int) -> dict[str, float]:
        """Forward FLOPs per text token by column, at seq_len text tokens and max_items items of media (the
        resampler at max_input_tokens features per item), the per-sequence media work shared by the seq_len tokens."""
        out = {"cross_attention": len(self.positions(m)) * self.cross_attention.mixer_flops(m, seq_len)[
            "cross_attention"]}
        if self.resampler is not None:
            out["resampler"] = self.max_items * self.resampler.flops_per_item(
                self.width, self.tokens, self.resampler.max_input_tokens) / seq_len
        return out

    def state_bytes_per_sequence(self, m: Any, seq_len: int, element_bytes: int) -> int:
        return len(self.positions(m)) * self.cross_attention.state_bytes_per_sequence(m, seq_len, element_bytes)

    def saved_bytes_per_sequence(self, m: Any, mm: int) -> dict[str, int]:
        """Activations one sequence's media keep for backward, whatever the text's length, at `mm` bytes per element
        and max_items items: `media` (the media tokens, and each cross-attention layer's keys and values of them)
        and `resampler` (its layers' tensors per item at max_input_tokens features; absent without one)."""
        s = self.max_items * self.tokens
        out = {"media": (s * self.width + len(self.positions(m)) * 2 * self.cross_attention.inner * s) * mm}
        if self.resampler is not None:
            out["resampler"] = self.max_items * self.resampler.saved_bytes_per_item(
                self.width, self.tokens, self.resampler.max_input_tokens, mm)
        return out

    def constants(self, m: Any) -> list[Const]:
        r = self.resampler
        return [Const("MEDIA_WIDTH", lit_int(self.width), "width of the media features (precomputed by an encoder)"),
                Const("MEDIA_TOKENS", lit_int(self.tokens), "media tokens per item the text attends to"),
                Const("MAX_MEDIA_ITEMS", lit_int(self.max_items), "the most media items one sequence holds"),
                Const("MEDIA_MARKER", lit_int(self.marker_id), "the token that marks where an item sits"),
                *self.cross_attention.constants(m),
                *([Const("RESAMPLER_DEPTH", lit_int(r.depth)), Const("RESAMPLER_HEADS", lit_int(r.n_heads)),
                   Const("RESAMPLER_HEAD_DIM", lit_int(r.head_dim)),
                   Const("RESAMPLER_MAX_INPUT", lit_int(r.max_input_tokens), "the most features one item may have")]
                  if r is not None else [])]
