"""Accounting promises: exact params (== numel of the generated module) and forward FLOPs (== FlopCounterMode)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from archspec import testing as T
from archspec.accounting import account
from archspec.codegen import generate
from archspec.spec import load_spec, load_spec_dict

SPECS = sorted(Path(__file__).resolve().parent.parent.joinpath("specs").glob("*.yaml"))

VARIANTS = [
    {},
    {"model": {"tie_embeddings": False}},
    {"model": {"attention": {"n_heads": 4, "n_kv_heads": 1, "bias": True, "positional": {"kind": "sinusoidal"}}}},
    {"model": {"attention": {"n_heads": 4, "n_kv_heads": 4, "head_dim": 24, "positional": {"kind": "none"}},
               "ffn": {"kind": "mlp", "activation": "relu", "hidden_dim": 100, "bias": False},
               "norm": {"kind": "layernorm", "bias": False}}},
    {"model": {"attention": {"positional": {"kind": "learned"}},
               "ffn": {"kind": "glu", "activation": "sigmoid", "hidden_dim": 72, "bias": True}}},
    # the kinds added through the units' extension path: tanh GELU, and q/k/v bias without an output bias (Qwen2)
    {"model": {"attention": {"qkv_bias": True, "out_bias": False},
               "ffn": {"kind": "mlp", "activation": "gelu_tanh", "hidden_dim": 96}}},
    {"model": {"attention": {"bias": True, "out_bias": False},
               "ffn": {"kind": "glu", "activation": "gelu_tanh", "hidden_dim": 80}}},
    # multi-head latent attention: a full query projection, then a query latent (its norm); v wider than q·k
    {"model": {"attention": {"kind": "mla", "n_heads": 4, "kv_lora_rank": 24, "qk_nope_head_dim": 12,
                             "qk_rope_head_dim": 8, "v_head_dim": 16}}},
    {"model": {"attention": {"kind": "mla", "n_heads": 2, "q_lora_rank": 20, "kv_lora_rank": 16,
                             "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 24}}},
    # block shapes (issue 26): four norms a block, a biased untied head and capped logits; one shared norm, no final
    # norm, Gemma's (1 + w) gain and OLMo 2's q/k norm over the projection; post-norm LayerNorm; output norms
    {"model": {"block": {"norm_placement": "sandwich"}, "lm_head_bias": True, "tie_embeddings": False,
               "logit_softcap": 30.0}},
    {"model": {"block": {"parallel": True, "shared_norm": True}, "final_norm": False,
               "attention": {"qk_norm": {"scope": "projection"}}, "norm": {"kind": "rmsnorm", "unit_offset": True}}},
    {"model": {"block": {"norm_placement": "post"}, "final_norm": False, "norm": {"kind": "layernorm"},
               "lm_head_bias": True}},
    {"model": {"block": {"norm_placement": "output"}, "attention": {"qk_norm": {"scope": "projection"}}}},
    {"model": {"block": {"parallel": True, "norm_placement": "sandwich"}}},
    # issue 26: capped and ALiBi scores (the dense path leaves SDPA: its matmuls are counted the same), the norm
    # after the embeddings, a scale
    {"model": {"attention": {"softcap": 30.0, "positional": {"kind": "alibi"}}, "embedding_norm": True,
               "norm": {"kind": "layernorm"}}},
    {"model": {"attention": {"scale": 0.2, "softcap": 5.0}}},
    # both halves: an embedding norm without a final norm (the model's norm, not the absent final one, on the
    # embeddings: a Hypothesis find of the merge)
    {"model": {"embedding_norm": True, "final_norm": False, "block": {"parallel": True, "shared_norm": True}}},
    # a sandwich block with an embedding norm, capped scores and capped logits
    {"model": {"block": {"norm_placement": "sandwich"}, "embedding_norm": True, "logit_softcap": 20.0,
               "attention": {"softcap": 10.0, "positional": {"kind": "alibi"}}}},
    # µP: the output multiplier and the attention scale cost no matmul; the parameters are the same
    {"model": {"parametrization": "mup", "mup_base_width": 16, "tie_embeddings": False}},
    {"model": {"parametrization": "mup", "attention": {"kind": "mla", "n_heads": 4, "kv_lora_rank": 24,
                                                       "qk_nope_head_dim": 12, "qk_rope_head_dim": 8,
                                                       "v_head_dim": 16}}},
    # µP with the block-shape half: capped logits after the output multiplier, an explicit scale over µP's 1/HEAD_DIM
    {"model": {"parametrization": "mup", "mup_base_width": 32, "logit_softcap": 15.0,
               "block": {"norm_placement": "sandwich"}, "attention": {"scale": 0.1}}},
]


def _small(extra: dict) -> dict:
    base = {"name": "acct", "model": {"vocab_size": 97, "context_length": 48, "d_model": 64, "n_layers": 3,
                                       "attention": {"n_heads": 8, "n_kv_heads": 2}}}
    for key, value in extra.get("model", {}).items():
        if isinstance(value, dict) and isinstance(base["model"].get(key), dict) and "kind" not in value:
            base["model"][key] = {**base["model"][key], **value}
        else:
            base["model"][key] = value
    return base


def _model(spec, tmp_path):
    torch.manual_seed(0)
    return generate(spec, out_dir=tmp_path).Model().eval()


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_preset_params_equal_numel(path, tmp_path):
    spec = load_spec(path)
    with torch.device("meta"):  # numel without allocating gpt2-small's 124M parameters
        model = generate(spec, out_dir=tmp_path).Model()
    acc = account(spec)
    assert acc.total == sum(p.numel() for p in model.parameters())
    assert acc.active == T.module_active_params(model)  # dense: == total; MoE: top_k / n_experts of the experts
    assert sum(acc.by_component.values()) == acc.total


@pytest.mark.parametrize("extra", VARIANTS, ids=range(len(VARIANTS)))
def test_variant_params_by_component(extra, tmp_path):
    spec = load_spec_dict(_small(extra))
    model = _model(spec, tmp_path)
    acc = account(spec)
    assert acc.total == sum(p.numel() for p in model.parameters())
    # by component, from the module's own parameter names
    named = dict(model.named_parameters())
    attention = sum(p.numel() for n, p in named.items() if ".attn." in n)
    ffn = sum(p.numel() for n, p in named.items() if ".ffn." in n)
    norms = sum(p.numel() for n, p in named.items() if "norm" in n and ".attn." not in n)  # not attention's own
    assert acc.by_component["attention"] == attention
    assert acc.by_component["ffn"] == ffn
    assert acc.by_component["norm"] == norms
    assert acc.embedding == sum(p.numel() for n, p in named.items() if "emb" in n)


def counted_forward_flops(model, vocab: int, T: int) -> int:
    idx = torch.randint(0, vocab, (1, T), generator=torch.Generator().manual_seed(0))
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), counter:
        model(idx)
    return counter.get_total_flops()


@pytest.mark.parametrize("extra", VARIANTS, ids=range(len(VARIANTS)))
def test_forward_flops_match_flop_counter(extra, tmp_path):
    spec = load_spec_dict(_small(extra))
    T = spec.model.context_length
    counted = counted_forward_flops(_model(spec, tmp_path), spec.model.vocab_size, T)
    # The math kernel multiplies the full T×T score matrix (masked half included): compare at full attention.
    full = account(spec, full_attention=True).flops_forward * T
    assert abs(counted - full) <= 0.01 * full
    # The reported (causal) figure differs from it exactly by the masked half of the attention products.
    a = spec.model.attention
    causal = account(spec).flops_forward * T
    masked_half = spec.model.n_layers * (a.score_flops(T, full_attention=True) - a.score_flops(T)) * T
    assert abs((full - causal) - masked_half) <= 1 * T


@pytest.mark.parametrize("name,T", [("llama-like", 256), ("gpt2-tiny", 128), ("llama-like-tiny", 128)])
def test_preset_flops_match_flop_counter(name, T, tmp_path):
    spec = load_spec(Path(__file__).resolve().parent.parent / "specs" / f"{name}.yaml")
    counted = counted_forward_flops(_model(spec, tmp_path), spec.model.vocab_size, T)
    expected = account(spec, seq_len=T, full_attention=True).flops_forward * T
    assert abs(counted - expected) <= 0.01 * expected


def test_train_is_three_forward_and_kv_cache_formula():
    spec = load_spec_dict(_small({}))
    acc = account(spec)
    assert acc.flops_train == 3 * acc.flops_forward
    a = spec.model.attention
    assert acc.kv_cache_bytes_per_token == 2 * spec.model.n_layers * a.n_kv_heads * a.head_dim * 2
    assert account(spec, kv_dtype="fp32").kv_cache_bytes_per_token == 2 * acc.kv_cache_bytes_per_token


def test_accounting_needs_no_instantiation():
    """A 70B-class spec is accounted for instantly, without allocating anything."""
    spec = load_spec_dict({"name": "big", "model": {
        "vocab_size": 32000, "context_length": 4096, "d_model": 8192, "n_layers": 80,
        "attention": {"n_heads": 64, "n_kv_heads": 8}, "ffn": {"kind": "glu", "hidden_dim": 28672}}})
    acc = account(spec)
    assert 68e9 < acc.total < 70e9  # LLaMA-2 70B: 68.98B with untied head; tied here saves 0.26B
    assert acc.kv_cache_bytes_per_token == 2 * 80 * 8 * 128 * 2
