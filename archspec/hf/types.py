"""The transformers model types archspec reads and writes: for each, the HF building blocks it is made of (in HF's
words; each kind unit says which one it is), its config keys, its defaults (what transformers assumes when a key is
absent), its module names, and the keys that do not change what the model computes.

A type whose building block no registered kind provides (sliding-window attention, a mixture of experts) is
refused by name when a config needs it; it works as soon as a kind with that `hf_block` is registered.
"""

from __future__ import annotations

from archspec.kinds.hf import HFConfig, HFType

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


def _one_pattern(cfg: HFConfig) -> str:
    """Qwen2/Qwen3: `layer_types` (5.x) or use_sliding_window + max_window_layers (older) say which layers slide."""
    n_layers = cfg.take("n_layers", int)
    layer_types = cfg.take("layer_types", list, default=None)
    sliding = cfg.take("use_sliding_window", bool, default=False)
    window = cfg.take("sliding_window", int, default=None)
    first = cfg.take("max_window_layers", int, default=n_layers)
    if layer_types is None:
        layer_types = ["sliding_attention" if sliding and window and i >= first else "full_attention"
                       for i in range(n_layers)]
    if len(layer_types) != n_layers:
        raise cfg.refuse("layer_types", f"{len(layer_types)} entries for {n_layers} layers")
    kinds = set(layer_types)
    if len(kinds) > 1:
        raise cfg.refuse("layer_types", f"a per-layer mix of {sorted(kinds)}: no archspec spec expresses it yet")
    return kinds.pop()


def _mistral_pattern(cfg: HFConfig) -> str:
    """A window at least as long as the context hides no key: full attention, the same function."""
    window = cfg.take("sliding_window", int, default=None)
    return "sliding_attention" if window and window < cfg.take("context_length", int) else "full_attention"


_one_pattern.fields = ("layer_types", "use_sliding_window", "sliding_window", "max_window_layers")
_mistral_pattern.fields = ("sliding_window",)


_ONE_PATTERN = ("full_attention", "sliding_attention")  # one pattern for every layer, the config says which

_LLAMA_KEYS = {"vocab_size": "vocab_size", "context_length": "max_position_embeddings", "d_model": "hidden_size",
               "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
               "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim", "ffn_hidden": "intermediate_size",
               "activation": "hidden_act", "norm_eps": "rms_norm_eps", "tie": "tie_word_embeddings"}
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
    blocks={**_LLAMA_BLOCKS, "sparsity": _ONE_PATTERN}, pick={"sparsity": _one_pattern}, keys=_LLAMA_KEYS,
    defaults={**_LLAMA_DEFAULTS, "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "max_position_embeddings": 32768},
    names=_LLAMA_NAMES,
    facts={"qkv_bias": True, "out_bias": False},  # bias on q, k, v only
    dropout_keys=("attention_dropout",),
    fixed={"use_sliding_window": False, "sliding_window": None},
    check=(_common_checks,),
)

QWEN3 = HFType(
    model_type="qwen3", architecture="Qwen3ForCausalLM",
    blocks={**_LLAMA_BLOCKS, "sparsity": _ONE_PATTERN}, pick={"sparsity": _one_pattern}, keys=_LLAMA_KEYS,
    defaults={**QWEN2.defaults, "head_dim": 128},
    names=_LLAMA_NAMES,
    facts={"qkv_bias": "attention_bias", "out_bias": "attention_bias", "qk_norm": True},
    dropout_keys=("attention_dropout",),
    fixed={"use_sliding_window": False, "sliding_window": None},
    check=(_common_checks,),
)

MISTRAL = HFType(
    model_type="mistral", architecture="MistralForCausalLM",
    blocks={**_LLAMA_BLOCKS, "sparsity": _ONE_PATTERN}, pick={"sparsity": _mistral_pattern}, keys=_LLAMA_KEYS,
    defaults={**_LLAMA_DEFAULTS, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "max_position_embeddings": 4096 * 32, "sliding_window": 4096},
    names=_LLAMA_NAMES,
    dropout_keys=("attention_dropout",),
    fixed={"sliding_window": None},
    check=(_common_checks,),
)

TYPES: dict[str, HFType] = {t.model_type: t for t in (GPT2, LLAMA, QWEN2, QWEN3, MISTRAL)}

# Preference when exporting: the first type that expresses the spec (gpt2 before llama: a learned-position model
# can only be gpt2; llama before qwen2/qwen3/mistral: the plainest type that fits).
EXPORT_ORDER = (GPT2, LLAMA, QWEN2, QWEN3, MISTRAL)

# Known model types that need a building block no archspec kind provides yet: refused by name, with the reason.
PENDING = {
    "mixtral": "a mixture-of-experts FFN kind with HF interop (sparse MoE blocks)",
    "qwen2_moe": "a mixture-of-experts FFN kind with a shared expert, and per-layer FFN kinds "
                 "(decoder_sparse_step, mlp_only_layers)",
    "qwen3_moe": "a mixture-of-experts FFN kind and per-layer FFN kinds (decoder_sparse_step, mlp_only_layers)",
}
