"""The transformers model types archspec reads and writes: for each, the HF building blocks it is made of (in HF's
words; each kind unit says which one it is), its config keys, its defaults (what transformers assumes when a key is
absent), its module names, and the keys that do not change what the model computes.

A type whose building block no registered kind provides is refused by name when a config needs it; it works as soon
as a kind with that `hf_block` is registered. Where a type lets the block differ by layer (`layer_types`,
Qwen2-MoE's dense layers), its `pick` reads the per-layer words (transformers' own rule, reproduced exactly) and its
`place` writes them back; the assembly turns a per-layer mix into layer groups.
"""

from __future__ import annotations

from archspec.errors import printable
from archspec.hf.idefics import IdeficsMedia
from archspec.kinds.hf import HFConfig, HFType, HFUnsupported

# Keys of every transformers config that do not change the function the model computes: ids, labels, generation
# defaults, output switches, bookkeeping, the init scale (weights are loaded, not drawn), the cache switch.
COMMON_INERT = frozenset({
    "_name_or_path", "_commit_hash", "_attn_implementation", "_attn_implementation_autoset", "architectures",
    "transformers_version", "model_type", "dtype", "torch_dtype", "use_bfloat16", "return_dict", "output_hidden_states",
    "output_attentions", "torchscript", "tf_legacy_loss", "pruned_heads", "tie_encoder_decoder", "is_decoder",
    "chunk_size_feed_forward", "finetuning_task", "id2label", "label2id", "num_labels", "problem_type",
    "tokenizer_class", "prefix", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "task_specific_params", "initializer_range", "use_cache", "max_length", "min_length",
    "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p",
    "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "cross_attention_hidden_size", "output_router_logits",
})


def _caution(text: str) -> None:
    """What an import chose or left out, said on stderr (archspec.errors.Caution)."""
    import warnings

    from archspec.errors import Caution

    warnings.warn(Caution(text), stacklevel=3)


def _must_be(key: str, value, why: str):
    def check(cfg: HFConfig) -> None:
        got = cfg.take(key, default=value)
        if got != value:
            raise cfg.refuse(key, f"{got!r}: {why}")
    check.__name__ = f"must_be_{key}"
    return check


def _common_checks(cfg: HFConfig) -> None:
    for key, value, why in (("add_cross_attention", False, "archspec models are decoder-only, no cross-attention"),
                            ("is_encoder_decoder", False, "archspec models are decoder-only")):
        _must_be(key, value, why)(cfg)


def _gpt2_checks(cfg: HFConfig) -> None:
    _must_be("scale_attn_weights", True, "archspec scales attention scores by 1/sqrt(head_dim)")(cfg)
    _must_be("scale_attn_by_inverse_layer_idx", False, "archspec does not scale scores by layer")(cfg)
    n_ctx = cfg.take("n_ctx", int, default=None)  # early GPT-2 configs: the attention mask size, = n_positions
    if n_ctx is not None and n_ctx != cfg.take("context_length", int):
        raise cfg.refuse("n_ctx", f"{n_ctx} differs from n_positions; archspec has one context length")


FULL, SLIDING = "full_attention", "sliding_attention"  # transformers' words in `layer_types`


def _check_words(cfg: HFConfig, layer_types: list, n_layers: int) -> None:
    """`layer_types`: one of transformers' two words per layer."""
    if len(layer_types) != n_layers:
        raise cfg.refuse("layer_types", f"{len(layer_types)} entries for {n_layers} layers")
    odd = sorted({repr(t) for t in layer_types if t not in (FULL, SLIDING)})
    if odd:
        raise cfg.refuse("layer_types", f"{', '.join(odd)}: archspec maps {FULL!r} and {SLIDING!r}")


def _layer_types(cfg: HFConfig, derived, window_off) -> list[str]:
    """Which layers slide, as transformers decides: `layer_types` (5.x) when the config has it, else derived from
    use_sliding_window and max_window_layers (`derived(i, max_window_layers)`). transformers ignores sliding_window
    unless use_sliding_window is set (it then uses `window_off`: None, or Qwen2-MoE's 0), so a sliding layer without
    it would have no window: refused."""
    n_layers = cfg.take("n_layers", int)
    layer_types = cfg.take("layer_types", list, default=None)
    use = cfg.take("use_sliding_window", bool, default=False)
    written = cfg.take("sliding_window", int, default=None)
    window = written if use else window_off
    first = cfg.take("max_window_layers", int)
    if layer_types is None:
        layer_types = [SLIDING if use and window is not None and derived(i, first) else FULL for i in range(n_layers)]
    _check_words(cfg, layer_types, n_layers)
    if SLIDING in layer_types and not window:
        raise cfg.refuse("layer_types", f"{SLIDING!r} layers, but use_sliding_window is {str(use).lower()} and "
                         f"sliding_window {window!r}: transformers would give them no usable window")
    return layer_types


def _qwen2_pattern(cfg: HFConfig) -> list[str]:
    """Qwen2/Qwen3: layers from max_window_layers on slide (when derived)."""
    return _layer_types(cfg, lambda i, first: i >= first, None)


def _qwen2_moe_pattern(cfg: HFConfig) -> list[str]:
    """Qwen2-MoE: even-numbered layers below max_window_layers slide (when derived)."""
    return _layer_types(cfg, lambda i, first: (i + 1) % 2 == 1 and i < first, 0)


def _ministral_pattern(cfg: HFConfig) -> list[str]:
    """Ministral: `layer_types`, else every layer slides when sliding_window is set."""
    n_layers = cfg.take("n_layers", int)
    window = cfg.take("sliding_window", int, default=None)
    layer_types = cfg.take("layer_types", list, default=None)
    if layer_types is None:
        layer_types = [SLIDING if window is not None else FULL] * n_layers
    _check_words(cfg, layer_types, n_layers)
    if SLIDING in layer_types and not window:
        raise cfg.refuse("layer_types", f"{SLIDING!r} layers, but sliding_window is {window!r}: transformers "
                         "would give them no usable window")
    return layer_types


def _place_layer_types(out: dict, words: list[str]) -> None:
    """Export: the per-layer pattern as `layer_types` (transformers 5.x reads it as written)."""
    out["layer_types"] = list(words)
    out["use_sliding_window"] = SLIDING in words


def _place_ministral_layer_types(out: dict, words: list[str]) -> None:
    out["layer_types"] = list(words)


def _mistral_pattern(cfg: HFConfig) -> str:
    """One pattern for every layer (Mistral and Mixtral have no layer_types). A window at least as long as the
    context hides no key: full attention, the same function."""
    window = cfg.take("sliding_window", int, default=None)
    return SLIDING if window is not None and window < cfg.take("context_length", int) else FULL


def _qwen3_moe_pattern(cfg: HFConfig) -> str:
    """Qwen3-MoE: one pattern for every layer, as Mistral's, but sliding_window counts only with use_sliding_window."""
    use = cfg.take("use_sliding_window", bool, default=False)
    window = cfg.take("sliding_window", int, default=None)
    return SLIDING if use and window is not None and window < cfg.take("context_length", int) else FULL


def _qwen2_moe_ffn(cfg: HFConfig) -> list[str]:
    """Qwen2-MoE: a layer is a sparse MoE block unless listed in mlp_only_layers, when num_experts > 0 and
    (i + 1) % decoder_sparse_step == 0; else a dense gated MLP of intermediate_size. Keys a kind of layer that the
    model does not have would read are marked read: they change nothing."""
    n_layers = cfg.take("n_layers", int)
    n_experts = cfg.take("n_experts", int)
    step = cfg.take("decoder_sparse_step", int)
    if step < 1:
        raise cfg.refuse("decoder_sparse_step", f"{step}: must be at least 1")
    only = cfg.take_layers("mlp_only_layers", n_layers, default=[])
    words = ["sparse_moe" if i not in only and n_experts > 0 and (i + 1) % step == 0 else "gated_mlp"
             for i in range(n_layers)]
    if "gated_mlp" not in words:
        cfg.mark(cfg.key("ffn_hidden"))
    if "sparse_moe" not in words:
        cfg.mark(*(cfg.key(role) for role in ("top_k", "expert_hidden", "shared_hidden", "aux_loss_coef")),
                 cfg.hf.facts["renormalize"])
    return words


def _place_qwen2_moe_ffn(out: dict, words: list[str]) -> None:
    out["decoder_sparse_step"] = 1
    out["mlp_only_layers"] = [i for i, w in enumerate(words) if w != "sparse_moe"]


_qwen2_pattern.fields = _qwen2_moe_pattern.fields = ("layer_types", "use_sliding_window", "sliding_window",
                                                     "max_window_layers")
_mistral_pattern.fields = ("sliding_window",)
_qwen3_moe_pattern.fields = ("use_sliding_window", "sliding_window")
_ministral_pattern.fields = ("layer_types", "sliding_window")
_qwen2_moe_ffn.fields = ("num_experts", "mlp_only_layers", "decoder_sparse_step")


_PATTERNS = (FULL, SLIDING)  # the config says which, per layer or for every layer

_LLAMA_KEYS = {"vocab_size": "vocab_size", "context_length": "max_position_embeddings", "d_model": "hidden_size",
               "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
               "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim", "ffn_hidden": "intermediate_size",
               "activation": "hidden_act", "norm_eps": "rms_norm_eps", "tie": "tie_word_embeddings"}
_QWEN_KEYS = {**_LLAMA_KEYS, "window_switch": "use_sliding_window"}  # a window counts only when this is set
_LLAMA_NAMES = {"base": "model", "embed": "embed_tokens", "layers": "layers", "attn": "self_attn", "ffn": "mlp",
                "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "final_norm": "norm"}
_LLAMA_BLOCKS = {"norm": "rms_norm", "positional": "rotary", "sparsity": "full_attention", "ffn": "gated_mlp"}
_LLAMA_DEFAULTS = {"hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_theta": 10000.0,
                   "attention_dropout": 0.0}

GPT2 = HFType(
    model_type="gpt2", architecture="GPT2LMHeadModel",
    blocks={"norm": "layer_norm", "positional": "absolute", "sparsity": "full_attention", "ffn": "plain_mlp"},
    keys={"vocab_size": "vocab_size", "context_length": "n_positions", "d_model": "n_embd", "n_layers": "n_layer",
          "n_heads": "n_head", "ffn_hidden": "n_inner", "activation": "activation_function",
          "norm_eps": "layer_norm_epsilon", "tie": "tie_word_embeddings"},
    defaults={"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
              "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
              "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1},
    names={"base": "transformer", "embed": "wte", "positions": "wpe", "layers": "h", "attn": "attn", "ffn": "mlp",
           "attn_norm": "ln_1", "ffn_norm": "ln_2", "final_norm": "ln_f", "qkv": "c_attn", "o": "c_proj",
           "up": "c_fc", "down": "c_proj"},
    conv1d=True,
    facts={"qkv_bias": True, "out_bias": True, "norm_bias": True, "mlp_bias": True},
    dropout_keys=("resid_pdrop", "embd_pdrop", "attn_pdrop"),
    fixed={"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False},
    # summary_*: the sequence-summary head of GPT2DoubleHeadsModel, absent from GPT2LMHeadModel;
    # reorder_and_upcast_attn: fp32 scores under fp16, the same function
    inert=frozenset({"summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
                     "summary_first_dropout", "reorder_and_upcast_attn"}),
    check=(_common_checks, _gpt2_checks),
)

LLAMA = HFType(
    model_type="llama", architecture="LlamaForCausalLM", blocks=_LLAMA_BLOCKS, keys=_LLAMA_KEYS,
    defaults={**_LLAMA_DEFAULTS, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
              "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 2048},
    names=_LLAMA_NAMES,
    facts={"qkv_bias": "attention_bias", "out_bias": "attention_bias", "mlp_bias": "mlp_bias"},
    dropout_keys=("attention_dropout",),
    inert=frozenset({"pretraining_tp"}),  # tensor-parallel slicing of the same matmuls (unused by transformers 5)
    check=(_common_checks,),
)

QWEN2 = HFType(
    model_type="qwen2", architecture="Qwen2ForCausalLM",
    blocks={**_LLAMA_BLOCKS, "sparsity": _PATTERNS}, pick={"sparsity": _qwen2_pattern}, keys=_QWEN_KEYS,
    defaults={**_LLAMA_DEFAULTS, "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "max_position_embeddings": 32768, "max_window_layers": 28},
    names=_LLAMA_NAMES,
    facts={"qkv_bias": True, "out_bias": False},  # bias on q, k, v only
    dropout_keys=("attention_dropout",),
    fixed={"use_sliding_window": False, "sliding_window": None},
    place={"sparsity": _place_layer_types},
    check=(_common_checks,),
)

QWEN3 = HFType(
    model_type="qwen3", architecture="Qwen3ForCausalLM",
    blocks={**_LLAMA_BLOCKS, "sparsity": _PATTERNS}, pick={"sparsity": _qwen2_pattern}, keys=_QWEN_KEYS,
    defaults={**QWEN2.defaults, "head_dim": 128},
    names=_LLAMA_NAMES,
    facts={"qkv_bias": "attention_bias", "out_bias": "attention_bias", "qk_norm": True},
    dropout_keys=("attention_dropout",),
    fixed={"use_sliding_window": False, "sliding_window": None},
    place={"sparsity": _place_layer_types},
    check=(_common_checks,),
)

MISTRAL = HFType(
    model_type="mistral", architecture="MistralForCausalLM",
    blocks={**_LLAMA_BLOCKS, "sparsity": _PATTERNS}, pick={"sparsity": _mistral_pattern}, keys=_LLAMA_KEYS,
    defaults={**_LLAMA_DEFAULTS, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "max_position_embeddings": 4096 * 32, "sliding_window": 4096},
    names=_LLAMA_NAMES,
    dropout_keys=("attention_dropout",),
    fixed={"sliding_window": None},
    check=(_common_checks,),
)

MINISTRAL = HFType(  # Mistral's layers with a per-layer pattern (`layer_types`) and one window for the sliding ones
    model_type="ministral", architecture="MinistralForCausalLM",
    blocks={**_LLAMA_BLOCKS, "sparsity": _PATTERNS}, pick={"sparsity": _ministral_pattern}, keys=_LLAMA_KEYS,
    defaults=MISTRAL.defaults, names=_LLAMA_NAMES,
    dropout_keys=("attention_dropout",),
    fixed={"sliding_window": None},
    place={"sparsity": _place_ministral_layer_types},
    check=(_common_checks,),
)

_MOE_KEYS = {**_LLAMA_KEYS, "top_k": "num_experts_per_tok", "aux_loss_coef": "router_aux_loss_coef"}
_MOE_NAMES = {**_LLAMA_NAMES, "router": "gate"}

MIXTRAL = HFType(
    model_type="mixtral", architecture="MixtralForCausalLM",
    blocks={**_LLAMA_BLOCKS, "sparsity": _PATTERNS, "ffn": "sparse_moe"}, pick={"sparsity": _mistral_pattern},
    keys={**_MOE_KEYS, "n_experts": "num_local_experts", "expert_hidden": "intermediate_size"},
    defaults={**_LLAMA_DEFAULTS, "rope_theta": 1e6, "rms_norm_eps": 1e-5, "vocab_size": 32000, "hidden_size": 4096,
              "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32, "sliding_window": None,
              "num_experts_per_tok": 2, "num_local_experts": 8, "router_aux_loss_coef": 0.001},
    names={**_MOE_NAMES, "ffn": "block_sparse_moe", "expert_gate": "w1", "expert_up": "w3", "expert_down": "w2"},
    facts={"renormalize": True},  # top-k gates renormalised; no shared expert, no biases
    dropout_keys=("attention_dropout",),
    fixed={"sliding_window": None, "router_jitter_noise": 0.0},
    check=(_common_checks, _must_be("router_jitter_noise", 0.0, "archspec's router has no jitter noise")),
    aliases={"num_experts": "num_local_experts"},
)

QWEN2_MOE = HFType(
    model_type="qwen2_moe", architecture="Qwen2MoeForCausalLM",
    blocks={**_LLAMA_BLOCKS, "sparsity": _PATTERNS, "ffn": ("sparse_moe", "gated_mlp")},
    pick={"sparsity": _qwen2_moe_pattern, "ffn": _qwen2_moe_ffn},
    keys={**_MOE_KEYS, "n_experts": "num_experts", "expert_hidden": "moe_intermediate_size",
          "shared_hidden": "shared_expert_intermediate_size", "window_switch": "use_sliding_window"},
    defaults={**_LLAMA_DEFAULTS, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
              "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
              "max_position_embeddings": 32768, "max_window_layers": 28, "decoder_sparse_step": 1,
              "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4,
              "num_experts": 60, "norm_topk_prob": False, "router_aux_loss_coef": 0.001, "qkv_bias": True},
    names=_MOE_NAMES,
    # q/k/v bias by its own key, never an output bias; one shared expert, always on, gated by sigmoid(x · w)
    facts={"qkv_bias": "qkv_bias", "out_bias": False, "renormalize": "norm_topk_prob", "shared_expert": True,
           "shared_gate": True},
    dropout_keys=("attention_dropout",),
    fixed={"use_sliding_window": False, "sliding_window": None},
    place={"sparsity": _place_layer_types, "ffn": _place_qwen2_moe_ffn},
    check=(_common_checks,),
)

QWEN3_MOE = HFType(
    model_type="qwen3_moe", architecture="Qwen3MoeForCausalLM",
    blocks={**_LLAMA_BLOCKS, "sparsity": _PATTERNS, "ffn": ("sparse_moe", "gated_mlp")},
    pick={"sparsity": _qwen3_moe_pattern, "ffn": _qwen2_moe_ffn},
    keys={**_MOE_KEYS, "n_experts": "num_experts", "expert_hidden": "moe_intermediate_size",
          "window_switch": "use_sliding_window"},
    defaults={**_LLAMA_DEFAULTS, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
              "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 4,
              "max_position_embeddings": 32768, "decoder_sparse_step": 1, "moe_intermediate_size": 768,
              "num_experts_per_tok": 8, "num_experts": 128, "norm_topk_prob": False, "router_aux_loss_coef": 0.001},
    names=_MOE_NAMES,
    # Qwen3's attention (q/k norm, attention_bias on all four projections); routed experts only, no shared expert
    facts={"qkv_bias": "attention_bias", "out_bias": "attention_bias", "qk_norm": True, "renormalize": "norm_topk_prob"},
    dropout_keys=("attention_dropout",),
    fixed={"use_sliding_window": False, "sliding_window": None},
    place={"ffn": _place_qwen2_moe_ffn},
    inert=frozenset({"max_window_layers"}),  # in released configs, read by no Qwen3-MoE layer (one pattern for all)
    aliases={"num_local_experts": "num_experts"},  # transformers 5.x saves num_experts under this name
    check=(_common_checks,),
)

def _phi3_rope(cfg: HFConfig) -> None:
    """Phi-3 reads a yarn (or `su`) rope as longrope, and refuses linear, llama3 and dynamic ones: only its default
    rotary embedding is one archspec has."""
    for key in ("rope_parameters", "rope_scaling"):
        value = cfg.data.get(key)
        if isinstance(value, dict):
            named = value.get("rope_type", value.get("type", "default"))
            if named not in (None, "default"):
                raise cfg.refuse(key, f"rope_type {named!r}: phi3's rotary embedding takes default or longrope "
                                 "(yarn and su are read as longrope), and archspec has no longrope")


PHI3 = HFType(  # Phi-3: LLaMA's block with fused qkv_proj and gate_up_proj, no biases, a rotary fraction (half pairs)
    model_type="phi3", architecture="Phi3ForCausalLM",
    blocks={**_LLAMA_BLOCKS, "sparsity": _PATTERNS}, pick={"sparsity": _mistral_pattern}, keys=_LLAMA_KEYS,
    defaults={**_LLAMA_DEFAULTS, "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192,
              "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-5, "resid_pdrop": 0.0, "partial_rotary_factor": 1.0},
    names={**_LLAMA_NAMES, "qkv": "qkv_proj", "gate_up": "gate_up_proj"},
    facts={"partial_rotary": True, "default_rope_only": True},
    dropout_keys=("resid_pdrop", "attention_dropout"),
    fixed={"sliding_window": None},
    # embd_pdrop: read by no Phi-3 module; original_max_position_embeddings: read only by longrope (refused)
    inert=frozenset({"embd_pdrop", "original_max_position_embeddings"}),
    check=(_common_checks, _phi3_rope),
)

GLM = HFType(  # GLM-4 (THUDM/glm-4-9b-hf): LLaMA's block with half of each head rotated in (2i, 2i + 1) pairs
    model_type="glm", architecture="GlmForCausalLM", blocks=_LLAMA_BLOCKS, keys=_LLAMA_KEYS,
    defaults={**_LLAMA_DEFAULTS, "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 13696,
              "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
              "max_position_embeddings": 131072, "rms_norm_eps": 1.5625e-07, "attention_bias": True,
              "partial_rotary_factor": 0.5},  # GlmConfig's defaults (GLM-4-9B's); 0.5 set when the key is absent
    names={**_LLAMA_NAMES, "gate_up": "gate_up_proj"},  # gate and up fused, gate rows first
    # attention_bias on q, k, v only (o_proj never has one); the rotary embedding honours partial_rotary_factor and
    # pairs (2i, 2i + 1); no MLP bias
    facts={"qkv_bias": "attention_bias", "out_bias": False, "partial_rotary": True, "rope_interleaved": True},
    dropout_keys=("attention_dropout",),
    check=(_common_checks,),
)

# ── deepseek_v3: multi-head latent attention (the attention family's latent_attention kind) ──────────────────────
# Layers 0 .. first_k_dense_replace - 1 are dense gated MLPs (intermediate_size), every later one a DeepSeekMoE
# layer (transformers: `layer_idx >= first_k_dense_replace`; moe_layer_freq is read nowhere): n_routed_experts of
# moe_intermediate_size, top num_experts_per_tok by sigmoid scores plus e_score_correction_bias, group-limited
# (n_group, topk_group), gates renormalised (norm_topk_prob) and scaled (routed_scaling_factor), n_shared_experts.


def _deepseek_ffn(cfg: HFConfig) -> list[str]:
    n_layers = cfg.take("n_layers", int)
    dense = cfg.take("first_k_dense_replace", int)
    if dense < 0:
        raise cfg.refuse("first_k_dense_replace", f"{dense}: must be at least 0")
    words = ["gated_mlp" if i < dense else "sparse_moe" for i in range(n_layers)]
    if "gated_mlp" not in words:
        cfg.mark(cfg.key("ffn_hidden"))
    if "sparse_moe" not in words:  # keys no layer reads: they change nothing
        cfg.mark(*(cfg.key(role) for role in ("n_experts", "top_k", "expert_hidden", "n_shared_experts", "n_group",
                                              "topk_group", "routed_scaling_factor")), "norm_topk_prob")
    return words


_deepseek_ffn.fields = ("first_k_dense_replace",)


def _place_deepseek_ffn(out: dict, words: list[str]) -> None:
    dense = next((i for i, w in enumerate(words) if w != "gated_mlp"), len(words))
    if any(w == "gated_mlp" for w in words[dense:]):
        raise HFUnsupported(f"model.layers: dense layers {[i for i, w in enumerate(words) if w == 'gated_mlp']} "
                            "cannot be expressed as deepseek_v3 (its dense layers are the first "
                            "first_k_dense_replace, every later layer MoE)")
    out["first_k_dense_replace"] = dense


DEEPSEEK_V3 = HFType(
    model_type="deepseek_v3", architecture="DeepseekV3ForCausalLM",
    blocks={**_LLAMA_BLOCKS, "attention": "latent_attention", "ffn": ("sparse_moe", "gated_mlp")},
    pick={"ffn": _deepseek_ffn},
    keys={**_LLAMA_KEYS, "q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank",
          "qk_nope_head_dim": "qk_nope_head_dim", "qk_rope_head_dim": "qk_rope_head_dim",
          "v_head_dim": "v_head_dim", "n_experts": "n_routed_experts", "top_k": "num_experts_per_tok",
          "expert_hidden": "moe_intermediate_size", "n_shared_experts": "n_shared_experts", "n_group": "n_group",
          "topk_group": "topk_group", "routed_scaling_factor": "routed_scaling_factor"},
    # what transformers assumes when a key is absent (DeepseekV3Config's defaults)
    defaults={**_LLAMA_DEFAULTS, "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
              "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
              "max_position_embeddings": 4096, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
              "qk_rope_head_dim": 64, "v_head_dim": 128, "first_k_dense_replace": 3, "rope_interleave": True,
              "moe_intermediate_size": 2048, "n_routed_experts": 256, "num_experts_per_tok": 8,
              "n_shared_experts": 1, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
              "norm_topk_prob": True},
    names={**_LLAMA_NAMES, "router": "gate", "shared_expert": "shared_experts"},
    # no biases but attention_bias's; the router: sigmoid scores, a selection bias (e_score_correction_bias), gates
    # renormalised by norm_topk_prob; rope pairs interleaved by rope_interleave
    facts={"qkv_bias": "attention_bias", "out_bias": "attention_bias", "renormalize": "norm_topk_prob",
           "sigmoid_scores": True, "selection_bias": True, "rope_interleaved": "rope_interleave"},
    dropout_keys=("attention_dropout",),
    place={"ffn": _place_deepseek_ffn},
    # auto_map: the original remote code's class names; ep_size: its expert parallelism; moe_layer_freq, scoring_func,
    # topk_method: DeepSeek's own config's routing words, which transformers' deepseek_v3 reads nowhere (its router is
    # always sigmoid + noaux_tc, every layer from first_k_dense_replace on MoE); output_router_logits: an output switch
    inert=frozenset({"pretraining_tp", "num_mtp_layers", "auto_map", "ep_size", "moe_layer_freq", "scoring_func",
                     "topk_method", "output_router_logits"}),
    aliases={"num_mtp_layers": "num_nextn_predict_layers"},
    mtp_layers="num_nextn_predict_layers",  # model.mtp (docs/mtp.md)
    check=(_common_checks,),
)

# ── block shapes (issue 26): parallel blocks, norms after the sublayers, Gemma's (1 + w) norm ────────────────────

_LN_KEYS = {**_LLAMA_KEYS, "norm_eps": "layer_norm_eps"}  # LLaMA's key names, a LayerNorm's epsilon
del _LN_KEYS["head_dim"]  # head_dim = hidden_size / num_attention_heads in these types: no key of its own

GPT_NEOX = HFType(  # GPT-NeoX / Pythia: LayerNorms, a quarter of each head rotated (half pairs), a GELU MLP
    model_type="gpt_neox", architecture="GPTNeoXForCausalLM",
    blocks={"norm": "layer_norm", "positional": "rotary", "sparsity": "full_attention", "ffn": "plain_mlp"},
    keys={k: v for k, v in _LN_KEYS.items() if k != "n_kv_heads"},  # no GQA: K/V heads = query heads
    defaults={"vocab_size": 50432, "hidden_size": 6144, "num_hidden_layers": 44, "num_attention_heads": 64,
              "intermediate_size": 24576, "hidden_act": "gelu", "max_position_embeddings": 2048,
              "layer_norm_eps": 1e-5, "tie_word_embeddings": False, "use_parallel_residual": True,
              "attention_bias": True, "rope_theta": 10000.0, "partial_rotary_factor": 0.25, "attention_dropout": 0.0,
              "hidden_dropout": 0.0},
    names={"base": "gpt_neox", "embed": "embed_in", "layers": "layers", "attn": "attention", "ffn": "mlp",
           "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "final_norm": "final_layer_norm",
           "qkv": "query_key_value", "o": "dense", "up": "dense_h_to_4h", "down": "dense_4h_to_h",
           "lm_head": "embed_out"},
    # use_parallel_residual: x + attn(ln1(x)) + mlp(ln2(x)), a norm each; the fused q/k/v rows grouped by head
    facts={"qkv_bias": "attention_bias", "out_bias": "attention_bias", "norm_bias": True, "mlp_bias": True,
           "partial_rotary": True, "parallel": "use_parallel_residual", "shared_norm": False, "qkv_per_head": True},
    dropout_keys=("attention_dropout", "hidden_dropout"),
    inert=frozenset({"classifier_dropout"}),  # the sequence-classification head's, absent from the causal LM
    aliases={"rotary_pct": "partial_rotary_factor", "rotary_emb_base": "rope_theta"},  # older files' spellings
    check=(_common_checks,),
)


def _gptj_read(cfg: HFConfig) -> None:
    """GPT-J rotates the first rotary_dim dimensions of each head (in (2i, 2i + 1) pairs) at base 10000, fixed: its
    rotary_dim read as the common partial_rotary_factor; rope keys it ignores are refused, not read."""
    for key in ("rope_theta", "rope_parameters", "rope_scaling", "partial_rotary_factor"):
        if cfg.data.get(key) is not None:
            raise cfg.refuse(key, "GPT-J's rotary embedding ignores it (base 10000, rotary_dim wide), so a model "
                             "with it is not the one meant")
    rotary = cfg.take("rotary_dim", int, default=None)
    if rotary is None:
        raise cfg.refuse("rotary_dim", "null: GPT-J then takes its rotary frequencies over n_embd rather than a "
                         "head's width, which archspec's rope does not have")
    head_dim = cfg.take("d_model", int) // cfg.take("n_heads", int)
    if not 0 < rotary <= head_dim:
        raise cfg.refuse("rotary_dim", f"{rotary}: expected 1..{head_dim} (a head's width)")
    cfg.data["partial_rotary_factor"] = rotary / head_dim


def _gptj_write(m, out: dict) -> None:
    params = out.pop("rope_parameters")
    for key in ("rope_theta", "rope_scaling", "partial_rotary_factor"):
        out.pop(key, None)
    if params["rope_theta"] != 10000.0:
        raise HFUnsupported(f"model.attention.positional.theta: {params['rope_theta']} cannot be expressed as gptj "
                            "(its rotary base is always 10000)")
    if params["rope_type"] != "default":
        raise HFUnsupported(f"model.attention.positional.scaling: {params['rope_type']} cannot be expressed as gptj "
                            "(its rotary embedding has no scaling)")
    out["rotary_dim"] = round(params["partial_rotary_factor"] * m.attention.head_dim)


GPTJ = HFType(  # GPT-J: parallel blocks from one LayerNorm, interleaved partial rope, a biased LM head
    model_type="gptj", architecture="GPTJForCausalLM",
    blocks={"norm": "layer_norm", "positional": "rotary", "sparsity": "full_attention", "ffn": "plain_mlp"},
    keys=GPT2.keys,
    defaults={"vocab_size": 50400, "n_positions": 2048, "n_embd": 4096, "n_layer": 28, "n_head": 16, "rotary_dim": 64,
              "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False,
              "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
    names={"base": "transformer", "embed": "wte", "layers": "h", "attn": "attn", "ffn": "mlp", "attn_norm": "ln_1",
           "final_norm": "ln_f", "o": "out_proj", "up": "fc_in", "down": "fc_out"},
    facts={"qkv_bias": False, "out_bias": False, "norm_bias": True, "mlp_bias": True, "partial_rotary": True,
           "rope_interleaved": True, "parallel": True, "shared_norm": True, "lm_head_bias": True},
    dropout_keys=("resid_pdrop", "embd_pdrop", "attn_pdrop"),
    rewrite=(_gptj_read, _gptj_write),
    check=(_common_checks,),
)

PHI = HFType(  # Phi-1/1.5/2: parallel blocks from one LayerNorm, partial rope (half pairs), biases everywhere
    model_type="phi", architecture="PhiForCausalLM",
    blocks={"norm": "layer_norm", "positional": "rotary", "sparsity": "full_attention", "ffn": "plain_mlp"},
    keys=_LN_KEYS,
    defaults={"vocab_size": 51200, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
              "num_attention_heads": 32, "hidden_act": "gelu_new", "max_position_embeddings": 2048,
              "layer_norm_eps": 1e-5, "tie_word_embeddings": False, "rope_theta": 10000.0,
              "partial_rotary_factor": 0.5, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0},
    names={**_LLAMA_NAMES, "final_norm": "final_layernorm", "o": "dense", "up": "fc1", "down": "fc2"},
    facts={"qkv_bias": True, "out_bias": True, "norm_bias": True, "mlp_bias": True, "partial_rotary": True,
           "parallel": True, "shared_norm": True, "lm_head_bias": True},
    dropout_keys=("resid_pdrop", "embd_pdrop", "attention_dropout"),
    fixed={"qk_layernorm": False},
    check=(_common_checks, _must_be("qk_layernorm", False, "a LayerNorm over each head's q and k, which archspec's "
                                    "q/k norm (an RMSNorm) is not")),
)

STABLELM = HFType(  # StableLM: LayerNorms, partial rope, SwiGLU; parallel (one shared norm) by use_parallel_residual
    model_type="stablelm", architecture="StableLmForCausalLM", blocks={**_LLAMA_BLOCKS, "norm": "layer_norm"},
    keys=_LN_KEYS,
    defaults={"vocab_size": 50304, "intermediate_size": 6912, "hidden_size": 2560, "num_hidden_layers": 32,
              "num_attention_heads": 32, "hidden_act": "silu", "max_position_embeddings": 4096,
              "layer_norm_eps": 1e-5, "tie_word_embeddings": False, "rope_theta": 10000.0,
              "partial_rotary_factor": 0.25, "use_qkv_bias": False, "use_parallel_residual": False,
              "hidden_dropout": 0.0, "attention_dropout": 0.0},
    names=_LLAMA_NAMES,
    facts={"qkv_bias": "use_qkv_bias", "out_bias": False, "norm_bias": True, "partial_rotary": True,
           "parallel": "use_parallel_residual", "shared_norm": True},
    dropout_keys=("hidden_dropout", "attention_dropout"),
    fixed={"qk_layernorm": False},
    check=(_common_checks, _must_be("qk_layernorm", False, "a LayerNorm over each head's q and k, which archspec's "
                                    "q/k norm (an RMSNorm) is not")),
)

OLMO2 = HFType(  # OLMo 2: norms on the sublayers' outputs only, q/k RMSNorm over the whole projections
    model_type="olmo2", architecture="Olmo2ForCausalLM", blocks=_LLAMA_BLOCKS,
    keys={k: v for k, v in _LLAMA_KEYS.items() if k != "head_dim"},
    defaults={**_LLAMA_DEFAULTS, "vocab_size": 50304, "hidden_size": 4096, "intermediate_size": 11008,
              "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 2048,
              "rms_norm_eps": 1e-5},
    names={**_LLAMA_NAMES, "attn_post_norm": "post_attention_layernorm",
           "ffn_post_norm": "post_feedforward_layernorm"},
    norm_placement="output",
    facts={"qkv_bias": "attention_bias", "out_bias": "attention_bias", "qk_norm": True, "qk_norm_projection": True},
    dropout_keys=("attention_dropout",),
    check=(_common_checks,),
)

GLM4 = HFType(  # GLM-4-0414: GLM's block with a norm after each sublayer too (sandwich)
    model_type="glm4", architecture="Glm4ForCausalLM", blocks=_LLAMA_BLOCKS, keys=_LLAMA_KEYS,
    defaults=GLM.defaults,
    names={**GLM.names, "attn_post_norm": "post_self_attn_layernorm", "ffn_norm": "post_attention_layernorm",
           "ffn_post_norm": "post_mlp_layernorm"},
    norm_placement="sandwich",
    facts=GLM.facts,
    dropout_keys=("attention_dropout",),
    check=(_common_checks,),
)

def _gemma_read(cfg: HFConfig) -> None:
    """transformers' GemmaConfig reads `hidden_act: gelu` (in released Gemma files) as gelu_pytorch_tanh, the tanh
    approximation: read as it computes, with a note."""
    if cfg.data.get("hidden_act") == "gelu":
        cfg.data["hidden_act"] = "gelu_pytorch_tanh"
        _caution(f"{cfg.source}: hidden_act: 'gelu' is read as transformers' Gemma reads it, the tanh approximation "
                 "(gelu_tanh)")


def _gemma_write(m, out: dict) -> None:
    if out.get("hidden_act") == "gelu":  # it would be read back as the tanh form
        raise HFUnsupported("model.ffn.activation: gelu (exact) cannot be expressed as gemma (transformers' Gemma "
                            "reads hidden_act 'gelu' as the tanh approximation)")


GEMMA = HFType(  # Gemma: RMSNorm with a (1 + w) gain, embeddings scaled by sqrt(hidden_size), GeGLU, tied
    model_type="gemma", architecture="GemmaForCausalLM", blocks=_LLAMA_BLOCKS, keys=_LLAMA_KEYS,
    defaults={**_LLAMA_DEFAULTS, "vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576,
              "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256,
              "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 8192, "tie_word_embeddings": True},
    names=_LLAMA_NAMES,
    facts={"qkv_bias": "attention_bias", "out_bias": "attention_bias", "norm_unit_offset": True,
           "embedding_scale": True},
    dropout_keys=("attention_dropout",),
    check=(_common_checks, _must_be("use_bidirectional_attention", None, "archspec models are causal")),
    rewrite=(_gemma_read, _gemma_write),
)

# ── gemma2: Gemma's block with sandwich norms, soft-capped scores and logits, alternating window/global layers ──


def _gemma2_pattern(cfg: HFConfig) -> list[str]:
    """Gemma 2: `layer_types`, else (transformers' Gemma2Config) even-numbered layers slide, odd ones are global. A
    window at least as long as the context hides no key: those layers are full attention, the same function."""
    n_layers = cfg.take("n_layers", int)
    window = cfg.take("sliding_window", int, default=None)
    layer_types = cfg.take("layer_types", list, default=None)
    if layer_types is None:
        layer_types = [SLIDING if (i + 1) % 2 else FULL for i in range(n_layers)]
    _check_words(cfg, layer_types, n_layers)
    if SLIDING in layer_types and not window:
        raise cfg.refuse("sliding_window", f"{window!r}: transformers' gemma2 needs a window for its "
                         f"{SLIDING!r} layers")
    if window is not None and window >= cfg.take("context_length", int):
        return [FULL] * n_layers
    return layer_types


_gemma2_pattern.fields = ("layer_types", "sliding_window")


def _gemma2_read(cfg: HFConfig) -> None:
    """query_pre_attn_scalar q: the softmax scale q ** -0.5, read as the attention's scale (role attn_scale, this
    key); q = head_dim is 1/sqrt(head_dim), archspec's default (null)."""
    scalar = cfg.take("attn_scale", (int, float))
    if scalar <= 0:
        raise cfg.refuse("attn_scale", f"{scalar}: the softmax scale is query_pre_attn_scalar ** -0.5, so it must "
                         "be positive")
    cfg.data["query_pre_attn_scalar"] = None if scalar == cfg.take("head_dim", int) else scalar ** -0.5


def _gemma2_write(m, out: dict) -> None:
    scale, head_dim = out.pop("query_pre_attn_scalar"), m.attention.head_dim
    scalar = head_dim if scale is None else round(scale ** -2)
    if scale is not None and (scalar < 1 or scalar ** -0.5 != scale):
        raise HFUnsupported(f"model.attention.scale: {scale} cannot be expressed as gemma2 (its softmax scale is "
                            "query_pre_attn_scalar ** -0.5, an integer's; e.g. 0.0625 = 256 ** -0.5)")
    out["query_pre_attn_scalar"] = scalar
    out.setdefault("sliding_window", m.context_length)  # transformers' gemma2 needs one even when no layer slides


GEMMA2 = HFType(
    model_type="gemma2", architecture="Gemma2ForCausalLM",
    blocks={**_LLAMA_BLOCKS, "sparsity": _PATTERNS}, pick={"sparsity": _gemma2_pattern},
    keys={**_LLAMA_KEYS, "activation": "hidden_activation", "logit_softcap": "final_logit_softcapping",
          "attn_softcap": "attn_logit_softcapping", "attn_scale": "query_pre_attn_scalar"},
    # Gemma2Config's defaults (gemma-2-2b's sizes)
    defaults={**_LLAMA_DEFAULTS, "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216,
              "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
              "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 8192, "tie_word_embeddings": True,
              "query_pre_attn_scalar": 256, "sliding_window": 4096, "final_logit_softcapping": 30.0,
              "attn_logit_softcapping": 50.0},
    names={**_LLAMA_NAMES, "attn_post_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
           "ffn_post_norm": "post_feedforward_layernorm"},
    norm_placement="sandwich",
    facts=GEMMA.facts,
    dropout_keys=("attention_dropout",),
    place={"sparsity": _place_ministral_layer_types},
    # hidden_act: released files carry it beside hidden_activation, which is the one Gemma2's MLP reads;
    # cache_implementation: a generation default (the hybrid sliding/global cache)
    inert=frozenset({"hidden_act", "cache_implementation"}),
    rewrite=(_gemma2_read, _gemma2_write),
    check=(_common_checks, _must_be("use_bidirectional_attention", None, "archspec models are causal")),
)

# ── bloom: ALiBi, a LayerNorm after the embeddings, q/k/v fused per head, a 4·hidden tanh-GELU MLP, biases ──────

BLOOM_CONTEXT = 2048  # BLOOM's training sequence length (BigScience, arXiv:2211.05100, table 3)


def _bloom_context(cfg: HFConfig) -> None:
    """BloomConfig has no context length (ALiBi has no position table): archspec reads `seq_length` when a config has
    it (archspec writes it), else takes BLOOM's training length and says so."""
    if cfg.data.get("seq_length") is None:
        _caution(f"{cfg.source}: bloom configs have no context length (ALiBi needs no position table); "
                 f"model.context_length set to {BLOOM_CONTEXT}, the length BLOOM was trained at: the longest sequence "
                 "the imported model accepts (change it with --set model.context_length=N; nothing is sized by it)")


BLOOM = HFType(
    model_type="bloom", architecture="BloomForCausalLM",
    blocks={"norm": "layer_norm", "positional": "alibi", "sparsity": "full_attention", "ffn": "plain_mlp"},
    keys={"vocab_size": "vocab_size", "context_length": "seq_length", "d_model": "hidden_size", "n_layers": "n_layer",
          "n_heads": "n_head", "norm_eps": "layer_norm_epsilon", "tie": "tie_word_embeddings"},
    # BloomConfig's defaults; the MLP is always 4 · hidden_size wide with BLOOM's tanh GELU (no config key)
    defaults={"vocab_size": 250880, "hidden_size": 64, "n_layer": 2, "n_head": 8, "layer_norm_epsilon": 1e-5,
              "tie_word_embeddings": True, "hidden_dropout": 0.0, "attention_dropout": 0.0,
              "seq_length": BLOOM_CONTEXT, "activation": "gelu_pytorch_tanh"},
    names={"base": "transformer", "embed": "word_embeddings", "embed_norm": "word_embeddings_layernorm", "layers": "h",
           "attn": "self_attention", "ffn": "mlp", "attn_norm": "input_layernorm",
           "ffn_norm": "post_attention_layernorm", "final_norm": "ln_f", "qkv": "query_key_value", "o": "dense",
           "up": "dense_h_to_4h", "down": "dense_4h_to_h"},
    facts={"qkv_bias": True, "out_bias": True, "norm_bias": True, "mlp_bias": True, "embedding_norm": True,
           "qkv_per_head": True},
    dropout_keys=("hidden_dropout", "attention_dropout"),
    fixed={"apply_residual_connection_post_layernorm": False},
    aliases={"n_embed": "hidden_size", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head"},
    # pretraining_tp / slow_but_exact: Megatron's tensor-parallel slicing of the same matmuls; the rest: kernel
    # choices of the original Megatron-DeepSpeed configs (fp32 softmax, fused masking), the same function
    inert=frozenset({"pretraining_tp", "slow_but_exact", "attention_softmax_in_fp32", "masked_softmax_fusion",
                     "bias_dropout_fusion", "skip_bias_add", "skip_bias_add_qkv", "offset_alibi", "unk_token_id"}),
    check=(_common_checks, _bloom_context,
           _must_be("apply_residual_connection_post_layernorm", False, "archspec's blocks add the residual before "
                    "the norm's input, not its output")),
)

# ── mpt: ALiBi (alibi_bias_max 8: BLOOM's slopes), a fused Wqkv, no biases anywhere, a 4·d_model GELU MLP ────────
# transformers' MptModel reads attn_config's softmax_scale, clip_qkv, alibi_bias_max and attn_pdrop (the attention's
# and the blocks' dropout) and hardcodes the rest: keys it reads nowhere must hold the values it hardcodes, or the
# original model they describe would compute something else.

_MPT_ATTN_KEYS = ("attn_type", "attn_pdrop", "attn_impl", "clip_qkv", "softmax_scale", "prefix_lm", "qk_ln",
                  "attn_uses_sequence_id", "alibi", "alibi_bias_max")
_MPT_HARDCODED = {"expansion_ratio": (4, "transformers' MPT MLP is always 4 · d_model wide"),
                  "no_bias": (True, "transformers' MPT has no biases"),
                  "logit_scale": (None, "transformers' MPT does not scale its logits")}
_MPT_ATTN_FIXED = {"alibi": (True, "transformers' MPT always adds ALiBi"),
                   "alibi_bias_max": (8, "archspec's ALiBi slopes are alibi_bias_max 8's (BLOOM's)"),
                   "clip_qkv": (None, "archspec does not clamp q, k, v"), "qk_ln": (False, "transformers' MPT has none"),
                   "prefix_lm": (False, "archspec models are causal"),
                   "attn_uses_sequence_id": (False, "archspec attends across the whole window"),
                   "attn_type": ("multihead_attention", "transformers' MPT is multi-head")}


def _mpt_attn_config(cfg: HFConfig) -> None:
    """attn_config's fields onto the top level (prefixed), where the units read them (softmax_scale, attn_pdrop)."""
    raw = cfg.data.get("attn_config")
    cfg.mark("attn_config")
    if raw is not None and not isinstance(raw, dict):
        raise cfg.refuse("attn_config", f"expected a mapping, got {raw!r}")
    # a saved MptAttentionConfig carries every config's bookkeeping too (ids, output switches, is_encoder_decoder)
    attn = {k: v for k, v in (raw or {}).items()
            if k not in COMMON_INERT and not (k in ("is_encoder_decoder", "add_cross_attention") and v is False)}
    unknown = sorted(set(attn) - set(_MPT_ATTN_KEYS))
    if unknown:
        raise cfg.refuse("attn_config", f"{', '.join(unknown)}: archspec does not map them")
    for key, (value, why) in _MPT_ATTN_FIXED.items():
        if attn.get(key, value) != value:
            raise cfg.refuse("attn_config", f"{key}: {attn[key]!r}: {why}")
    for key in _MPT_ATTN_KEYS:
        if key in attn:
            cfg.data[f"attn_config.{key}"] = attn[key]
    for key, (value, why) in _MPT_HARDCODED.items():
        _must_be(key, value, why)(cfg)


def _nest_mpt_attn_config(m, out: dict) -> None:
    attn = {k.removeprefix("attn_config."): out.pop(k) for k in list(out) if k.startswith("attn_config.")}
    if attn.get("attn_pdrop") == 0:
        attn["attn_pdrop"] = 0  # MptAttentionConfig declares it an int (and refuses 0.0)
    out["attn_config"] = {"attn_type": "multihead_attention", "alibi": True, "alibi_bias_max": 8, "clip_qkv": None,
                          "qk_ln": False, "prefix_lm": False, "attn_uses_sequence_id": False, **attn}


MPT = HFType(
    model_type="mpt", architecture="MptForCausalLM",
    blocks={"norm": "layer_norm", "positional": "alibi", "sparsity": "full_attention", "ffn": "plain_mlp"},
    keys={"vocab_size": "vocab_size", "context_length": "max_seq_len", "d_model": "d_model", "n_layers": "n_layers",
          "n_heads": "n_heads", "norm_eps": "layer_norm_epsilon", "tie": "tie_word_embeddings",
          "attn_scale": "attn_config.softmax_scale"},
    defaults={"vocab_size": 50368, "d_model": 2048, "n_layers": 24, "n_heads": 16, "max_seq_len": 2048,
              "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True, "attn_config.attn_pdrop": 0.0,
              "activation": "gelu"},
    names={"base": "transformer", "embed": "wte", "layers": "blocks", "attn": "attn", "ffn": "ffn",
           "attn_norm": "norm_1", "ffn_norm": "norm_2", "final_norm": "norm_f", "qkv": "Wqkv", "o": "out_proj",
           "up": "up_proj", "down": "down_proj"},
    facts={},  # no biases: q/k/v, output, norms, MLP
    dropout_keys=("attn_config.attn_pdrop",),
    fixed={"no_bias": True, "expansion_ratio": 4, "learned_pos_emb": False},
    # read by no transformers MPT module: the original code's switches (learned_pos_emb: transformers' MPT has no
    # position table), its init and device, the dropout rates transformers replaces by attn_pdrop, attn_impl (kernel)
    inert=frozenset({"learned_pos_emb", "init_device", "embedding_fraction", "norm_type", "resid_pdrop", "emb_pdrop",
                     "attn_config.attn_impl"}),
    check=(_common_checks, _mpt_attn_config),
    rewrite=(None, _nest_mpt_attn_config),
)

# ── falcon: one fused query_key_value grouped per K/V head, LayerNorms, a GELU MLP, parallel blocks ────────────────
# falcon-7b's shape: multi-query, attention and MLP in parallel from one input_layernorm (new_decoder_architecture
# false); the new decoder architecture (falcon-40b/180b): grouped-query, q/k/v rows grouped per K/V head, two norms
# ln_attn and ln_mlp (num_ln_in_parallel_attn 2; 1: one input_layernorm). Both fuse q/k/v as [each K/V group's
# queries, its key, its value] per group (multi-query: one group; multi-head without the new architecture: one per
# head), the layout HFWeight regroups to archspec's (all queries, all keys, all values). The norms' module names
# depend on the shape, so there are two types of model_type falcon; `VARIANTS` picks one from a config.

_FALCON_KEYS = {"vocab_size": "vocab_size", "context_length": "max_position_embeddings", "d_model": "hidden_size",
                "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads", "n_kv_heads": "num_kv_heads",
                "ffn_hidden": "ffn_hidden_size", "activation": "activation", "norm_eps": "layer_norm_epsilon",
                "tie": "tie_word_embeddings"}
_FALCON_NAMES = {"base": "transformer", "embed": "word_embeddings", "layers": "h", "attn": "self_attention",
                 "ffn": "mlp", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                 "final_norm": "ln_f", "qkv": "query_key_value", "o": "dense", "up": "dense_h_to_4h",
                 "down": "dense_4h_to_h"}
# FalconConfig's defaults (falcon-7b's sizes; num_kv_heads null: the query heads; ffn_hidden_size null: 4 · hidden)
_FALCON_DEFAULTS = {"vocab_size": 65024, "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
                    "layer_norm_epsilon": 1e-5, "hidden_dropout": 0.0, "attention_dropout": 0.0, "alibi": False,
                    "new_decoder_architecture": False, "multi_query": True, "parallel_attn": True, "bias": False,
                    "max_position_embeddings": 2048, "activation": "gelu", "tie_word_embeddings": True,
                    "rope_theta": 10000.0}
_FALCON_FACTS = {"qkv_bias": "bias", "out_bias": "bias", "mlp_bias": "bias", "norm_bias": True, "qkv_per_head": True}


def _falcon_two_norms(data: dict) -> bool:
    """The new decoder architecture with its two norms (num_ln_in_parallel_attn null or 2): ln_attn and ln_mlp."""
    return data.get("new_decoder_architecture") is True and data.get("num_ln_in_parallel_attn") in (None, 2)


def _falcon_read(cfg: HFConfig) -> None:
    """Falcon's switches → one block shape and the K/V heads its fused projection holds; combinations transformers'
    FalconDecoderLayer cannot run, and ALiBi, refused by name."""
    if cfg.take("alibi", bool, default=False):
        raise cfg.refuse("alibi", "true: Falcon adds ALiBi divided by sqrt(head_dim) with its slope·distance rounded "
                         "to bfloat16, which archspec's ALiBi (BLOOM's slopes, unscaled, fp32) does not compute")
    new = cfg.take("new_decoder_architecture", bool, default=False)
    multi_query = cfg.take("multi_query", bool, default=True)
    parallel = cfg.take("parallel_attn", bool, default=True)
    n_ln = cfg.take("num_ln_in_parallel_attn", int, default=None)
    n_heads = cfg.take("n_heads", int)
    kv = cfg.take("n_kv_heads", int, default=n_heads)
    if new and not parallel:
        raise cfg.refuse("parallel_attn", "false with new_decoder_architecture: transformers' FalconDecoderLayer "
                         "then builds norms its forward does not use (it cannot run)")
    if n_ln not in (None, 1, 2) or (n_ln == 2 and not new and parallel):
        raise cfg.refuse("num_ln_in_parallel_attn", f"{n_ln!r}: transformers' Falcon runs 1 or 2 with "
                         "new_decoder_architecture, and null otherwise")
    if not new:
        if not multi_query and kv != n_heads:
            raise cfg.refuse("num_kv_heads", f"{kv}: without new_decoder_architecture or multi_query Falcon's "
                             f"query_key_value holds every head's key and value ({n_heads})")
        kv = 1 if multi_query else n_heads
    if n_heads % kv:
        raise cfg.refuse("num_kv_heads", f"{kv}: must divide num_attention_heads ({n_heads})")
    derived = cfg.data.get("num_key_value_heads")  # FalconConfig writes the heads it derived; they must agree
    cfg.mark("num_key_value_heads")
    if derived is not None and derived != kv:
        raise cfg.refuse("num_key_value_heads", f"{derived!r}, but the switches above give {kv} K/V heads")
    cfg.data["num_kv_heads"] = kv


def _falcon_write(m, out: dict) -> None:
    """The K/V heads and block shape in Falcon's switches: multi-query or multi-head without the new architecture
    (falcon-7b's layouts), grouped-query with it."""
    n_heads, kv = m.attention.n_heads, m.attention.n_kv_heads
    two_norms = out.pop("falcon.two_norms")
    parallel = out.get("parallel_attn", True)
    new = two_norms or kv not in (1, n_heads)
    if new and not parallel:
        raise HFUnsupported(f"model.attention.n_kv_heads: {kv} cannot be expressed as falcon with a sequential block "
                            "(grouped-query needs its new decoder architecture, whose blocks are parallel)")
    out.update(new_decoder_architecture=new, multi_query=kv == 1, parallel_attn=parallel, alibi=False,
               num_ln_in_parallel_attn=(2 if two_norms else 1) if new else None)


def _falcon_mark(two_norms: bool):
    def write(m, out: dict) -> None:
        out["falcon.two_norms"] = two_norms
        _falcon_write(m, out)
    return write


FALCON = HFType(  # falcon-7b's shape: parallel from one input_layernorm (or sequential, parallel_attn false)
    model_type="falcon", architecture="FalconForCausalLM",
    blocks={"norm": "layer_norm", "positional": "rotary", "sparsity": "full_attention", "ffn": "plain_mlp"},
    keys=_FALCON_KEYS, defaults=_FALCON_DEFAULTS, names=_FALCON_NAMES,
    facts={**_FALCON_FACTS, "parallel": "parallel_attn", "shared_norm": True},
    dropout_keys=("hidden_dropout", "attention_dropout"),
    aliases={"n_embed": "hidden_size"},  # FalconConfig's older spelling
    # apply_residual_connection_post_layernorm: in RefinedWeb-era files, read by no transformers Falcon module
    inert=frozenset({"apply_residual_connection_post_layernorm"}),
    rewrite=(_falcon_read, _falcon_mark(False)),
    check=(_common_checks,),
)

FALCON_NEW = HFType(  # the new decoder architecture's two norms: ln_attn before attention, ln_mlp before the MLP
    model_type="falcon", architecture="FalconForCausalLM",
    blocks=FALCON.blocks, keys=_FALCON_KEYS, defaults=_FALCON_DEFAULTS,
    names={**_FALCON_NAMES, "attn_norm": "ln_attn", "ffn_norm": "ln_mlp"},
    facts={**_FALCON_FACTS, "parallel": True, "shared_norm": False},
    dropout_keys=FALCON.dropout_keys, aliases=FALCON.aliases, inert=FALCON.inert,
    fixed={"parallel_attn": True},
    rewrite=(_falcon_read, _falcon_mark(True)),
    check=(_common_checks,),
)

# A model type whose module names depend on its config: the callable (config dict) → the HFType that reads it.
VARIANTS = {"falcon": lambda data: FALCON_NEW if _falcon_two_norms(data) else FALCON}

# ── gpt_oss (OpenAI gpt-oss): attention sinks, alternating window/full layers, biased experts with a clamped SwiGLU ──


def _gpt_oss_pattern(cfg: HFConfig) -> list[str]:
    """gpt-oss: `layer_types`, else (transformers' GptOssConfig) even-numbered layers slide, odd ones attend fully; a
    window at least as long as the context hides no key (those layers are full attention, the same function)."""
    n_layers = cfg.take("n_layers", int)
    window = cfg.take("sliding_window", int, default=None)
    layer_types = cfg.take("layer_types", list, default=None)
    if layer_types is None:
        layer_types = [SLIDING if (i + 1) % 2 else FULL for i in range(n_layers)]
    _check_words(cfg, layer_types, n_layers)
    if SLIDING in layer_types and not window:
        raise cfg.refuse("sliding_window", f"{window!r}: transformers' gpt_oss needs a window for its "
                         f"{SLIDING!r} layers")
    if window is not None and window >= cfg.take("context_length", int):
        return [FULL] * n_layers
    return layer_types


_gpt_oss_pattern.fields = ("layer_types", "sliding_window")

# GptOssConfig's rope when a config gives none: yarn, 32× from 4096 positions, the ramp's ends not rounded
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


def _gpt_oss_read(cfg: HFConfig) -> None:
    """What transformers' GptOssConfig assumes or ignores: its yarn rope when the config names none; OpenAI's own
    keys beside transformers' (experts_per_token, which must agree with num_experts_per_tok; initial_context_length,
    which no module reads); quantization_config (the released files keep the experts in MXFP4): the architecture is
    read, and a weights import of such files is refused by their integer tensors."""
    if cfg.data.get("rope_parameters") is None and cfg.data.get("rope_scaling") is None:
        cfg.data["rope_parameters"] = dict(GPT_OSS_ROPE)
    experts = cfg.data.get("experts_per_token")
    cfg.mark("experts_per_token", "initial_context_length")
    if experts is not None and experts != cfg.take("top_k", int):
        raise cfg.refuse("experts_per_token", f"{experts!r} contradicts num_experts_per_tok "
                         f"({cfg.take('top_k', int)}), which transformers reads")
    if cfg.data.get("quantization_config") is not None:
        cfg.mark("quantization_config")
        _caution(f"{cfg.source}: quantization_config: the files' weights are quantized "
                 f"({printable(repr(cfg.data['quantization_config'].get('quant_method')) if isinstance(cfg.data['quantization_config'], dict) else '?', 40)}); "
                 "the architecture is imported, the weights only from dequantized (bf16/fp32) files")


GPT_OSS = HFType(
    model_type="gpt_oss", architecture="GptOssForCausalLM",
    blocks={**_LLAMA_BLOCKS, "sparsity": _PATTERNS, "ffn": "sparse_moe"}, pick={"sparsity": _gpt_oss_pattern},
    keys={**_MOE_KEYS, "n_experts": "num_local_experts", "expert_hidden": "intermediate_size",
          "swiglu_limit": "swiglu_limit", "swiglu_alpha": "swiglu_alpha"},
    # GptOssConfig's defaults (its rope: GPT_OSS_ROPE, by the rewrite)
    defaults={**_LLAMA_DEFAULTS, "rope_theta": 150000.0, "rms_norm_eps": 1e-5, "vocab_size": 201088,
              "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64,
              "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072, "sliding_window": 128,
              "num_experts_per_tok": 4, "num_local_experts": 128, "router_aux_loss_coef": 0.001,
              "swiglu_limit": 7.0, "swiglu_alpha": 1.702, "attention_bias": True},
    names={**_MOE_NAMES, "router": "router", "sinks": "sinks"},
    # q/k/v and o biases by one key; every attention layer has sinks; experts with biases, stored fused (gate and up
    # interleaved in gate_up_proj, transposed); a router with a bias; top-k then softmax over the chosen (renormalised)
    facts={"qkv_bias": "attention_bias", "out_bias": "attention_bias", "sinks": True, "expert_bias": True,
           "router_bias": True, "renormalize": True, "fused_experts": True},
    dropout_keys=("attention_dropout",),
    place={"sparsity": _place_ministral_layer_types},
    aliases={"num_experts": "num_local_experts"},
    rewrite=(_gpt_oss_read, None),
    check=(_common_checks,),
)

# ── LFM2 (Liquid AI): gated short-conv layers and GQA layers with q/k norm, by `layer_types` ─────────────────────

_LFM2_CONV = "conv"  # transformers' word for a short-conv layer in Lfm2Config.layer_types


def _lfm2_mixers(cfg: HFConfig) -> list[str]:
    """Each layer's token mixer, as transformers decides: `layer_types` ("conv" | "full_attention"), else
    full_attn_idxs (the attention layers; absent: every layer attends). In HF's words: "attention" (the type's
    attention block) or "conv" (its short conv)."""
    n_layers = cfg.take("n_layers", int)
    layer_types = cfg.take("layer_types", list, default=None)
    idxs = cfg.take_layers("full_attn_idxs", n_layers, default=None)
    if layer_types is None:
        idxs = list(range(n_layers)) if idxs is None else idxs
        layer_types = [FULL if i in idxs else _LFM2_CONV for i in range(n_layers)]
    if len(layer_types) != n_layers:
        raise cfg.refuse("layer_types", f"{len(layer_types)} entries for {n_layers} layers")
    odd = sorted({repr(t) for t in layer_types if t not in (FULL, _LFM2_CONV)})
    if odd:
        raise cfg.refuse("layer_types", f"{', '.join(odd)}: archspec maps {FULL!r} and {_LFM2_CONV!r}")
    if _LFM2_CONV not in layer_types:  # transformers writes the conv's keys into every config; no layer reads them
        cfg.mark(cfg.key("conv_L_cache"), cfg.key("conv_bias"))
    return ["attention" if t == FULL else _LFM2_CONV for t in layer_types]


_lfm2_mixers.fields = ("layer_types", "full_attn_idxs")


def _place_lfm2_mixers(out: dict, words: list[str]) -> None:
    out["layer_types"] = [FULL if w == "attention" else w for w in words]
    out["full_attn_idxs"] = [i for i, w in enumerate(words) if w == "attention"]


def _lfm2_read(cfg: HFConfig) -> None:
    """Lfm2MLP's width: intermediate_size as written unless block_auto_adjust_ff_dim, when transformers takes 2/3 of
    it, times block_ffn_dim_multiplier, rounded up to a multiple of block_multiple_of (read as the width it builds)."""
    width = cfg.take("ffn_hidden", int)
    if cfg.take("block_auto_adjust_ff_dim", bool):
        width = int(2 * width / 3)
        multiplier = cfg.take("block_ffn_dim_multiplier", (int, float), default=None)
        if multiplier is not None:
            multiple = cfg.take("block_multiple_of", int)
            if multiple < 1:
                raise cfg.refuse("block_multiple_of", f"{multiple}: must be at least 1")
            width = multiple * ((int(multiplier * width) + multiple - 1) // multiple)
    cfg.mark("block_ffn_dim_multiplier", "block_multiple_of")
    cfg.data[cfg.key("ffn_hidden")] = width


LFM2 = HFType(
    model_type="lfm2", architecture="Lfm2ForCausalLM",
    blocks={**_LLAMA_BLOCKS, "mixer": ("attention", _LFM2_CONV)}, pick={"mixer": _lfm2_mixers},
    place={"mixer": _place_lfm2_mixers},
    keys={**{k: v for k, v in _LLAMA_KEYS.items() if k not in ("head_dim", "activation")}, "norm_eps": "norm_eps",
          "conv_L_cache": "conv_L_cache", "conv_bias": "conv_bias"},
    defaults={"vocab_size": 65536, "hidden_size": 2560, "intermediate_size": 12288, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 128_000,
              "norm_eps": 1e-5, "tie_word_embeddings": True, "rope_theta": 1000000.0, "conv_bias": False,
              "conv_L_cache": 3, "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0,
              "block_auto_adjust_ff_dim": True, "activation": "silu"},  # Lfm2MLP: always SwiGLU (no key)
    names={"base": "model", "embed": "embed_tokens", "layers": "layers", "attn": "self_attn", "conv": "conv",
           "ffn": "feed_forward", "attn_norm": "operator_norm", "ffn_norm": "ffn_norm", "final_norm": "embedding_norm",
           "o": "out_proj", "gate": "w1", "up": "w3", "down": "w2", "q_norm": "q_layernorm", "k_norm": "k_layernorm"},
    facts={"qk_norm": True},
    fixed={"block_auto_adjust_ff_dim": False},  # intermediate_size is then the width built
    rewrite=(_lfm2_read, None),
    check=(_common_checks,),
)


# ── Mamba-2 (state-spaces): every layer a Mamba-2 mixer, no FFN (Mamba2Block: norm → mixer → residual) ────────────

_MAMBA2_CONTEXT = 4096  # Mamba2Config has no context length (a recurrent model reads any): what an import takes


def _mamba2_read(cfg: HFConfig) -> None:
    """Mamba2Config has no context length: the one archspec exports (max_position_embeddings), else 4096, said."""
    if cfg.key("context_length") not in cfg.data:
        _caution(f"{cfg.source}: mamba2 configs have no context length (the model is recurrent): "
                 f"model.context_length = {_MAMBA2_CONTEXT}; set it with --set model.context_length=N")


def _one_norm_eps(m, out: dict) -> None:
    """Mamba-2 types have one epsilon key for the block norms and each Mamba-2 mixer's gated norm (Mamba2's
    layer_norm_epsilon, Bamba's rms_norm_eps): a spec whose mixer's norm_eps differs from its layer's norm cannot be
    written (one of the two would be silently replaced)."""
    from archspec.hf.convert import _named

    for i, block in enumerate(m.blocks()):
        mixer = block.token_mixer
        if mixer.kind == "mamba2" and block.norm.eps != mixer.norm_eps:
            raise HFUnsupported(f"{_named(m, ('model', 'mixer'), i, '.norm_eps')}: {mixer.norm_eps} differs from the "
                                f"layer's norm eps {block.norm.eps}; {out.get('model_type', 'this type')} has one "
                                "epsilon for both")


MAMBA2 = HFType(
    model_type="mamba2", architecture="Mamba2ForCausalLM",
    blocks={"norm": "rms_norm", "ffn": "no_mlp", "mixer": ("mamba2",)},
    pick={"mixer": lambda cfg: ["mamba2"] * cfg.take("n_layers", int)},
    place={"mixer": lambda out, words: None},  # every layer is Mamba-2: nothing per layer to write
    keys={"vocab_size": "vocab_size", "context_length": "max_position_embeddings", "d_model": "hidden_size",
          "n_layers": "num_hidden_layers", "tie": "tie_word_embeddings", "norm_eps": "layer_norm_epsilon",
          "ssm_heads": "num_heads", "ssm_head_dim": "head_dim", "ssm_expand": "expand", "ssm_state": "state_size",
          "ssm_groups": "n_groups", "ssm_conv": "conv_kernel", "ssm_chunk": "chunk_size",
          "ssm_conv_bias": "use_conv_bias", "ssm_bias": "use_bias", "ssm_norm_eps": "layer_norm_epsilon",
          "ssm_time_step_limit": "time_step_limit", "ssm_act": "hidden_act"},
    defaults={"vocab_size": 32768, "hidden_size": 4096, "num_hidden_layers": 64, "layer_norm_epsilon": 1e-5,
              "tie_word_embeddings": False, "num_heads": 128, "head_dim": 64, "expand": 2, "state_size": 128,
              "n_groups": 8, "conv_kernel": 4, "chunk_size": 256, "use_conv_bias": True, "use_bias": False,
              "hidden_act": "silu", "max_position_embeddings": _MAMBA2_CONTEXT},
    names={"base": "backbone", "embed": "embeddings", "layers": "layers", "ssm": "mixer", "attn_norm": "norm",
           "final_norm": "norm_f"},
    # init-only settings (weights are loaded, not drawn), and the residual's dtype (fp32 already in fp32 models)
    inert=frozenset({"time_step_rank", "time_step_min", "time_step_max", "time_step_floor",
                     "rescale_prenorm_residual", "residual_in_fp32"}),
    rewrite=(_mamba2_read, _one_norm_eps),
    check=(_common_checks,),
)


# ── Qwen3-Next: Gated DeltaNet and gated-attention layers by `layer_types`, a sparse MoE with a gated shared expert ──

_LINEAR = "linear_attention"  # transformers' word for a Gated DeltaNet layer in Qwen3NextConfig.layer_types
_GDN_KEYS = ("linear_num_value_heads", "linear_num_key_heads", "linear_key_head_dim", "linear_value_head_dim",
             "linear_conv_kernel_dim")


def _qwen3_next_mixers(cfg: HFConfig) -> list[str]:
    """Each layer's token mixer, as transformers decides: `layer_types` ("linear_attention" | "full_attention"); a
    file without it has every fourth layer attend (full_attention_interval, default 4). In HF's words: "attention"
    (the type's attention block) or "linear_attention" (Gated DeltaNet)."""
    n_layers = cfg.take("n_layers", int)
    layer_types = cfg.take("layer_types", list, default=None)
    if layer_types is None:
        every = cfg.take("full_attention_interval", int, default=4)
        if every < 1:
            raise cfg.refuse("full_attention_interval", f"{every}: must be at least 1")
        layer_types = [_LINEAR if (i + 1) % every else FULL for i in range(n_layers)]
    cfg.mark("full_attention_interval")
    if len(layer_types) != n_layers:
        raise cfg.refuse("layer_types", f"{len(layer_types)} entries for {n_layers} layers")
    odd = sorted({repr(t) for t in layer_types if t not in (FULL, _LINEAR)})
    if odd:
        raise cfg.refuse("layer_types", f"{', '.join(odd)}: archspec maps {FULL!r} and {_LINEAR!r}")
    if _LINEAR not in layer_types:  # every config carries the linear layers' keys; no layer reads them
        cfg.mark(*(cfg.key(k) for k in _GDN_KEYS))
    return ["attention" if t == FULL else _LINEAR for t in layer_types]


_qwen3_next_mixers.fields = ("layer_types", "full_attention_interval")


def _place_qwen3_next_mixers(out: dict, words: list[str]) -> None:
    out["layer_types"] = [FULL if w == "attention" else w for w in words]


QWEN3_NEXT = HFType(
    model_type="qwen3_next", architecture="Qwen3NextForCausalLM",
    blocks={**_LLAMA_BLOCKS, "ffn": ("sparse_moe", "gated_mlp"), "mixer": ("attention", _LINEAR)},
    pick={"ffn": _qwen2_moe_ffn, "mixer": _qwen3_next_mixers},
    place={"ffn": _place_qwen2_moe_ffn, "mixer": _place_qwen3_next_mixers},
    keys={**_MOE_KEYS, "n_experts": "num_experts", "expert_hidden": "moe_intermediate_size",
          "shared_hidden": "shared_expert_intermediate_size", **{k: k for k in _GDN_KEYS}},
    defaults={**_LLAMA_DEFAULTS, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
              "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
              "max_position_embeddings": 32768, "attention_bias": False, "partial_rotary_factor": 0.25,
              "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
              "linear_num_key_heads": 16, "linear_num_value_heads": 32, "decoder_sparse_step": 1,
              "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "num_experts_per_tok": 10,
              "num_experts": 512, "norm_topk_prob": True, "router_aux_loss_coef": 0.001},
    names={**_MOE_NAMES, "linear_attn": "linear_attn"},
    # Qwen3's attention with each head's output gate in q_proj; every RMSNorm (1 + w) (the q/k norms stored as w);
    # one shared expert, always on, gated by sigmoid(x · w), as Qwen2-MoE
    facts={"qkv_bias": "attention_bias", "out_bias": "attention_bias", "qk_norm": True, "qk_norm_unit_offset": True,
           "output_gate": True, "norm_unit_offset": True, "partial_rotary": True, "renormalize": "norm_topk_prob",
           "shared_expert": True, "shared_gate": True},
    dropout_keys=("attention_dropout",),
    check=(_common_checks,),
)


# ── Bamba (IBM): Mamba-2 and GQA layers by attn_layer_indices, each followed by a SwiGLU; partial rotary (half) ──────

_BAMBA_SSM_KEYS = ("mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_expand",
                   "mamba_chunk_size", "mamba_conv_bias", "mamba_proj_bias", "time_step_limit")


def _bamba_mixers(cfg: HFConfig) -> list[str]:
    """Each layer's token mixer, as transformers decides (BambaConfig.layers_block_type): the layers in
    attn_layer_indices attend, every other one is a Mamba-2 mixer (absent or empty: all Mamba-2)."""
    n_layers = cfg.take("n_layers", int)
    idxs = cfg.take_layers("attn_layer_indices", n_layers, default=None) or []
    words = ["attention" if i in idxs else "mamba2" for i in range(n_layers)]
    if "mamba2" not in words:  # every config carries the Mamba-2 keys; no layer reads them
        cfg.mark(*_BAMBA_SSM_KEYS)
    return words


_bamba_mixers.fields = ("attn_layer_indices",)


def _place_bamba_mixers(out: dict, words: list[str]) -> None:
    out["attn_layer_indices"] = [i for i, w in enumerate(words) if w == "attention"]


def _bamba_read(cfg: HFConfig) -> None:
    """BambaConfig's own rules: mamba_d_head "auto" is mamba_expand · hidden_size // mamba_n_heads; the rotary
    fraction is rope_parameters.partial_rotary_factor, else 0.5 whatever the top-level key says (transformers
    overwrites it), so a top-level value other than 0.5 without the nested one is refused (it would be ignored)."""
    z_loss = cfg.data.get("z_loss_coefficient")
    if isinstance(z_loss, int | float) and not isinstance(z_loss, bool) and z_loss != 0:
        _caution(f"{cfg.source}: z_loss_coefficient: {z_loss!r} weighs a term of BambaForCausalLM's training loss "
                 "(the mean squared logsumexp of the logits) that archspec's loop does not add; the weights import "
                 "as they are, and a run trained from them has no such term")
    if cfg.data.get("mamba_d_head", "auto") == "auto":
        heads = cfg.take("ssm_heads", int)
        cfg.data["mamba_d_head"] = cfg.take("ssm_expand", int) * cfg.take("d_model", int) // max(heads, 1)
    params = cfg.data.get("rope_parameters")
    nested = isinstance(params, dict) and "partial_rotary_factor" in params
    top = cfg.data.get("partial_rotary_factor")
    if not nested and top is not None:
        if top != 0.5:
            raise cfg.refuse("partial_rotary_factor", f"{top!r}: bamba ignores it (transformers rotates half of each "
                             "head unless rope_parameters.partial_rotary_factor says otherwise)")
        cfg.data.pop("partial_rotary_factor")
        cfg.mark("partial_rotary_factor")


def _bamba_write(m, out: dict) -> None:
    """One hidden_act drives both the SwiGLU and the Mamba-2 conv's activation: a spec whose FFN is gated by
    another activation than silu cannot be written as bamba while it has a Mamba-2 layer. One rms_norm_eps too."""
    _one_norm_eps(m, out)
    act = out.get("hidden_act", "silu")
    if act not in ("silu", "swish") and any(w == "mamba2" for w in _bamba_words(out)):
        raise HFUnsupported(f"model.ffn.activation: {act} cannot be expressed as bamba with Mamba-2 layers "
                            "(its hidden_act also drives the Mamba-2 conv, which archspec follows by silu)")


def _bamba_words(out: dict) -> list[str]:
    n = out.get("num_hidden_layers", 0)
    idxs = out.get("attn_layer_indices") or []
    return ["attention" if i in idxs else "mamba2" for i in range(n)]


BAMBA = HFType(
    model_type="bamba", architecture="BambaForCausalLM",
    blocks={**_LLAMA_BLOCKS, "mixer": ("attention", "mamba2")}, pick={"mixer": _bamba_mixers},
    place={"mixer": _place_bamba_mixers},
    keys={**{k: v for k, v in _LLAMA_KEYS.items() if k != "head_dim"},  # hidden_size // num_attention_heads wide
          "ssm_heads": "mamba_n_heads", "ssm_head_dim": "mamba_d_head", "ssm_expand": "mamba_expand",
          "ssm_state": "mamba_d_state", "ssm_groups": "mamba_n_groups", "ssm_conv": "mamba_d_conv",
          "ssm_chunk": "mamba_chunk_size", "ssm_conv_bias": "mamba_conv_bias", "ssm_bias": "mamba_proj_bias",
          "ssm_norm_eps": "rms_norm_eps", "ssm_time_step_limit": "time_step_limit", "ssm_act": "hidden_act"},
    # BambaConfig's defaults (Bamba-9B's)
    defaults={**_LLAMA_DEFAULTS, "rms_norm_eps": 1e-5, "vocab_size": 128000, "hidden_size": 4096,
              "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "max_position_embeddings": 262144, "attention_bias": False, "mlp_bias": False,
              "partial_rotary_factor": 0.5, "mamba_n_heads": 128, "mamba_n_groups": 1, "mamba_d_state": 256,
              "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256, "mamba_conv_bias": True,
              "mamba_proj_bias": False},
    names={**_LLAMA_NAMES, "ffn": "feed_forward", "ffn_norm": "pre_ff_layernorm", "final_norm": "final_layernorm",
           "ssm": "mamba"},
    facts={"qkv_bias": "attention_bias", "out_bias": "attention_bias", "mlp_bias": "mlp_bias", "partial_rotary": True},
    dropout_keys=("attention_dropout",),
    # how many logits generation keeps, a training loss term
    inert=frozenset({"num_logits_to_keep", "z_loss_coefficient"}),
    rewrite=(_bamba_read, _bamba_write),
    check=(_common_checks,),
)

# ── IDEFICS (transformers' open Flamingo): a LLaMA-shaped decoder, with gated cross-attention layers and a Perceiver
# resampler beside it (model.media, archspec.hf.idefics); its vision encoder is left out (its features are the media)

IDEFICS = HFType(
    model_type="idefics", architecture="IdeficsForVisionText2Text", blocks=_LLAMA_BLOCKS,
    keys={k: v for k, v in _LLAMA_KEYS.items() if k not in ("n_kv_heads", "head_dim")},  # MHA, hidden // heads wide
    # IdeficsConfig's defaults (idefics-9b's)
    defaults={**_LLAMA_DEFAULTS, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
              "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 2048, "dropout": 0.0,
              "additional_vocab_size": 0, "alpha_type": "float", "cross_layer_interval": 1, "qk_layer_norms": False,
              "use_resampler": False},
    names=_LLAMA_NAMES,
    dropout_keys=("dropout",),
    # which parameters train (freeze_*), how the gates were drawn (weights are loaded, not drawn)
    inert=frozenset({"freeze_text_layers", "freeze_text_module_exceptions", "freeze_lm_head", "freeze_vision_layers",
                     "freeze_vision_module_exceptions", "alpha_initializer", "alphas_initializer_range"}),
    media=IdeficsMedia(),
    check=(_common_checks,),
)

TYPES: dict[str, HFType] = {t.model_type: t for t in (GPT2, LLAMA, QWEN2, QWEN3, MISTRAL, MINISTRAL, MIXTRAL,
                                                              QWEN2_MOE, QWEN3_MOE, PHI3, GLM, DEEPSEEK_V3,
                                                              GPT_NEOX, GPTJ, PHI, STABLELM, OLMO2, GLM4, GEMMA,
                                                              GEMMA2, BLOOM, MPT, FALCON, LFM2, MAMBA2,
                                                              QWEN3_NEXT, BAMBA, GPT_OSS, IDEFICS)}

# Preference when exporting: the first type that expresses the spec (gpt2 before llama: a learned-position model
# can only be gpt2; llama before qwen2/qwen3/mistral: the plainest type that fits; mistral (one pattern) before
# ministral (a pattern per layer); mixtral before qwen2_moe; the types with a rotary fraction last: phi3 (half pairs),
# glm (interleaved); deepseek_v3 (latent attention) after them).
# The block-shape types (issue 26) come after them: each fits only specs with its own shape or norm.
EXPORT_ORDER = (GPT2, LLAMA, QWEN2, QWEN3, MISTRAL, MINISTRAL, MIXTRAL, QWEN2_MOE, QWEN3_MOE, PHI3, GLM, DEEPSEEK_V3,
                GPT_NEOX, GPTJ, PHI, STABLELM, OLMO2, GLM4, GEMMA, GEMMA2, BLOOM, MPT, FALCON, FALCON_NEW, LFM2,
                MAMBA2, QWEN3_NEXT, BAMBA, GPT_OSS, IDEFICS)

# Known model types that need a building block no archspec kind provides yet: refused by name, with the reason.
PENDING: dict[str, str] = {
    "cohere": "a multiplier on the logits (logit_scale) and a per-head LayerNorm q/k norm (use_qk_norm)",
    "gemma3": "per-layer rope bases (rope_local_base_freq)",
    # Mamba-2 hybrids (issue 45)
    "nemotron_h": "layers that are an MLP alone, with no token mixer (hybrid_override_pattern '-')",
    "falcon_h1": "attention and Mamba-2 side by side in one layer (a parallel pair of token mixers) and its "
                 "per-part multipliers (attention_in_multiplier, ssm_multipliers, ...)",
}
