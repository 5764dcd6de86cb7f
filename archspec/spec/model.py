"""The spec language: the model and the whole spec, assembled from the kinds.

Each family's union (norm, positional, sparsity, ffn) is built from the kinds registered in `archspec.kinds`; each
kind is one unit there (spec class, template, accounting, init, rules, strategy). This module only composes them:
nothing here knows a kind by name. Rules that relate several fields live in `archspec.spec.rules` so that each
problem is reported with its own field path.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, StringConstraints, model_serializer, model_validator

from archspec.kinds import family
from archspec.kinds.attention import AttentionSpec  # noqa: F401 (the default attention kind, for code naming it)
from archspec.kinds.base import Since, Strict, bind, identity_dump, rebuild_order
from archspec.kinds.mixer.cross_attention import MediaSpec
from archspec.kinds.limits import (MAX_CONTEXT, MAX_HEAD_DIM, MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_VOCAB,  # noqa: F401
                                   MAX_WIDTH)
from archspec.spec.layers import (COMPONENTS, GROUP_NAME, BlockShape, BlockSpec, LayerGroup, canonical_layers,
                                  resolve, user_dict)
from archspec.spec.legacy import note, migrate_spec
from archspec.data.base import rebuild_order as rebuild_data_order
from archspec.spec.train import DataSpec, TrainSpec

SLUG = r"^[a-z0-9][a-z0-9_-]{0,63}$"

Norm = family("norm").union()
Attention = family("attention").union()
FFN = family("ffn").union()
Mixer = family("mixer").union()


# Multi-token prediction (DeepSeek-V3 §2.2): at most this many extra depths; each is one block more per step.
MAX_MTP_DEPTH = 16


class MTPSpec(Strict):
    """DeepSeek-V3's multi-token prediction: `depth` sequential modules after the model, module k predicting the token
    k + 1 positions ahead from the previous depth's hidden state and the embedding of the token k ahead (one block of
    the model's own block spec each, the embedding and head shared); loss = main + weight / depth · Σ_k loss_k.
    Training only: inference drops the modules (or uses them as a speculative draft, `archspec sample --draft mtp`)."""

    depth: int = Field(1, ge=1, le=MAX_MTP_DEPTH, description="MTP modules (D): module k predicts token t + k + 1")
    weight: float = Field(0.3, ge=0.0, le=100.0, description="λ: loss = main + λ / D · Σ_k loss_k (DeepSeek-V3: 0.3, "
                                                              "then 0.1)")


def _default(name: str):
    fam = family(name)
    return lambda: fam.members[fam.default]()


class ModelSpec(Strict):
    vocab_size: int = Field(8192, ge=2, le=MAX_VOCAB)
    context_length: int = Field(1024, ge=1, le=MAX_CONTEXT)
    d_model: int = Field(512, ge=1, le=MAX_WIDTH)
    n_layers: int = Field(8, ge=1, le=MAX_LAYERS)
    norm: Norm = Field(default_factory=_default("norm"))
    attention: Attention = Field(default_factory=_default("attention"))
    ffn: FFN = Field(default_factory=_default("ffn"))
    # The token mixer of every layer when it is not attention (a short causal convolution): null, each layer's
    # mixer is its attention (`model.attention`); a layer group's `mixer` switches its layers to another kind.
    mixer: Annotated[Mixer | None, Since("0.5")] = Field(
        None, description="every layer's token mixer when it is not attention (e.g. {kind: short_conv, L_cache: 3}); "
                          "null: attention (model.attention)")
    # Media beside the text (Flamingo): gated cross-attention layers in front of chosen blocks read precomputed media
    # features (archspec.kinds.mixer.cross_attention); null: a text-only model.
    media: Annotated[MediaSpec | None, Since("0.6")] = Field(
        None, description="media input: {width, tokens, max_items, marker_id, cross_attention: {every | layers, "
                          "n_heads, ...}, resampler: {depth, n_heads, head_dim, max_input_tokens} | null}")
    tie_embeddings: bool = True
    # Multi-token prediction modules trained beside the model (DeepSeek-V3 §2.2); null: none (docs/mtp.md).
    mtp: Annotated[MTPSpec | None, Since("0.6")] = Field(
        None, description="multi-token prediction: {depth: D, weight: λ}; null: next-token prediction only")
    # Token embeddings times sqrt(d_model) before anything is added to them (Vaswani et al., 2017; Gemma): with
    # N(0, 0.02) embeddings it lifts them to unit scale. Its own option, so a positional comparison holds it equal.
    embedding_scale: Literal["none", "sqrt_d_model"] = "none"
    # A norm of the model's norm kind right after the token embeddings (BLOOM's word_embeddings_layernorm).
    embedding_norm: Annotated[bool, Since("0.4")] = False
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    # The block's shape: where its norms sit and whether attention and FFN run in parallel (archspec.spec.layers).
    block: Annotated[BlockShape, Since("0.4")] = Field(default_factory=BlockShape)
    # No norm before the head: post-norm blocks end normed already (GPT-1). With post-norm and final_norm true the
    # last block's output is normed twice, which is allowed (a second norm of a normed vector only rescales it).
    final_norm: Annotated[bool, Since("0.4")] = True
    lm_head_bias: Annotated[bool, Since("0.4")] = False  # a bias on the logits (GPT-J, Phi)
    # Gemma 2: logits = cap · tanh(logits / cap), bounding them to (-cap, cap); null: no capping.
    logit_softcap: Annotated[float | None, Since("0.4")] = Field(None, gt=0, le=1e4)
    # µP (Yang et al. 2022, "Tensor Programs V", Table 3, Adam): hidden matrices initialised ∝ 1/sqrt(fan_in) and
    # trained at lr/m, logits times 1/m, attention scores by 1/head_dim, m = d_model / mup_base_width; at the base
    # width it is the standard init and rates, so a rate tuned there transfers to wider models (docs/ABLATIONS.md).
    parametrization: Annotated[Literal["standard", "mup"], Since("0.4")] = Field(
        "standard", description="standard: GPT-2 init and one learning rate; mup: µP, relative to mup_base_width")
    # 128: the width of the tiny presets (specs/*-tiny.yaml), the proxies a rate is tuned on here; with mup their
    # init and rates are the standard ones, and the 512-wide presets are m = 4.
    mup_base_width: Annotated[int, Since("0.4")] = Field(
        128, ge=1, le=MAX_WIDTH, description="µP's base width: m = d_model / mup_base_width (only with mup)")
    layers: dict[Annotated[str, StringConstraints(pattern=GROUP_NAME)], LayerGroup] = Field(
        default_factory=dict,
        description="per-layer overrides: {name: {select: [i, ...] | {start, stop, step}, norm/attention/ffn/block: "
                    "fields merged onto the model-wide component}}")

    _blocks: list[BlockSpec] | None = PrivateAttr(None)
    _layer_problems: list = PrivateAttr(default_factory=list)
    _unused_attention: bool = PrivateAttr(False)  # model.attention written, yet no layer mixes tokens by attention

    @model_validator(mode="after")
    def _fill_derived_defaults(self) -> "ModelSpec":
        # Defaults that depend on other fields are written into the spec, so that writing them explicitly gives the
        # same canonical JSON (and hash). Inconsistent values are left alone for archspec.spec.rules to report.
        self._old_spellings()
        if self.mixer is not None:
            # No layer mixes tokens by attention: the model has no attention, and so no positions (a layer's mixer
            # sees its own; archspec.spec.rules refuses a written model.attention, which nothing would read).
            self._unused_attention = "attention" in self.model_fields_set
            positional = family("positional")
            inert = next(cls for cls in positional.members.values() if cls.inert)
            attention = family("attention")
            object.__setattr__(self, "attention", attention.members[attention.default](positional=inert()))
        written = {c: user_dict(getattr(self, c)) for c in COMPONENTS} if self.layers else None
        self.attention.fill_defaults(self.d_model)
        for unit in (self.norm, self.attention.positional, self.attention.sparsity, self.ffn):
            unit.fill_defaults(self)
        if self.mixer is not None:  # the model-wide mixer's own defaults (a group's are filled where it is resolved)
            self.mixer.fill_defaults(self)
        if self.media is not None:
            self.media.fill_defaults(self)
        self._blocks, self._layer_problems = resolve(self, written)
        return self

    def _old_spellings(self) -> None:
        """Model options a unit's old field stood for (`positional.scale_embeddings` → `embedding_scale`)."""
        for unit in (self.attention.positional,):
            options, notes = unit.model_options(self, set(self.model_fields_set))
            for key, value in options.items():
                if key in self.model_fields_set and getattr(self, key) != value:
                    raise ValueError(f"model.attention.positional: its old field means model.{key}: {value}, which "
                                     f"contradicts model.{key}: {getattr(self, key)}; keep one")
                object.__setattr__(self, key, value)
            for text in notes:
                note(text)

    @model_serializer(mode="wrap")
    def _canonical(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        data.pop("layers", None)
        if data.get("media", 0) is None:  # a text-only model: written as before media had a field
            data.pop("media")
        if data.get("mixer", 0) is None:  # attention mixes tokens: written as before mixers had their own field
            data.pop("mixer")
        elif "mixer" in data:  # no layer has attention: nothing of it is part of the model
            data.pop("attention", None)
        if self.layers and not self._layer_problems:
            wide, groups = canonical_layers(self, self._blocks)
            data.update(wide)
            if "block" not in wide:  # every layer's block is the default one (canonical_layers leaves it out)
                data.pop("block", None)
            if not any(b.token_mixer is b.attention for b in self._blocks):
                data.pop("attention", None)  # every layer mixes tokens otherwise: no attention is part of the model
            if groups and "attention" in data:
                data["attention"]["positional"] = identity_dump(self.attention.positional)
                data["layers"] = groups
        return data

    # ── per layer ──

    def identity_clean_fields(self) -> tuple[str, ...]:
        """Fields the canonical form writes from identity dumps of their own (archspec.kinds.base.identity_dump):
        with layer groups, the block components come from the configurations most layers use, not these fields."""
        return COMPONENTS + ("layers",) if self.layers and not self._layer_problems else ()

    def blocks(self) -> list[BlockSpec]:
        """Each layer's resolved components (equal layers share one BlockSpec)."""
        if self._layer_problems:
            raise ValueError("; ".join(f"{'.'.join(map(str, p))}: {msg}" for p, msg, _ in self._layer_problems))
        return list(self._blocks)

    def block_groups(self) -> list[tuple[BlockSpec, list[int]]]:
        """The distinct block configurations, in order of first use, each with its layers."""
        out: dict[int, tuple[BlockSpec, list[int]]] = {}
        for i, b in enumerate(self.blocks()):
            out.setdefault(id(b), (b, []))[1].append(i)
        return list(out.values())

    @property
    def token_mixer(self) -> Any:
        """The model-wide token mixer: `mixer` when set, else the attention (archspec.kinds.base.MixerKind)."""
        return self.attention if self.mixer is None else self.mixer

    def units(self) -> list:
        """Every distinct kind unit of the model: norms, the positional encoding, token mixers other than attention
        and the units mixers hold (attention patterns), FFNs."""
        seen: dict[int, Any] = {id(self.attention.positional): self.attention.positional}
        for b, _ in self.block_groups():
            mixer = b.token_mixer
            for unit in (b.norm, *(() if mixer is b.attention else (mixer,)), *mixer.sub_units(), b.ffn):
                seen.setdefault(id(unit), unit)
        return list(seen.values())

    def unit_paths(self) -> list[tuple[tuple[str, ...], object]]:
        return [(("model", "norm"), self.norm), (("model", "attention", "positional"), self.attention.positional),
                (("model", "attention", "sparsity"), self.attention.sparsity), (("model", "ffn"), self.ffn),
                *([(("model", "mixer"), self.mixer)] if self.mixer is not None else []),
                *([(("model", "media"), self.media)] if self.media is not None else [])]

    def layer_problems(self) -> list:
        return list(self._layer_problems)


class Spec(Strict):
    name: str = Field(pattern=SLUG, description="slug: lowercase letters, digits, '-' and '_'")
    model: ModelSpec = Field(default_factory=ModelSpec)
    train: TrainSpec = Field(default_factory=TrainSpec)

    @model_validator(mode="before")
    @classmethod
    def _legacy_keys(cls, data: Any) -> Any:
        return migrate_spec(data)

    @model_validator(mode="after")
    def _fill_train_defaults(self) -> "Spec":
        if self.train.seq_len is None:
            object.__setattr__(self.train, "seq_len", self.model.context_length)
        self.train.data.corpus.fill_defaults(self)
        self.train.data.tokenizer.fill_defaults(self)
        return self


bind("norm", ModelSpec, "norm")
bind("ffn", ModelSpec, "ffn")
bind("attention", ModelSpec, "attention")
bind("mixer", ModelSpec, "mixer", optional=True)
rebuild_order(*family("attention").members.values(), ModelSpec, Spec)
rebuild_data_order(DataSpec, TrainSpec, Spec)  # a data kind registered late (archspec.data)

# The built-in kinds' classes, for code that names one directly (tests, presets).
from archspec.kinds.ffn.glu import GLUSpec  # noqa: E402,F401
from archspec.kinds.ffn.mlp import MLPSpec  # noqa: E402,F401
from archspec.kinds.norm.layernorm import LayerNormSpec  # noqa: E402,F401
from archspec.kinds.norm.rmsnorm import RMSNormSpec  # noqa: E402,F401
from archspec.kinds.positional.learned import LearnedPositional  # noqa: E402,F401
from archspec.kinds.positional.none import NoPositional  # noqa: E402,F401
from archspec.kinds.positional.rope import RopePositional  # noqa: E402,F401
from archspec.kinds.positional.sinusoidal import SinusoidalPositional  # noqa: E402,F401
from archspec.kinds.sparsity.dense import DenseSparsity  # noqa: E402,F401
