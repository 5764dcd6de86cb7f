"""HF `idefics` (transformers' IdeficsForVisionText2Text, its open Flamingo) as a whole model, both ways.

IDEFICS is a LLaMA-shaped decoder (its `layers`, `norm`, `embed_tokens`, `lm_head`: the generic assembly maps them
through the `idefics` entry of archspec.hf.types) with Flamingo's media part beside it, which this module maps to
`model.media`:

    model.gated_cross_attn_layers.{j}.*   ↔  xattn.{j · cross_layer_interval}.*   (in front of blocks 0, N, 2N, ...)
    model.perceiver_resampler.*           ↔  resampler.*                        (use_resampler)
    model.vision_model.*                  ↔  left out: its output features are the media input (`media=`, the
                                             tensor transformers takes as `image_encoder_embeddings`)
    embed_tokens.additional_embedding, lm_head.additional_fc  ↔  the last additional_vocab_size rows of tok_emb and
                                             lm_head (IDEFICS keeps them apart only to train them alone)

What IDEFICS computes that archspec does not (a gate per channel, q/k norms in the cross-attention or the
resampler, a dense part other than SwiGLU) is refused by its config key, as is a cross_layer_interval that does not
divide num_hidden_layers (transformers' own forward would index past its cross-attention layers).

Which image a text token sees: IDEFICS' model takes any `image_attention_mask` (text token × image); its processor
builds it as archspec's rule (the last `<image>` at or before the token, the marker included; none before the first),
except that after an end-of-document token (the tokenizer's eos) a token sees no image until the next `<image>`
(packed documents). archspec has no such reset: the two agree on any text without an eos after an image. transformers'
generation repeats the prompt's last row for every new token, so a generated `<image>` switches nothing there, while
archspec switches to the next item: they agree while the marker is not generated.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

from archspec.errors import Caution, printable
from archspec.kinds.hf import HFConfig, HFUnsupported, HFWeight, bounded

BASE = "model."
XATTN = "model.gated_cross_attn_layers."
RESAMPLER = "model.perceiver_resampler."
VISION = "model.vision_model."
IMAGE_TOKEN = "<image>"  # IDEFICS' processor marks each image with this token
MAX_ITEMS = 8  # IDEFICS has no limit on images per sequence; what an import takes (model.media.max_items)

# IdeficsPerceiverConfig's fields and defaults (transformers 5.25)
PERCEIVER_DEFAULTS = {"use_resampler": False, "resampler_n_latents": 64, "resampler_depth": 6, "resampler_n_heads": 16,
                      "resampler_head_dim": 96, "qk_layer_norms_perceiver": False}
# IdeficsVisionConfig's: only the output's width and token count are read, the rest belongs to the encoder left out
VISION_DEFAULTS = {"embed_dim": 768, "image_size": 224, "patch_size": 14}
# keys of a nested config that are transformers' bookkeeping, not settings
_NESTED_INERT = frozenset({"model_type", "transformers_version", "_name_or_path", "architectures", "dtype",
                           "torch_dtype", "use_bfloat16", "return_dict", "output_hidden_states", "output_attentions",
                           "id2label", "label2id", "problem_type", "tie_word_embeddings", "chunk_size_feed_forward",
                           "is_encoder_decoder", "add_cross_attention", "tokenizer_class", "prefix",
                           "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
                           "task_specific_params", "finetuning_task", "_commit_hash",
                           "_attn_implementation_autoset", "pruned_heads", "torchscript", "tf_legacy_loss",
                           "initializer_range", "initializer_factor", "is_decoder", "cross_attention_hidden_size",
                           "tie_encoder_decoder", "use_cache", "output_scores", "return_dict_in_generate"})


def _nested(cfg: HFConfig, key: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """A nested config (perceiver_config, vision_config) with transformers' defaults for what it does not say."""
    value = cfg.take(key, dict, default=None)
    return {**defaults, **(value or {})}


def _number(cfg: HFConfig, where: str, value: Any) -> int:
    """A count or size of a nested config: an integer ≥ 1, bounded, else refused as `where`
    (perceiver_config.resampler_depth)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise cfg.refuse(where, f"{printable(repr(value), 60)}: expected an integer ≥ 1")
    return bounded(cfg, where, value)


def _image_features(cfg: HFConfig, vision: dict[str, Any]) -> int:
    """Features per image out of IDEFICS' vision encoder: (image_size // patch_size)² patches + the class token."""
    sizes = []
    for key in ("image_size", "patch_size"):
        value = vision[key]
        if isinstance(value, (list, tuple)):  # (h, w): IDEFICS' patch embedding assumes square images
            if len(value) != 2 or value[0] != value[1]:
                raise cfg.refuse(f"vision_config.{key}", f"{printable(repr(value), 60)}: IDEFICS' vision encoder "
                                 "takes square images and patches (one size)")
            value = value[0]
        sizes.append(_number(cfg, f"vision_config.{key}", value))
    image, patch = sizes
    if image < patch:
        raise cfg.refuse("vision_config.image_size", f"{image}: smaller than patch_size ({patch}): no patch")
    return (image // patch) ** 2 + 1


def _marker(cfg: HFConfig, vocab: int) -> tuple[int, str | None]:
    """The `<image>` token: `image_token_id` (archspec writes it on export; IDEFICS itself reads none), else the
    tokenizer.json beside the config, else the vocabulary's last id, said (IDEFICS' config does not hold it)."""
    given = cfg.take("image_token_id", int, default=None)
    if given is not None:
        if not 0 <= given < vocab:
            raise cfg.refuse("image_token_id", f"{given}: not a token of the vocabulary (0..{vocab - 1})")
        return given, None
    path = Path(cfg.source).parent / "tokenizer.json"
    if path.is_file():
        from archspec.hf.io import read_json

        data = read_json(path, "a tokenizer file")
        added = data.get("added_tokens") if isinstance(data, dict) else None
        for token in added if isinstance(added, list) else []:
            if isinstance(token, dict) and token.get("content") == IMAGE_TOKEN and isinstance(token.get("id"), int) \
                    and 0 <= token["id"] < vocab:
                return token["id"], None
    return vocab - 1, (f"model.media.marker_id = {vocab - 1}, the vocabulary's last id: an IDEFICS config does not say "
                       f"which token is {IMAGE_TOKEN} (its tokenizer does, and none beside the config names it); set "
                       "it in the spec if it differs")


class IdeficsMedia:
    """The media part of `idefics` (HFType.media): model.media from and to its config, its weights' names, the
    file's tensors prepared (the vision encoder's left out, the additional vocabulary's rows merged)."""

    # ── config → spec ──
    def from_hf(self, cfg: HFConfig, model: dict[str, Any]) -> None:
        alpha = cfg.take("alpha_type", str)
        if alpha != "float":
            raise cfg.refuse("alpha_type", f"{printable(repr(alpha), 40)}: a tanh gate per channel (1, 1, "
                             "hidden_size); archspec's gated cross-attention has one number per gate ('float')")
        if cfg.take("qk_layer_norms", bool):
            raise cfg.refuse("qk_layer_norms", "true: RMSNorm on the cross-attention's queries and keys, which "
                             "archspec's gated cross-attention does not have")
        act = cfg.take("activation", str)
        if act != "silu":
            raise cfg.refuse("activation", f"{printable(repr(act), 40)}: IDEFICS' cross-attention layers use it in "
                             "their dense part too, which is SwiGLU (silu) in archspec")
        n_layers, every = cfg.take("n_layers", int), cfg.take("cross_layer_interval", int)
        if every < 1 or n_layers % every:
            raise cfg.refuse("cross_layer_interval", f"{every}: must divide num_hidden_layers ({n_layers}); "
                             "transformers' IdeficsModel builds num_hidden_layers // cross_layer_interval "
                             "cross-attention layers and indexes past them otherwise")
        extra = cfg.take("additional_vocab_size", int)
        vocab = model["vocab_size"] + extra  # the decoupled rows follow the regular ones: one vocabulary of both
        model["vocab_size"] = vocab
        d_model, n_heads = cfg.take("d_model", int), cfg.take("n_heads", int)
        if n_heads < 1 or d_model % n_heads:
            raise cfg.refuse("n_heads", f"{n_heads}: must divide hidden_size ({d_model}): IDEFICS' heads are "
                             "hidden_size // num_attention_heads wide; transformers refuses it too")

        vision = _nested(cfg, "vision_config", VISION_DEFAULTS)
        if "hidden_size" in vision:  # IdeficsVisionConfig's attribute_map: hidden_size is embed_dim
            vision["embed_dim"] = vision.pop("hidden_size")
        width = _number(cfg, "vision_config.embed_dim", vision["embed_dim"])
        features = _image_features(cfg, vision)

        # transformers reads the top-level use_resampler; perceiver_config's own is read by nothing
        resampled = cfg.take("use_resampler", bool)
        perceiver = _nested(cfg, "perceiver_config", PERCEIVER_DEFAULTS)
        unknown = sorted(set(perceiver) - set(PERCEIVER_DEFAULTS) - _NESTED_INERT)
        if unknown:
            raise cfg.refuse(f"perceiver_config.{unknown[0]}", f"{printable(repr(perceiver[unknown[0]]), 60)}: not "
                             "a field of IdeficsPerceiverConfig archspec maps")
        resampler = None
        if resampled:
            if perceiver["qk_layer_norms_perceiver"] is not False:
                raise cfg.refuse("perceiver_config.qk_layer_norms_perceiver",
                                 f"{printable(repr(perceiver['qk_layer_norms_perceiver']), 40)}: LayerNorm on the "
                                 "resampler's queries and keys, which archspec's resampler does not have")
            resampler = {key: _number(cfg, f"perceiver_config.resampler_{name}", perceiver[f"resampler_{name}"])
                         for key, name in (("depth", "depth"), ("n_heads", "n_heads"), ("head_dim", "head_dim"))}
            resampler["max_input_tokens"] = features
            tokens = _number(cfg, "perceiver_config.resampler_n_latents", perceiver["resampler_n_latents"])
        else:
            tokens = features
        marker, guessed = _marker(cfg, vocab)
        model["media"] = {
            "width": width, "tokens": tokens, "max_items": MAX_ITEMS, "marker_id": marker,
            "cross_attention": {"every": every, "n_heads": n_heads, "head_dim": d_model // n_heads,
                                "ffn_hidden": cfg.take("ffn_hidden", int)},
            "resampler": resampler}
        warnings.warn(Caution(
            f"{cfg.source}: IDEFICS' vision encoder (vision_config, the tensors model.vision_model.*) is left out: its "
            f"output features ({features} per image, {width} wide) are the media input (`media=`, what transformers "
            f"takes as image_encoder_embeddings){', through the resampler' if resampled else ''}; "
            f"model.media.max_items = {MAX_ITEMS} (IDEFICS has no limit)" + (f"; {guessed}" if guessed else "")))

    # ── spec → config ──
    def check(self, m: Any) -> None:
        """What IDEFICS cannot say about a media model, by field (before the language model's own checks)."""
        media, x = m.media, m.media.cross_attention
        n_heads = m.attention.n_heads
        at, every = x.positions(m.n_layers), _interval(m)
        if x.layers is not None and at != list(range(0, m.n_layers, every)):
            raise HFUnsupported(f"model.media.cross_attention.layers: {at} cannot be expressed as idefics (its "
                                "cross-attention layers sit in front of blocks 0, N, 2N, ... every "
                                "cross_layer_interval)")
        if m.n_layers % every:
            raise HFUnsupported(f"model.media.cross_attention.every: {x.every} cannot be expressed as idefics (its "
                                f"cross_layer_interval must divide num_hidden_layers, {m.n_layers})")
        if x.n_heads != n_heads:
            raise HFUnsupported(f"model.media.cross_attention.n_heads: {x.n_heads} cannot be expressed as idefics (its "
                                f"cross-attention has the language model's heads, num_attention_heads = {n_heads})")
        if x.head_dim != m.d_model // n_heads:
            raise HFUnsupported(f"model.media.cross_attention.head_dim: {x.head_dim} cannot be expressed as idefics "
                                f"(its heads are hidden_size // num_attention_heads = {m.d_model // n_heads} wide)")
        hidden = getattr(m.ffn, "hidden_dim", None)
        if x.ffn_hidden != hidden:
            raise HFUnsupported(f"model.media.cross_attention.ffn_hidden: {x.ffn_hidden} cannot be expressed as "
                                f"idefics (its cross-attention layers' MLP is the language model's, intermediate_size "
                                f"= {hidden})")
        if media.resampler is None and _square_plus_one(media.tokens) is None:
            raise HFUnsupported(f"model.media.tokens: {media.tokens} cannot be expressed as idefics without a "
                                "resampler (its vision encoder gives (image_size / patch_size)² + 1 features an image)")
        act = getattr(m.ffn, "activation", None)
        if m.ffn.hf_block == "gated_mlp" and act != "silu":  # another FFN block: the language model's check says so
            raise HFUnsupported(f"model.ffn.activation: {act} cannot be expressed as idefics (its hidden_act is also "
                                "its cross-attention layers', whose dense part is SwiGLU in archspec)")

    def to_hf(self, m: Any, out: dict[str, Any]) -> None:
        media, r = m.media, m.media.resampler
        every = _interval(m)
        features = r.max_input_tokens if r is not None else media.tokens
        side = _square_plus_one(features)
        if side is None:  # the resampler takes any number of features: the smallest image that gives at least them
            side = math.isqrt(features - 2) + 1 if features > 1 else 1
            warnings.warn(Caution(f"model.media.resampler.max_input_tokens: {features} is not a square + 1; the "
                                  f"config's placeholder vision encoder gives {side * side + 1} features per image "
                                  "(the resampler takes any number; an import reads that as max_input_tokens)"))
        patch = 14
        out.update({
            "additional_vocab_size": 0, "cross_layer_interval": every, "alpha_type": "float",
            "alpha_initializer": "zeros", "qk_layer_norms": False, "use_resampler": r is not None,
            "image_token_id": media.marker_id,  # read by archspec's import; transformers reads no marker
            "perceiver_config": {"use_resampler": r is not None, "qk_layer_norms_perceiver": False,
                                 **({"resampler_depth": r.depth, "resampler_n_heads": r.n_heads,
                                     "resampler_head_dim": r.head_dim, "resampler_n_latents": media.tokens}
                                    if r is not None else {})},
            # a placeholder: only its width and the number of features it gives are the model's
            "vision_config": {"embed_dim": media.width, "image_size": side * patch, "patch_size": patch,
                              "num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": 4 * media.width},
            "architectures": ["IdeficsForVisionText2Text"],
        })
        warnings.warn(Caution("model.media: IDEFICS' vision encoder is not in the export (archspec has none): "
                              "transformers builds a placeholder (1 layer, random) as model.vision_model; give the "
                              "model image_encoder_embeddings (the media) or load a real encoder's weights into it; "
                              f"the marker {media.marker_id} is written as image_token_id (transformers reads none)"))

    # ── weights ──
    def weights(self, m: Any, hf: Any) -> list[HFWeight]:
        """The cross-attention layers (IdeficsGatedCrossAttentionLayer's names are ours) and the resampler."""
        out: list[HFWeight] = []
        norm = [w.our_names[0] for w in m.norm.hf_weights(m, hf)]  # the model's norm: RMSNorm's weight
        names = [f"{n}.{p}" for n in ("input_layernorm", "post_attention_layernorm") for p in norm]
        names += [f"cross_attn.{p}_proj.weight" for p in ("q", "k", "v", "o")]
        names += [f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")] + ["alpha_cross_attn", "alpha_dense"]
        for j, block in enumerate(m.media.positions(m)):
            out += [HFWeight(f"xattn.{block}.{n}", (f"{XATTN}{j}.{n}",)) for n in names]
        r = m.media.resampler
        if r is not None:
            names = ["latents", "layer_norm.weight", "layer_norm.bias"]
            for i in range(r.depth):
                names += [f"blocks.{i}.0.{n}" for n in ("context_layer_norm.weight", "context_layer_norm.bias",
                                                         "latents_layer_norm.weight", "latents_layer_norm.bias",
                                                         "q_proj.weight", "k_proj.weight", "v_proj.weight",
                                                         "output_proj.weight")]
                names += [f"blocks.{i}.1.{n}" for n in ("ln.weight", "ln.bias", "fc.weight", "c_proj.weight")]
            out += [HFWeight(f"resampler.{n}", (f"{RESAMPLER}{n}",)) for n in names]
        return out

    def prepare(self, tensors: dict[str, Any], source: str) -> dict[str, Any]:
        """The vision encoder's tensors left out (the import said so); IdeficsDecoupledEmbedding's and
        IdeficsDecoupledLinear's additional rows appended to the regular ones (ids ≥ vocab_size are theirs)."""
        import torch

        out = {k: v for k, v in tensors.items() if not k.startswith(VISION)}
        for regular, additional in (("model.embed_tokens.weight", "model.embed_tokens.additional_embedding.weight"),
                                    ("lm_head.weight", "lm_head.additional_fc.weight")):
            if additional in out and regular in out:
                a, b = out.pop(regular), out.pop(additional)
                if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
                    raise HFUnsupported(f"{source}: {additional}: shape {tuple(b.shape)} does not extend {regular}'s "
                                        f"{tuple(a.shape)}")
                out[regular] = torch.cat([a, b.to(a.dtype)], dim=0)
        return out


def _interval(m: Any) -> int:
    """IDEFICS' cross_layer_interval for the blocks the layers sit in front of: the step between the first two, or
    n_layers for one layer (at block 0: `every` past the last block is the same model)."""
    at = m.media.positions(m)
    return at[1] - at[0] if len(at) > 1 else m.n_layers


def _square_plus_one(n: int) -> int | None:
    """k with k² + 1 = n (the patches per side of an image giving n features), else None."""
    k = math.isqrt(max(n - 1, 0))
    return k if k >= 1 and k * k + 1 == n else None


def hf_inputs(idx: Any, marker_id: int, n_items: int) -> Any:
    """IDEFICS' image_attention_mask (B, T, items) for token ids `idx` (B, T) under archspec's rule (each token sees
    the last item whose marker is at or before it): what its processor builds for a text with no eos after an image."""
    import torch
    import torch.nn.functional as F

    from archspec.runtime import media_items

    item = media_items(idx, marker_id, n_items)  # (B, T), -1: none
    return (F.one_hot(item.clamp(min=0), n_items) * (item >= 0)[..., None]).to(torch.long)


__all__ = ["IdeficsMedia", "hf_inputs"]
