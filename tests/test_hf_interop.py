"""HF transformers interop (issues 16, 25): `archspec import-hf` and `archspec export-hf`, both ways, through the CLI.

Every model is built here from a tiny config, every parameter re-drawn (norm weights around 1, biases non-zero, so
a mapping that only works at the default init fails), saved with `save_pretrained` (safetensors), imported, and
compared in fp32 with eager attention on both sides: parameter counts equal, logits within 1e-4 at T = context
length, longer than every sliding window in the cases (Mistral, Ministral, Qwen2 and Qwen2-MoE layer patterns). Then
exported back, loaded with `AutoModelForCausalLM.from_pretrained` (logits equal again) and imported once more:
the spec and every weight come back exactly. No downloads.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
import re

import pytest
import torch

from archspec.cli import main
from archspec.codegen import generate
from archspec.spec import canonical_dict, load_spec, load_spec_dict, model_hash

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

V, C, ATOL = 96, 32, 1e-4
_NO_IDS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def _randomise(module: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            norm = "norm" in name or name.split(".")[-2] in ("ln_1", "ln_2", "ln_f")
            if p.ndim == 1 and norm and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def _logits(model, idx):
    model.eval()
    with torch.no_grad():
        out = model(idx)
        return out if isinstance(out, torch.Tensor) else out.logits


def _hf_logits(model, idx):
    with torch.no_grad():
        return model.eval()(input_ids=idx).logits


def _numel(model) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied matrix once, on both sides


def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok.to_str()


CASES = {
    # GPT-2: Conv1D weights (transposed), fused c_attn, learned positions, gelu_new = tanh GELU, tied
    "gpt2": lambda: transformers.GPT2Config(
        vocab_size=V, n_positions=C, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, activation_function="gelu_new", layer_norm_epsilon=1e-5, **_NO_IDS),
    # LLaMA 3.1 style: GQA, untied, rope_parameters of type llama3 (every band: high, medium, low frequencies)
    "llama": lambda: transformers.LlamaConfig(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 4.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32}, **_NO_IDS),
    # Qwen2: q/k/v bias, no output bias, tied
    "qwen2": lambda: transformers.Qwen2Config(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, **_NO_IDS),
    # Qwen3: q/k RMSNorm per head, head_dim ≠ d_model / n_heads, attention_bias on
    "qwen3": lambda: transformers.Qwen3Config(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_bias=True, **_NO_IDS),
    # Mistral without a sliding window (v0.2 on): MQA, untied
    "mistral": lambda: transformers.MistralConfig(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, sliding_window=None, **_NO_IDS),
    # Mistral v0.1: every layer slides, a window of 7 positions (the query included) over T = 32
    "mistral_window": lambda: transformers.MistralConfig(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=7, **_NO_IDS),
    # Qwen2 with sliding layers from max_window_layers on: a per-layer pattern (a layer group on our side)
    "qwen2_mixed": lambda: transformers.Qwen2Config(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=5,
        max_window_layers=1, **_NO_IDS),
    # Ministral: layer_types as written, one window for the sliding layers
    "ministral": lambda: transformers.MinistralConfig(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=6,  # its head_dim has no default
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], **_NO_IDS),
    # Mixtral: top-2 of 4 experts, renormalised, fused gate_up_proj, with a sliding window
    "mixtral": lambda: transformers.MixtralConfig(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=9, router_aux_loss_coef=0.02, **_NO_IDS),
    # Qwen2-MoE: shared expert with its sigmoid gate, raw top-k gates (norm_topk_prob false), dense layers from
    # decoder_sparse_step 2 (layers 1 and 3) less mlp_only_layers (3): layer 1 alone is MoE; q/k/v bias; layer 0 slides
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, moe_intermediate_size=16, shared_expert_intermediate_size=24,
        num_experts=4, num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[3],
        use_sliding_window=True, sliding_window=6, max_window_layers=1, **_NO_IDS),
    # Qwen3-MoE: q/k norm, routed experts only (renormalised), layer 1 dense, every layer slides
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=True, mlp_only_layers=[1], use_sliding_window=True, sliding_window=10, **_NO_IDS),
    # GLM-4: half of each head rotated (GlmConfig's default partial_rotary_factor 0.5, absent from the call), in
    # (2i, 2i + 1) pairs; q/k/v bias without an o bias; gate and up fused in gate_up_proj
    "glm": lambda: transformers.GlmConfig(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, **_NO_IDS),
    # GLM with yarn (DeepSeek-V3's mscale / mscale_all_dim ratio as the attention factor), 3/4 of each head rotated,
    # no biases, MQA (tied GLM: test_archspec_to_hf_to_archspec_is_lossless)
    "glm_yarn": lambda: transformers.GlmConfig(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, partial_rotary_factor=0.75, attention_bias=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0,
                                                   "original_max_position_embeddings": 8, "beta_fast": 8.0,
                                                   "beta_slow": 2.0, "mscale": 1.0, "mscale_all_dim": 0.5},
        **_NO_IDS),
    # Phi-3: half of each head rotated in (i, i + d/2) pairs, fused qkv_proj and gate_up_proj, no biases
    "phi3": lambda: transformers.Phi3Config(
        vocab_size=V, max_position_embeddings=C, hidden_size=64, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, partial_rotary_factor=0.5, **_NO_IDS),
    # Phi-3 with a sliding window of 7 and 3/4 of each head rotated, tied
    "phi3_window": lambda: transformers.Phi3Config(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, partial_rotary_factor=0.75, sliding_window=7,
        tie_word_embeddings=True, **_NO_IDS),
    # LLaMA with yarn: half layout, every dimension, the ramp's ends not truncated, an attention factor given
    "llama_yarn": lambda: transformers.LlamaConfig(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rope_parameters={
            "rope_type": "yarn", "rope_theta": 300.0, "factor": 8.0, "original_max_position_embeddings": 4,
            "truncate": False, "attention_factor": 1.3}, **_NO_IDS),
    # DeepSeek-V3's multi-head latent attention (dense layers only: first_k_dense_replace = num_hidden_layers): a
    # query latent with its norm, the KV latent + one rope key for all heads, v narrower than q·k; then a full query
    "deepseek_v3": lambda: transformers.DeepseekV3Config(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=12, kv_lora_rank=16, qk_nope_head_dim=8,
        qk_rope_head_dim=4, v_head_dim=6, first_k_dense_replace=2, rope_interleave=False, **_NO_IDS),
    # DeepSeek-V3 whole: a dense first layer, then MoE layers of 8 routed experts in 4 groups (top-2 groups, top-2
    # experts), sigmoid scores with the selection bias, gates renormalised and scaled by 2.5, one shared expert;
    # interleaved rope pairs under yarn with mscale_all_dim (the softmax scale times mscale²)
    "deepseek_v3_moe": lambda: transformers.DeepseekV3Config(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=12, kv_lora_rank=16, qk_nope_head_dim=8,
        qk_rope_head_dim=4, v_head_dim=6, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=16, n_group=4, topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5,
        norm_topk_prob=True, rope_interleave=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0, "original_max_position_embeddings": 8,
                         "beta_fast": 8.0, "beta_slow": 2.0, "mscale": 1.0, "mscale_all_dim": 0.7},
        **_NO_IDS),
    # GPT-NeoX: parallel blocks, a LayerNorm each (use_parallel_residual), a quarter of each head rotated, the fused
    # q/k/v rows grouped by head, biases, an untied embed_out head
    "gpt_neox": lambda: transformers.GPTNeoXConfig(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, tie_word_embeddings=False, **_NO_IDS),
    # GPT-NeoX sequential (Pythia's use_parallel_residual false), half of each head, no attention bias
    "gpt_neox_sequential": lambda: transformers.GPTNeoXConfig(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=2, use_parallel_residual=False, attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 300.0, "partial_rotary_factor": 0.5}, **_NO_IDS),
    # GPT-J: parallel from one LayerNorm (ln_1), rotary_dim 6 of 8 in (2i, 2i + 1) pairs, a biased LM head
    "gptj": lambda: transformers.GPTJConfig(
        vocab_size=V, n_positions=C, n_embd=32, n_layer=2, n_head=4, rotary_dim=6, n_inner=40, **_NO_IDS),
    # Phi-2: parallel from one LayerNorm, half of each head rotated (half pairs), biases everywhere incl. lm_head
    "phi": lambda: transformers.PhiConfig(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, **_NO_IDS),
    # StableLM: LayerNorms, a quarter rotated, SwiGLU, q/k/v bias; and parallel with one shared norm
    "stablelm": lambda: transformers.StableLmConfig(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, use_qkv_bias=True, **_NO_IDS),
    "stablelm_parallel": lambda: transformers.StableLmConfig(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, use_parallel_residual=True, **_NO_IDS),
    # OLMo 2: norms on the sublayers' outputs only, q/k RMSNorm over the whole projections (GQA: k narrower)
    "olmo2": lambda: transformers.Olmo2Config(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, **_NO_IDS),
    # GLM-4-0414: sandwich norms around GLM's block (half of each head, interleaved pairs, q/k/v bias)
    "glm4": lambda: transformers.Glm4Config(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, **_NO_IDS),
    # Gemma: RMSNorm (1 + w), embeddings times sqrt(32), GeGLU (tanh), head_dim 16 ≠ 32 / 4, tied, MQA
    "gemma": lambda: transformers.GemmaConfig(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, **_NO_IDS),
    # Gemma 2: sandwich norms, (1 + w) RMSNorm, sqrt(d) embeddings, GeGLU (tanh), scores and logits soft-capped,
    # query_pre_attn_scalar 9 (scale 1/3, not 1/sqrt(16)), even layers sliding (window 6 < C), odd ones global
    "gemma2": lambda: transformers.Gemma2Config(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=9, sliding_window=6,
        attn_logit_softcapping=2.0, final_logit_softcapping=3.0, **_NO_IDS),
    # Gemma 2 for greedy decoding: caps that bite but leave the logits lively, windows shorter than the generation
    "gemma2_generate": lambda: transformers.Gemma2Config(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=9, sliding_window=6,
        attn_logit_softcapping=4.0, final_logit_softcapping=30.0, **_NO_IDS),
    # Gemma 2 without caps, query_pre_attn_scalar = head_dim (archspec's default scale), a custom layer pattern
    "gemma2_uncapped": lambda: transformers.Gemma2Config(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=5,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        attn_logit_softcapping=None, final_logit_softcapping=None, **_NO_IDS),
    "deepseek_v3_full_q": lambda: transformers.DeepseekV3Config(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=2, q_lora_rank=None, kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=8,
        v_head_dim=10, first_k_dense_replace=3, rope_interleave=False, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0}, **_NO_IDS),
}


def _hf_dir(tmp_path, case: str, seed: int = 0, **save):
    model = transformers.AutoModelForCausalLM.from_config(CASES[case](), attn_implementation="eager")
    _randomise(model, seed)
    out = tmp_path / f"hf-{case}"
    model.save_pretrained(out, **save)
    return model, out


def _import(tmp_path, src, name="imp", capsys=None):
    spec_path, ckpt = tmp_path / f"{name}.yaml", tmp_path / f"{name}.pt"
    code = main(["import-hf", str(src), "-o", str(spec_path), "--checkpoint", str(ckpt)])
    err = capsys.readouterr().err if capsys else ""
    assert code == 0, err
    spec = load_spec(spec_path)
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    model = generate(spec, write=False).Model()
    model.load_state_dict(state["model"])  # strict: the entry is the generated module's state_dict
    return spec, state, model, ckpt


@pytest.mark.parametrize("case", list(CASES))
def test_import_export_round_trip_keeps_logits(case, tmp_path, capsys):
    hf, src = _hf_dir(tmp_path, case, seed=len(case), **({"max_shard_size": "20KB"} if case == "llama" else {}))
    if case == "llama":
        assert (src / "model.safetensors.index.json").exists()  # sharded weights are read through the index
    if case == "qwen2":
        (src / "tokenizer.json").write_text(_tokenizer_json(), encoding="utf-8")
    spec, state, ours, ckpt = _import(tmp_path, src, capsys=capsys)

    assert _numel(ours) == _numel(hf)
    idx = torch.randint(0, V, (2, C), generator=torch.Generator().manual_seed(1))
    want = _hf_logits(hf, idx)
    assert want.abs().max() > 0.1
    torch.testing.assert_close(_logits(ours, idx), want, atol=ATOL, rtol=0)

    out = tmp_path / "exported"
    assert main(["export-hf", str(ckpt), "-o", str(out)]) == 0, capsys.readouterr().err
    back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    assert _numel(back) == _numel(hf)
    torch.testing.assert_close(_hf_logits(back, idx), want, atol=ATOL, rtol=0)
    if case == "qwen2":
        assert (out / "tokenizer.json").read_text(encoding="utf-8") == _tokenizer_json()
        assert state["tokenizer"]["tokenizer.json"] == _tokenizer_json()

    spec2, state2, _, _ = _import(tmp_path, out, name="again", capsys=capsys)  # archspec → HF → archspec
    assert canonical_dict(spec2)["model"] == canonical_dict(spec)["model"]
    assert state2["model"].keys() == state["model"].keys()
    assert all(torch.equal(state2["model"][k], v) for k, v in state["model"].items())


def test_old_format_rope_theta_and_rope_scaling_are_read(tmp_path, capsys):
    """transformers 4.x files: top-level rope_theta and rope_scaling {type: linear, factor}, no rope_parameters."""
    config = transformers.LlamaConfig(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=40, num_hidden_layers=1,
        num_attention_heads=2, rope_parameters={"rope_type": "linear", "rope_theta": 300.0, "factor": 2.0}, **_NO_IDS)
    hf = transformers.LlamaForCausalLM._from_config(config, attn_implementation="eager")
    _randomise(hf, 3)
    src = tmp_path / "old"
    hf.save_pretrained(src)
    data = json.loads((src / "config.json").read_text())
    data.pop("rope_parameters")
    data.update(rope_theta=300.0, rope_scaling={"type": "linear", "factor": 2.0})
    (src / "config.json").write_text(json.dumps(data))
    spec, _, ours, _ = _import(tmp_path, src, capsys=capsys)
    rope = canonical_dict(spec)["model"]["attention"]["positional"]
    assert rope["theta"] == 300.0 and rope["scaling"] == {"kind": "linear", "factor": 2.0}
    idx = torch.randint(0, V, (1, C), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(_logits(ours, idx), _hf_logits(hf, idx), atol=ATOL, rtol=0)


_MOE = {"kind": "moe", "n_experts": 4, "top_k": 2, "expert": {"kind": "glu", "hidden_dim": 16}, "aux_loss_coef": 0.03}


@pytest.mark.parametrize("model,model_type", [
    ({"norm": {"kind": "layernorm"}, "attention": {"n_heads": 4, "bias": True, "positional": {"kind": "learned"}},
      "ffn": {"kind": "mlp", "activation": "gelu_tanh", "hidden_dim": 40}}, "gpt2"),
    ({"attention": {"n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "qk_norm": {"eps": 1e-5},
                    "positional": {"kind": "rope", "theta": 1000.0, "scaling": {"kind": "linear", "factor": 3.0}}},
      "norm": {"kind": "rmsnorm", "eps": 1e-5}, "ffn": {"kind": "glu", "activation": "gelu", "hidden_dim": 24},
      "tie_embeddings": False}, "qwen3"),
    # per-layer: windows on layers 0 and 2 only (Ministral's layer_types)
    ({"n_layers": 3, "attention": {"n_heads": 4, "n_kv_heads": 2},
      "layers": {"local": {"select": {"step": 2}, "attention": {"sparsity": {"kind": "sliding_window", "window": 5}}}}},
     "ministral"),
    # per-layer: q/k/v bias, MoE layers with a gated shared expert, a dense layer, a window on the last layer
    ({"n_layers": 3, "attention": {"n_heads": 4, "qkv_bias": True},
      "ffn": {**_MOE, "n_shared_experts": 1, "shared_hidden_dim": 12, "shared_gate": True, "renormalize": False},
      "layers": {"dense": {"select": [1], "ffn": {"kind": "glu", "hidden_dim": 40}},
                 "window": {"select": [2], "attention": {"sparsity": {"kind": "sliding_window", "window": 4}}}}},
     "qwen2_moe"),
    # every layer MoE and sliding: Mixtral
    ({"attention": {"n_heads": 4, "n_kv_heads": 1, "sparsity": {"kind": "sliding_window", "window": 6}},
      "ffn": _MOE}, "mixtral"),
    # interleaved pairs, a quarter of each head rotated, yarn: GLM
    ({"attention": {"n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "qkv_bias": True, "out_bias": False,
                    "positional": {"kind": "rope", "theta": 700.0, "partial": 0.25, "layout": "interleaved",
                                   "scaling": {"kind": "yarn", "factor": 3.0, "original_context_length": 12,
                                               "beta_fast": 12.0, "beta_slow": 1.5}}},
      "norm": {"kind": "rmsnorm", "eps": 1e-6}, "ffn": {"kind": "glu", "activation": "silu", "hidden_dim": 24}},
     "glm"),
    # half of each head rotated in half-layout pairs, no biases: Phi-3
    ({"attention": {"n_heads": 2, "n_kv_heads": 1, "positional": {"kind": "rope", "partial": 0.5}}}, "phi3"),
    # every dimension rotated, interleaved: GLM too (partial_rotary_factor 1.0 written, GLM assumes 0.5 without it)
    ({"attention": {"n_heads": 4, "positional": {"kind": "rope", "layout": "interleaved"}},
      "tie_embeddings": True}, "glm"),
    # block shapes (issue 26): NeoX's parallel block with a norm each; GPT-J's shared norm, interleaved quarter,
    # biased head; OLMo 2's output norms and projection q/k norm; GLM-4's sandwich; Gemma's (1 + w) and scale
    ({"norm": {"kind": "layernorm"}, "block": {"parallel": True},
      "attention": {"n_heads": 4, "bias": True, "positional": {"kind": "rope", "partial": 0.25, "theta": 900.0}},
      "ffn": {"kind": "mlp", "activation": "gelu", "hidden_dim": 40}, "tie_embeddings": False}, "gpt_neox"),
    ({"norm": {"kind": "layernorm"}, "block": {"parallel": True, "shared_norm": True}, "lm_head_bias": True,
      "attention": {"n_heads": 4, "positional": {"kind": "rope", "partial": 0.75, "layout": "interleaved"}},
      "ffn": {"kind": "mlp", "activation": "gelu_tanh", "hidden_dim": 24, "bias": True}, "tie_embeddings": False},
     "gptj"),
    ({"block": {"norm_placement": "output"}, "norm": {"kind": "rmsnorm", "eps": 1e-6},
      "attention": {"n_heads": 4, "n_kv_heads": 2, "qk_norm": {"eps": 1e-6, "scope": "projection"}}}, "olmo2"),
    ({"block": {"norm_placement": "sandwich"},
      "attention": {"n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "qkv_bias": True, "out_bias": False,
                    "positional": {"kind": "rope", "partial": 0.5, "layout": "interleaved"}}}, "glm4"),
    ({"norm": {"kind": "rmsnorm", "eps": 1e-6, "unit_offset": True}, "embedding_scale": "sqrt_d_model",
      "attention": {"n_heads": 2, "head_dim": 24}, "ffn": {"kind": "glu", "activation": "gelu_tanh", "hidden_dim": 48},
      "tie_embeddings": True}, "gemma"),
    # Gemma 2's recipe: sandwich (1 + w) norms, capped scores and logits, scale 1/4 = 16 ** -0.5 with head_dim 8,
    # sliding and global layers alternating (a window shorter than the context)
    ({"n_layers": 3, "block": {"norm_placement": "sandwich"}, "norm": {"kind": "rmsnorm", "eps": 1e-6, "unit_offset": True},
      "embedding_scale": "sqrt_d_model", "logit_softcap": 3.0,
      "attention": {"n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "softcap": 2.5, "scale": 0.25,
                    "sparsity": {"kind": "sliding_window", "window": 5}},
      "layers": {"global": {"select": [1], "attention": {"sparsity": {"kind": "dense"}}}},
      "ffn": {"kind": "glu", "activation": "gelu_tanh", "hidden_dim": 48}, "tie_embeddings": True}, "gemma2"),
], ids=["gpt2-like", "qwen3-like", "alternating-windows", "moe-with-dense-layer", "mixtral-like", "glm-like",
        "partial-half", "interleaved-whole-heads", "neox-like", "gptj-like", "olmo2-like", "glm4-like", "gemma-like",
        "gemma2-like"])
def test_archspec_to_hf_to_archspec_is_lossless(model, model_type, tmp_path, capsys):
    from archspec.train.checkpoint import save_weights

    spec = load_spec_dict({"name": "mine", "model": {"vocab_size": V, "context_length": C, "d_model": 32,
                                                     "n_layers": 2, **model}})
    ours = generate(spec, write=False).Model()
    _randomise(ours, 7)
    save_weights(tmp_path / "mine.pt", canonical_dict(spec), model_hash(spec), ours.state_dict())
    out = tmp_path / "hf"
    assert main(["export-hf", str(tmp_path / "mine.pt"), "-o", str(out)]) == 0, capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["model_type"] == model_type
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    assert _numel(hf) == _numel(ours)
    idx = torch.randint(0, V, (2, C), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(_hf_logits(hf, idx), _logits(ours, idx), atol=ATOL, rtol=0)
    spec2, state2, _, _ = _import(tmp_path, out, name="back", capsys=capsys)
    assert canonical_dict(spec2)["model"] == canonical_dict(spec)["model"]
    assert all(torch.equal(state2["model"][k], v) for k, v in ours.state_dict().items())


def test_moe_load_balancing_loss_matches_hf(tmp_path, capsys):
    """aux_loss_coef = top_k · router_aux_loss_coef: with one MoE layer the loss is HF's, term for term."""
    config = transformers.MixtralConfig(
        vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=24, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=None, router_aux_loss_coef=0.02, **_NO_IDS)
    hf = transformers.MixtralForCausalLM._from_config(config, attn_implementation="eager")
    _randomise(hf, 11)
    hf.save_pretrained(tmp_path / "src")
    spec, _, ours, _ = _import(tmp_path, tmp_path / "src", capsys=capsys)
    assert spec.model.ffn.aux_loss_coef == 0.04
    idx = torch.randint(0, V, (3, C), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = config.router_aux_loss_coef * hf.eval()(input_ids=idx, output_router_logits=True).aux_loss
        ours.eval()(idx)
    assert want > 0.02  # n · Σ f_i P_i ≥ 1 per assignment: not trivially zero
    torch.testing.assert_close(ours.auxiliary_losses()["moe_aux"], want, atol=1e-6, rtol=1e-5)


# ── refusals: by field name, exit 2, nothing written ────────────────────────────────────────────────────────────


def _llama_config() -> dict:
    return CASES["llama"]().to_dict()


def _set(data: dict, **changes) -> dict:
    return {**data, **changes}


REFUSED = {
    # LLaMA's rotary embedding ignores partial_rotary_factor (it rotates every dimension): not read as GLM's would be
    "partial_rotary": (lambda: _set(_llama_config(), partial_rotary_factor=0.5),
                       "partial_rotary_factor: 0.5: llama's rotary embedding ignores it"),
    "dynamic_rope": (lambda: _set(_llama_config(), rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4,
                                                                    "factor": 4.0}), "rope_type 'dynamic'"),
    "yarn_unknown_key": (lambda: _set(_llama_config(), rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 16,
        "long_factor": [1.0]}), "long_factor: not used by rope_type 'yarn'"),
    # GLM: what a spec cannot say, by name: an odd number of rotated dimensions (int(0.2 · 16) = 3), an MLP bias or
    # a sliding window (keys GlmConfig does not have), rope per layer type
    # Phi-3 reads yarn as longrope (which archspec lacks)
    "phi3_yarn": (lambda: _set(CASES["phi3"]().to_dict(), rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0, "original_max_position_embeddings": 16}),
                  "rope_type 'yarn': phi3's rotary embedding takes default or longrope"),
    "glm_odd_rotary": (lambda: _set(CASES["glm"]().to_dict(), rope_parameters={
        "rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.2}), "model.attention.positional.partial"),
    "glm_mlp_bias": (lambda: _set(CASES["glm"]().to_dict(), mlp_bias=True), "mlp_bias"),
    "glm_sliding_window": (lambda: _set(CASES["glm"]().to_dict(), sliding_window=8), "sliding_window"),
    "glm_rope_per_layer": (lambda: _set(CASES["glm"]().to_dict(), rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1e4}}), "RoPE parameters per layer type"),
    "softcapping": (lambda: _set(_llama_config(), final_logit_softcapping=30.0), "final_logit_softcapping"),
    "unknown_type": (lambda: _set(_llama_config(), model_type="bert"), "model_type: 'bert'"),
    "moe_type_not_mapped": (lambda: _set(_llama_config(), model_type="deepseek_v2"), "model_type: 'deepseek_v2'"),
    # MoE options archspec does not have: router jitter (Mixtral), a z-loss key no transformers type reads
    "mixtral_jitter": (lambda: _set(CASES["mixtral"]().to_dict(), router_jitter_noise=0.1), "router_jitter_noise"),
    "moe_unknown_option": (lambda: _set(CASES["mixtral"]().to_dict(), router_z_loss_coef=0.001),
                           "router_z_loss_coef"),
    # transformers 5.x saves Qwen3-MoE's num_experts as num_local_experts: both spellings, two values
    "moe_two_expert_counts": (lambda: _set(CASES["qwen3_moe"]().to_dict(), num_experts=8),
                              "num_local_experts: 4, but num_experts (the same setting) is 8"),
    "moe_sparse_step_zero": (lambda: _set(CASES["qwen2_moe"]().to_dict(), decoder_sparse_step=0),
                             "decoder_sparse_step: 0"),
    "ministral_layer_type": (lambda: _set(CASES["ministral"]().to_dict(),
                                          layer_types=["chunked_attention", "full_attention", "full_attention"]),
                             "layer_types: 'chunked_attention'"),
    "moe_only_layers_out_of_range": (lambda: _set(CASES["qwen2_moe"]().to_dict(), mlp_only_layers=[0, 9]),
                                     "mlp_only_layers: [9]"),
    # Mistral ignores layer_types (every layer slides alike): a file that has them is not read as if it did
    "mistral_layer_types": (lambda: _set(CASES["mistral_window"]().to_dict(),
                                         layer_types=["full_attention", "sliding_attention"]), "layer_types"),
    # a sliding layer whose window transformers switches off (use_sliding_window false): no usable window
    "qwen2_sliding_without_window": (lambda: _set(CASES["qwen2"]().to_dict(), sliding_window=8,
                                                  layer_types=["sliding_attention", "full_attention"]),
                                     "layer_types: 'sliding_attention' layers, but use_sliding_window is false"),
    # dropout rates that differ are imported (the largest, with a note: tests/test_hf_hostile.py); one out of [0, 1)
    "dropout_out_of_range": (lambda: _set(CASES["gpt2"]().to_dict(), attn_pdrop=1.5), "a dropout rate is in [0, 1)"),
    # block-shape types: what their configs can say and archspec cannot, by name
    "phi_qk_layernorm": (lambda: _set(CASES["phi"]().to_dict(), qk_layernorm=True), "qk_layernorm: True"),
    "stablelm_qk_layernorm": (lambda: _set(CASES["stablelm"]().to_dict(), qk_layernorm=True), "qk_layernorm: True"),
    "gptj_rotary_dim_null": (lambda: _set(CASES["gptj"]().to_dict(), rotary_dim=None), "rotary_dim: null"),
    "gptj_rope_theta": (lambda: _set(CASES["gptj"]().to_dict(), rope_theta=500.0),
                        "rope_theta: GPT-J's rotary embedding ignores it"),
    "gemma_bidirectional": (lambda: _set(CASES["gemma"]().to_dict(), use_bidirectional_attention=True),
                            "use_bidirectional_attention"),
    # types that need a feature archspec lacks name it (not the generic "not one archspec maps")
    "cohere_pending": (lambda: _set(_llama_config(), model_type="cohere"), "needs a multiplier on the logits"),
    "gemma2_no_window": (lambda: _set(CASES["gemma2"]().to_dict(), sliding_window=None),
                         "sliding_window: None: transformers' gemma2 needs a window"),
    "gemma2_bidirectional": (lambda: _set(CASES["gemma2"]().to_dict(), use_bidirectional_attention=True),
                             "use_bidirectional_attention"),
    "falcon_alibi": (lambda: _set(transformers.FalconConfig(hidden_size=32, num_attention_heads=4).to_dict(),
                                  alibi=True), "alibi: true: Falcon adds ALiBi divided by sqrt(head_dim)"),
    "cross_attention": (lambda: _set(CASES["gpt2"]().to_dict(), add_cross_attention=True), "add_cross_attention"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_unsupported_config_field_is_refused_by_name(case, tmp_path, capsys):
    make, field = REFUSED[case]
    (tmp_path / "config.json").write_text(json.dumps(make()))
    spec = tmp_path / "out.yaml"
    code = main(["import-hf", str(tmp_path / "config.json"), "-o", str(spec)])
    err = capsys.readouterr().err
    assert code == 2 and field in err and "Traceback" not in err, err
    assert not spec.exists()


def test_a_config_alone_gives_a_spec_and_refuses_to_overwrite(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(CASES["mistral"]().to_dict()))
    spec = tmp_path / "m.yaml"
    assert main(["import-hf", str(tmp_path), "-o", str(spec)]) == 0
    assert load_spec(spec).model.attention.n_kv_heads == 1
    before = spec.read_text()
    assert main(["import-hf", str(tmp_path), "-o", str(spec)]) == 2
    assert "already exists" in capsys.readouterr().err and spec.read_text() == before
    assert main(["import-hf", str(tmp_path), "-o", str(tmp_path / "n.yaml"), "--checkpoint", str(tmp_path / "w.pt")]) == 2
    assert "no model.safetensors" in capsys.readouterr().err and not (tmp_path / "n.yaml").exists()


@pytest.mark.parametrize("model,field", [
    ({"attention": {"n_heads": 4, "positional": {"kind": "sinusoidal"}}}, "model.attention.positional.kind"),
    ({"attention": {"n_heads": 4, "positional": {"kind": "none"}}}, "model.attention.positional.kind"),
    ({"norm": {"kind": "layernorm", "bias": False}, "attention": {"n_heads": 4, "positional": {"kind": "learned"}},
      "ffn": {"kind": "mlp"}}, "model.norm.bias"),
    ({"attention": {"n_heads": 4, "qkv_bias": False, "out_bias": True}}, "model.attention.out_bias"),
    ({"attention": {"n_heads": 4}, "ffn": {**_MOE, "capacity_factor": 1.25}}, "model.ffn.capacity_factor"),
    ({"attention": {"n_heads": 4}, "ffn": {**_MOE, "z_loss_coef": 0.001}}, "model.ffn.z_loss_coef"),
    ({"attention": {"n_heads": 4}, "ffn": {**_MOE, "expert": {"kind": "mlp", "hidden_dim": 16}}},
     "model.ffn.expert.kind"),
    ({"attention": {"n_heads": 4, "qkv_bias": True}, "ffn": {**_MOE, "n_shared_experts": 1}},
     "model.ffn.shared_gate"),
    # per layer: the refusal names the layer group (as the stored, canonical spec names it) and its layers
    ({"attention": {"n_heads": 4}, "layers": {"eps": {"select": [1], "norm": {"eps": 1e-3}}}}, "model.layers.norm_1.norm (layer 1)"),
    ({"attention": {"n_heads": 4}, "layers": {"heads": {"select": [1], "attention": {"n_kv_heads": 2}}}},
     "model.layers.attention_1.attention (layer 1)"),
    ({"attention": {"n_heads": 4}, "layers": {"wide": {"select": [0], "ffn": {"hidden_dim": 64}}}},
     "model.layers.ffn_1.ffn (layer 1)"),
    ({"n_layers": 3, "attention": {"n_heads": 4, "sparsity": {"kind": "sliding_window", "window": 4}},
      "layers": {"wider": {"select": [2], "attention": {"sparsity": {"window": 8}}}}},
     "model.layers.attention_1.attention.sparsity (layer 2): needs sliding_window = 8"),
    ({"attention": {"n_heads": 4}, "layers": {"g": {"select": [1], "attention": {"sparsity": {"kind": "global_local",
                                                                                         "window": 4}}}}},
     "model.layers.attention_1.attention.sparsity.kind (layer 1)"),
    # interleaved pairs with a q/k norm: llama-like types pair (i, i + d/2), GLM has no q/k norm
    ({"attention": {"n_heads": 4, "qk_norm": {}, "positional": {"kind": "rope", "layout": "interleaved"}}},
     "model.attention.positional.layout: interleaved cannot be expressed as llama"),
    # a partial rotation with experts: only GLM rotates part of a head, and it has no experts
    ({"attention": {"n_heads": 4, "head_dim": 8, "positional": {"kind": "rope", "partial": 0.5}}, "ffn": _MOE},
     "model.attention.positional.partial: 0.5 cannot be expressed as mixtral"),
    # block shapes no type has: no final norm, post-norm, a shape per layer, capped logits, (1 + w) without Gemma's
    # embedding scale
    ({"attention": {"n_heads": 4}, "final_norm": False}, "model.final_norm: false"),
    ({"attention": {"n_heads": 4}, "block": {"norm_placement": "post"}},
     "model.block.norm_placement: post cannot be expressed as llama"),
    ({"attention": {"n_heads": 4}, "layers": {"p": {"select": [1], "block": {"parallel": True}}}},
     "model.layers.block_1.block (layer 1): a block shape that differs by layer"),
    ({"attention": {"n_heads": 4}, "logit_softcap": 30.0}, "model.logit_softcap: 30.0 cannot be expressed as llama"),
    ({"attention": {"n_heads": 4}, "norm": {"kind": "rmsnorm", "unit_offset": True}},
     "model.embedding_scale: false cannot be expressed as gemma"),
    ({"attention": {"n_heads": 4}, "block": {"parallel": True}},
     "model.block.parallel: true cannot be expressed as llama"),
    # Gemma 2's softmax scale is query_pre_attn_scalar ** -0.5 with an integer scalar: 0.3 is no such scale
    ({"block": {"norm_placement": "sandwich"}, "norm": {"kind": "rmsnorm", "eps": 1e-6, "unit_offset": True},
      "embedding_scale": "sqrt_d_model", "attention": {"n_heads": 2, "head_dim": 16, "scale": 0.3},
      "ffn": {"kind": "glu", "activation": "gelu_tanh", "hidden_dim": 48}},
     "model.attention.scale: 0.3 cannot be expressed as gemma2"),
], ids=["sinusoidal", "nope", "gpt2-without-norm-bias", "out-bias-only", "moe-capacity", "moe-z-loss", "moe-mlp-experts",
        "moe-ungated-shared-expert", "layer-norm-eps", "layer-heads", "layer-ffn-width", "layer-windows-differ",
        "layer-global-local", "interleaved-with-qk-norm", "partial-with-experts", "no-final-norm", "post-norm",
        "shape-per-layer", "logit-softcap", "unit-offset-unscaled", "parallel-rmsnorm",
        "gemma2-scale-not-an-integer-s"])
def test_export_refuses_what_hf_cannot_express(model, field, tmp_path, capsys):
    from archspec.train.checkpoint import save_weights

    spec = load_spec_dict({"name": "x", "model": {"vocab_size": V, "context_length": C, "d_model": 32,
                                                  "n_layers": 2, **model}})
    save_weights(tmp_path / "x.pt", canonical_dict(spec), model_hash(spec),
                 generate(spec, write=False).Model().state_dict())
    code = main(["export-hf", str(tmp_path / "x.pt"), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and field in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_export_refuses_a_non_empty_directory_and_a_missing_source(tmp_path, capsys):
    from archspec.train.checkpoint import save_weights

    spec = load_spec_dict({"name": "x", "model": {"vocab_size": V, "context_length": C, "d_model": 32,
                                                  "n_layers": 1, "attention": {"n_heads": 4}}})
    save_weights(tmp_path / "x.pt", canonical_dict(spec), model_hash(spec),
                 generate(spec, write=False).Model().state_dict())
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("keep")
    assert main(["export-hf", str(tmp_path / "x.pt"), "-o", str(tmp_path / "full")]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert (tmp_path / "full" / "mine.txt").read_text() == "keep"
    assert main(["export-hf", str(tmp_path / "nope.pt"), "-o", str(tmp_path / "o"),
                 "--registry", f"sqlite:///{tmp_path}/none.db"]) == 2
    assert "no such checkpoint" in capsys.readouterr().err and not (tmp_path / "none.db").exists()


def test_imported_weights_that_do_not_fit_the_config_are_refused(tmp_path, capsys):
    _, src = _hf_dir(tmp_path, "qwen2")
    data = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**data, "intermediate_size": 48}))
    code = main(["import-hf", str(src), "-o", str(tmp_path / "s.yaml"), "--checkpoint", str(tmp_path / "w.pt")])
    err = capsys.readouterr().err
    assert code == 2 and "mlp.gate_proj.weight" in err and "(48, 32)" in err, err
    assert not (tmp_path / "s.yaml").exists() and not (tmp_path / "w.pt").exists()


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "qwen2", "qwen3", "mistral", "glm", "phi3"])
def test_absent_keys_take_the_defaults_transformers_takes(model_type, tmp_path):
    """A hand-written config with few keys: what archspec assumes for the rest is what transformers assumes."""
    from archspec.hf import spec_from_config

    sizes = ({"n_embd": 32, "n_layer": 1, "n_head": 4, "n_positions": 16, "vocab_size": 96} if model_type == "gpt2"
             else {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 40,
                   "vocab_size": 96, "max_position_embeddings": 16, "num_key_value_heads": 2})
    ref = transformers.AutoConfig.for_model(model_type, **sizes)
    m = load_spec_dict(spec_from_config({"model_type": model_type, **sizes}, "config.json", "x")).model
    if model_type == "gpt2":
        assert (m.norm.eps, m.ffn.activation, m.ffn.hidden_dim, m.dropout) == (ref.layer_norm_epsilon, "gelu_tanh",
                                                                              4 * 32, ref.resid_pdrop)
    else:
        window = getattr(ref, "sliding_window", None)
        assert window is None or window >= 16  # Mistral's 4096 default window is longer than this context: dense
        assert (m.norm.eps, m.attention.n_kv_heads, m.attention.head_dim, m.ffn.activation) == (
            ref.rms_norm_eps, ref.num_key_value_heads, getattr(ref, "head_dim", None) or 64 // 4, ref.hidden_act)
        assert m.attention.positional.theta == ref.rope_parameters["rope_theta"]
        assert m.attention.positional.partial == ref.rope_parameters.get("partial_rotary_factor", 1.0)
        if model_type == "glm":  # q/k/v bias by attention_bias (GLM-4-9B: true), never an o bias; interleaved
            assert (m.attention.qkv_bias, m.attention.out_bias) == (ref.attention_bias, False)
            assert m.attention.positional.layout == "interleaved"
    assert m.tie_embeddings == ref.tie_word_embeddings


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe", "qwen3_moe", "ministral"])
def test_absent_keys_take_the_defaults_transformers_takes_moe_and_windows(model_type):
    """The same for the MoE types and Ministral: experts, top-k, renormalisation, expert and shared widths, the
    window, rope theta (Mixtral's default is 1e6) and which layers are MoE are what transformers builds."""
    from archspec.hf import spec_from_config

    sizes = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 40,
             "vocab_size": 96, "max_position_embeddings": 8192, "num_key_value_heads": 2, "head_dim": 16}
    ref = transformers.AutoConfig.for_model(model_type, **sizes)
    m = load_spec_dict(spec_from_config({"model_type": model_type, **sizes}, "config.json", "x")).model
    assert m.attention.positional.theta == ref.rope_parameters["rope_theta"]
    assert (m.norm.eps, m.tie_embeddings) == (ref.rms_norm_eps, ref.tie_word_embeddings)
    window = ref.sliding_window if model_type in ("mixtral", "ministral") else None  # qwen: use_sliding_window off
    sparsity = m.attention.sparsity
    assert (sparsity.kind, getattr(sparsity, "window", None)) == (("sliding_window", window) if window else ("dense", None))
    if model_type == "ministral":
        return
    experts = ref.num_local_experts if model_type == "mixtral" else ref.num_experts
    hidden = ref.intermediate_size if model_type == "mixtral" else ref.moe_intermediate_size
    f = m.ffn
    assert (f.kind, f.n_experts, f.top_k, f.expert.hidden_dim, f.expert.activation) == (
        "moe", experts, ref.num_experts_per_tok, hidden, ref.hidden_act)
    assert f.renormalize == (model_type == "mixtral" or ref.norm_topk_prob)
    assert f.aux_loss_coef == pytest.approx(ref.router_aux_loss_coef * ref.num_experts_per_tok)
    if model_type == "qwen2_moe":
        assert (f.n_shared_experts, f.shared_hidden_dim, f.shared_gate) == (1, ref.shared_expert_intermediate_size, True)
        assert m.attention.qkv_bias == ref.qkv_bias and not m.attention.out_bias


@pytest.mark.parametrize("case", ["qwen2_mixed", "qwen2_moe"])
def test_older_files_without_layer_types_slide_the_layers_transformers_slides(case):
    """Files from before `layer_types`: use_sliding_window + max_window_layers, by each type's own rule (Qwen2: layers
    from max_window_layers on; Qwen2-MoE: even layers below it)."""
    from archspec.hf import spec_from_config

    for first in range(4):
        data = {k: v for k, v in CASES[case]().to_dict().items() if k != "layer_types"}
        data["max_window_layers"] = first
        want = type(CASES[case]())(**{k: v for k, v in data.items() if k not in ("model_type", "transformers_version")})
        m = load_spec_dict(spec_from_config(data, "config.json", "x")).model
        got = ["sliding_attention" if b.attention.sparsity.kind == "sliding_window" else "full_attention"
               for b in m.blocks()]
        assert got == want.layer_types, (first, got, want.layer_types)


# Released config.json files (their architecture keys as published; ids and bookkeeping trimmed) and the parameter
# counts their model cards give, total and active (B). Spec only: no weights, no model built.
_RELEASED = {
    "Mistral-7B-v0.1": ({"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                         "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32,
                         "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
                         "tie_word_embeddings": False, "vocab_size": 32000}, 7.2, 7.2),
    "Mixtral-8x7B-v0.1": ({"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                           "max_position_embeddings": 32768, "num_attention_heads": 32, "num_experts_per_tok": 2,
                           "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
                           "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1e6,
                           "router_aux_loss_coef": 0.02, "sliding_window": None, "tie_word_embeddings": False,
                           "vocab_size": 32000}, 46.7, 12.9),
    "Qwen1.5-MoE-A2.7B": ({"model_type": "qwen2_moe", "decoder_sparse_step": 1, "hidden_size": 2048,
                           "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
                           "moe_intermediate_size": 1408, "norm_topk_prob": False, "num_attention_heads": 16,
                           "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24,
                           "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                           "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 5632,
                           "sliding_window": 32768, "tie_word_embeddings": False, "use_sliding_window": False,
                           "vocab_size": 151936}, 14.3, 2.7),
    "Qwen3-30B-A3B": ({"model_type": "qwen3_moe", "attention_bias": False, "decoder_sparse_step": 1, "head_dim": 128,
                       "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960,
                       "max_window_layers": 48, "mlp_only_layers": [], "moe_intermediate_size": 768,
                       "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
                       "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_scaling": None,
                       "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
                       "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936}, 30.5, 3.3),
}


@pytest.mark.parametrize("name", list(_RELEASED))
def test_released_configs_import_with_their_published_parameter_counts(name):
    from archspec.accounting import param_breakdown
    from archspec.hf import spec_from_config

    data, total, active = _RELEASED[name]
    data = {**data, "hidden_act": "silu", "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
            "initializer_range": 0.02, "torch_dtype": "bfloat16", "use_cache": True}
    m = load_spec_dict(spec_from_config(data, f"{name}/config.json", "x")).model
    parts, active_params = param_breakdown(m)
    # model cards round to 0.1B (Qwen3-30B-A3B's 3.35B active is written "3.3B")
    assert sum(parts.values()) == pytest.approx(total * 1e9, abs=0.06e9)
    assert active_params == pytest.approx(active * 1e9, abs=0.06e9)


def test_released_glm_4_9b_config_imports_with_its_published_parameter_count():
    """THUDM/glm-4-9b-hf's config.json (tests/fixtures/released/glm-4-9b-hf, written from its published keys): 9.4B
    parameters on its model card; archspec's accounting and HF's own model of the config (on the meta device: no
    memory) count the same 9,399,951,360."""
    from archspec.accounting import param_breakdown
    from archspec.hf import spec_from_config

    data = json.loads((Path(__file__).parent / "fixtures" / "released" / "glm-4-9b-hf" / "config.json").read_text())
    spec = load_spec_dict(spec_from_config(data, "glm-4-9b-hf/config.json", "glm-4-9b"))
    rope = spec.model.attention.positional
    assert (rope.partial, rope.layout, rope.rotated_dims(spec.model)) == (0.5, "interleaved", 64)
    parts, active = param_breakdown(spec.model)
    config = transformers.GlmConfig(**{k: v for k, v in data.items()
                                       if k not in ("model_type", "transformers_version", "architectures")})
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(parts.values()) == active == _numel(hf) == 9_399_951_360
    assert sum(parts.values()) == pytest.approx(9.4e9, abs=0.06e9)


def _assert_greedy_equals_hf(hf, ours) -> None:
    prompt = torch.randint(0, V, (1, 5), generator=torch.Generator().manual_seed(9))
    want = hf.eval().generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=C - 5, do_sample=False,
                              pad_token_id=0)
    got = ours.eval().generate(prompt, C - 5, temperature=0)
    assert got.tolist() == want.tolist()
    assert len(set(got[0, 5:].tolist())) > 8  # varied text: a decoding that drifts would show


@pytest.mark.parametrize("case", ["glm", "glm_yarn", "llama_yarn", "phi3"])
def test_greedy_generation_through_the_cache_equals_hf_generate(case, tmp_path, capsys):
    """The imported model's KV-cached greedy decoding gives HF generate's tokens (partial, interleaved, yarn)."""
    hf, src = _hf_dir(tmp_path, case, seed=len(case) + 3)
    with torch.no_grad():  # lively text (not one token repeated): larger embeddings, sharper attention
        hf.get_input_embeddings().weight.mul_(3.0)
        for layer in hf.model.layers:
            attn = layer.self_attn
            if hasattr(attn, "qkv_proj"):  # Phi-3's fused projection: q and k rows first, then v
                v_rows = hf.config.num_key_value_heads * attn.head_dim
                attn.qkv_proj.weight[: attn.qkv_proj.weight.shape[0] - v_rows].mul_(4.0)
            else:
                attn.q_proj.weight.mul_(4.0)
                attn.k_proj.weight.mul_(4.0)
    hf.save_pretrained(src)
    _, _, ours, _ = _import(tmp_path, src, capsys=capsys)
    _assert_greedy_equals_hf(hf, ours)


@pytest.mark.parametrize("case", ["gpt_neox", "gptj", "phi", "stablelm_parallel", "olmo2", "glm4", "gemma"])
def test_greedy_generation_of_the_block_shape_types_equals_hf_generate(case, tmp_path, capsys):
    """Parallel, shared-norm, output-norm, sandwich and (1 + w) blocks: KV-cached greedy decoding gives HF's tokens."""
    hf, src = _hf_dir(tmp_path, case, seed=7)
    with torch.no_grad():  # lively text: larger embeddings, sharper attention, larger sublayer outputs
        hf.get_input_embeddings().weight.mul_(3.0)
        for name, p in hf.named_parameters():
            if p.ndim == 2 and any(k in name for k in ("q_proj", "k_proj", "query_key_value")):
                p.mul_(4.0)
            elif p.ndim == 2 and any(k in name for k in ("v_proj", "o_proj", "down_proj", "dense", "fc_out")):
                p.mul_(3.0)
    hf.save_pretrained(src)
    _, _, ours, _ = _import(tmp_path, src, capsys=capsys)
    _assert_greedy_equals_hf(hf, ours)


@pytest.mark.parametrize("case", ["llama", "qwen2", "qwen3", "mistral", "ministral", "mixtral", "qwen2_moe",
                                  "qwen3_moe", "glm", "phi3"])
def test_partial_rotary_factor_is_mapped_where_transformers_honours_it_and_refused_where_it_is_ignored(case, tmp_path,
                                                                                                   capsys):
    """transformers' own model of each type, given partial_rotary_factor 0.5 with its default rope: the types whose
    rotary embedding rotates every dimension anyway (all but glm and phi3) are refused by name; the others import it."""
    data = {**CASES[case]().to_dict(), "partial_rotary_factor": 0.5}
    data["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    config = type(CASES[case]())(**{k: v for k, v in data.items() if k not in ("model_type", "transformers_version")})
    hf = transformers.AutoModelForCausalLM.from_config(config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rotated = 2 * hf.model.rotary_emb.inv_freq.numel()
    (tmp_path / "config.json").write_text(json.dumps(data))
    code = main(["import-hf", str(tmp_path / "config.json"), "-o", str(tmp_path / "s.yaml")])
    err = capsys.readouterr().err
    if rotated == head_dim:  # transformers ignores the fraction: a file with it is not the model it would build
        assert code == 2 and "partial_rotary_factor: 0.5" in err and "ignores it" in err, err
    else:
        assert code == 0, err
        spec = load_spec(tmp_path / "s.yaml")
        assert spec.model.attention.positional.rotated_dims(spec.model) == rotated == head_dim // 2
    assert (rotated == head_dim) == (case not in ("glm", "phi3"))


# ── deepseek_v3 (multi-head latent attention) ───────────────────────────────────────────────────────────────────


def test_deepseek_v3_greedy_generation_equals_hf_generate(tmp_path, capsys):
    hf, src = _hf_dir(tmp_path, "deepseek_v3", seed=5)
    spec, _, ours, _ = _import(tmp_path, src, capsys=capsys)
    prompt = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = hf.eval().generate(prompt, max_new_tokens=20, do_sample=False, min_new_tokens=20,
                                  attention_mask=torch.ones_like(prompt))
    assert torch.equal(ours.eval().generate(prompt, 20, temperature=0), want)


def test_deepseek_v3_moe_layers_with_a_selection_bias_equal_hf(tmp_path, capsys):
    """The MoE layers' e_score_correction_bias (a buffer HF initialises to zero) imported and used for the choice only:
    a random bias that changes which experts are chosen still gives HF's logits, and greedy decoding equals HF's."""
    model = transformers.AutoModelForCausalLM.from_config(CASES["deepseek_v3_moe"](), attn_implementation="eager")
    _randomise(model, 11)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for layer in model.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.copy_(0.5 * torch.randn(8, generator=g))
    src = tmp_path / "hf-bias"
    model.save_pretrained(src)
    spec, state, ours, _ = _import(tmp_path, src, capsys=capsys)
    ffn = spec.model.blocks()[1].ffn
    assert (ffn.score, ffn.selection_bias, ffn.n_group, ffn.topk_group, ffn.routed_scaling_factor) == (
        "sigmoid", True, 4, 2, 2.5)
    assert spec.model.attention.positional.layout == "interleaved"
    assert spec.model.blocks()[0].ffn.kind == "glu"
    idx = torch.randint(0, V, (2, C), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_logits(ours, idx), _hf_logits(model, idx), atol=ATOL, rtol=0)
    biased = [k for k in state["model"] if k.endswith("selection_bias")]
    assert len(biased) == 2 and all(state["model"][k].abs().sum() > 0 for k in biased)
    prompt = torch.randint(0, V, (1, 5), generator=torch.Generator().manual_seed(9))
    want = model.eval().generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=C - 5,
                                 do_sample=False, min_new_tokens=C - 5)
    assert ours.eval().generate(prompt, C - 5, temperature=0).tolist() == want.tolist()


@pytest.mark.parametrize("change,field", [
    ({"first_k_dense_replace": -1}, "first_k_dense_replace: -1 is out of range"),
    ({"attention_bias": True}, "attention_bias"),
    ({"num_key_value_heads": 2}, "num_key_value_heads"),
    ({"head_dim": 5}, "head_dim: 5, but the other widths imply 4"),
])
def test_deepseek_v3_refuses_what_archspec_cannot_say_by_name(change, field, tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(_set(CASES["deepseek_v3"]().to_dict(), **change)))
    code = main(["import-hf", str(tmp_path / "config.json"), "-o", str(tmp_path / "out.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and field in err and "Traceback" not in err, err


def test_deepseek_v3_multi_token_prediction_layers_import_as_model_mtp(tmp_path, capsys):
    data = _set(CASES["deepseek_v3"]().to_dict(), num_nextn_predict_layers=1)
    data.pop("num_mtp_layers", None)
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert main(["import-hf", str(tmp_path / "config.json"), "-o", str(tmp_path / "out.yaml")]) == 0
    err = capsys.readouterr().err
    assert "num_nextn_predict_layers: 1 → model.mtp.depth 1" in err, err
    assert load_spec(tmp_path / "out.yaml").model.mtp.depth == 1  # tests/test_mtp.py: the weights both ways
    # transformers' own model builds none of them: its layers are the num_hidden_layers decoder layers
    hf = transformers.AutoModelForCausalLM.from_config(transformers.DeepseekV3Config(**data))
    assert len(hf.model.layers) == data["num_hidden_layers"]


# The released DeepSeek-V3 config.json (deepseek-ai/DeepSeek-V3, as published) and its published counts: 671B total,
# 37B activated per token (the report's Table 1; the multi-token-prediction module's 14B is not among them).
_V3 = json.loads((__import__("pathlib").Path(__file__).parent / "fixtures" / "deepseek-v3-config.json").read_text())
def test_released_deepseek_v3_imports_with_its_published_counts_671b_37b(capsys):
    """deepseek-ai/DeepSeek-V3's config.json as published (yarn factor 40, interleaved rope pairs, V3's routing, one
    multi-token-prediction layer) imports — the MTP layer left out with a note — and counts what transformers' own
    DeepseekV3ForCausalLM of the config has: 671.0B parameters, 37.6B active per token."""
    from archspec.accounting import param_breakdown
    from archspec.hf import spec_from_config

    data = {k: v for k, v in _V3.items() if k != "quantization_config"}  # fp8 storage of the weights, not the model
    spec = load_spec_dict(spec_from_config(data, "DeepSeek-V3/config.json", "v3"))
    m = spec.model
    rope = m.attention.positional
    assert (m.attention.kind, rope.layout, rope.scaling.kind, rope.scaling.factor) == ("mla", "interleaved", "yarn", 40)
    assert m.attention.softmax_mscale == pytest.approx((0.1 * 1.0 * math.log(40) + 1.0) ** 2)
    moe = m.blocks()[3].ffn
    assert (moe.kind, moe.n_experts, moe.top_k, moe.score, moe.n_group, moe.topk_group, moe.routed_scaling_factor) == (
        "moe", 256, 8, "sigmoid", 8, 4, 2.5)
    assert [b.ffn.kind for b in m.blocks()[:4]] == ["glu", "glu", "glu", "moe"]
    parts, active = param_breakdown(m)
    assert sum(parts.values()) == 671_026_404_352 and active == 37_552_282_624  # 671.0B, 37.6B
    config = transformers.DeepseekV3Config(**data)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    assert _numel(hf) == 671_026_404_352


def test_deepseek_v3_checkpoint_with_a_partial_multi_token_prediction_layer_is_refused(tmp_path, capsys):
    """A checkpoint's MTP layer (model.layers.N.*, past num_hidden_layers) is imported whole (tests/test_mtp.py) or not
    at all: some of its tensors without the rest are refused, with num_nextn_predict_layers saying 1 (its missing
    weights named) or 0 (tensors the config does not account for)."""
    from safetensors.torch import load_file, save_file

    hf, src = _hf_dir(tmp_path, "deepseek_v3", seed=7)
    n = hf.config.num_hidden_layers
    weights = src / "model.safetensors"
    tensors = load_file(str(weights))
    tensors.update({f"model.layers.{n}.eh_proj.weight": torch.randn(32, 64), f"model.layers.{n}.enorm.weight":
                    torch.ones(32), f"model.layers.{n}.shared_head.head.weight": torch.randn(V, 32)})
    save_file(tensors, str(weights), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 0}))
    code = main(["import-hf", str(src), "-o", str(tmp_path / "no.yaml"), "--checkpoint", str(tmp_path / "no.pt")])
    assert code == 2 and "3 tensors the config does not account for" in capsys.readouterr().err
    (src / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    code = main(["import-hf", str(src), "-o", str(tmp_path / "one.yaml"), "--checkpoint", str(tmp_path / "one.pt")])
    err = capsys.readouterr().err
    assert code == 2 and "weights the config implies are missing" in err and f"model.layers.{n}.hnorm.weight" in err


def test_the_deepseek_v3_preset_exports_as_deepseek_v3_saying_what_training_settings_it_leaves_out():
    """deepseek-v3-like trains with a small balancing loss and bias balancing, which transformers' deepseek_v3 has no
    key for: the export chooses deepseek_v3 and says, once each, that those training settings are left out (the
    model computes the same); the routing, the latent attention and the interleaved rope pairs are in the config."""
    from archspec.errors import Caution
    from archspec.hf import config_from_spec

    spec = load_spec(Path(__file__).resolve().parent.parent / "specs" / "deepseek-v3-like-tiny.yaml")
    with pytest.warns(Caution) as said:
        hf, config = config_from_spec(spec)
    assert hf.model_type == "deepseek_v3"
    notes = [str(w.message) for w in said if isinstance(w.message, Caution)]
    assert sum("aux_loss_coef: 0.0001 left out" in n for n in notes) == 1, notes
    assert sum("bias_update_rate: 0.001 left out" in n for n in notes) == 1, notes
    assert (config["rope_interleave"], config["n_group"], config["topk_group"], config["routed_scaling_factor"],
            config["first_k_dense_replace"], config["kv_lora_rank"]) == (True, 4, 2, 2.5, 1, 64)
    transformers.DeepseekV3Config(**{k: v for k, v in config.items() if k != "model_type"})  # transformers takes it


# Released configs of the block-shape types (their config.json fields that set sizes), with the model cards' sizes.
_RELEASED_SHAPES = {
    "pythia-160m": ({"model_type": "gpt_neox", "hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12,
                     "num_hidden_layers": 12, "max_position_embeddings": 2048, "rotary_pct": 0.25,
                     "rotary_emb_base": 10000, "use_parallel_residual": True, "tie_word_embeddings": False,
                     "vocab_size": 50304, "layer_norm_eps": 1e-5, "hidden_act": "gelu"}, 0.162),
    "gpt-j-6b": ({"model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_layer": 28, "rotary_dim": 64,
                  "vocab_size": 50400, "n_positions": 2048, "activation_function": "gelu_new",
                  "layer_norm_epsilon": 1e-5, "n_inner": None, "tie_word_embeddings": False}, 6.05),
    "phi-2": ({"model_type": "phi", "hidden_size": 2560, "intermediate_size": 10240, "num_attention_heads": 32,
               "num_key_value_heads": 32, "num_hidden_layers": 32, "partial_rotary_factor": 0.4, "vocab_size": 51200,
               "max_position_embeddings": 2048, "layer_norm_eps": 1e-5, "hidden_act": "gelu_new",
               "qk_layernorm": False, "tie_word_embeddings": False}, 2.78),
    "stablelm-3b-4e1t": ({"model_type": "stablelm", "hidden_size": 2560, "intermediate_size": 6912,
                          "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
                          "vocab_size": 50304, "partial_rotary_factor": 0.25, "max_position_embeddings": 4096,
                          "layer_norm_eps": 1e-5, "use_qkv_bias": False, "hidden_act": "silu"}, 2.80),
    "OLMo-2-1124-7B": ({"model_type": "olmo2", "hidden_size": 4096, "intermediate_size": 11008,
                        "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
                        "vocab_size": 100352, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
                        "rope_theta": 500000, "attention_bias": False, "hidden_act": "silu"}, 7.30),
    "gemma-2b": ({"model_type": "gemma", "hidden_size": 2048, "intermediate_size": 16384, "num_attention_heads": 8,
                  "num_key_value_heads": 1, "head_dim": 256, "num_hidden_layers": 18, "vocab_size": 256000,
                  "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh"}, 2.51),
    # google/gemma-2-2b: 2,614,341,888 parameters (transformers' count of its config, tied embeddings)
    "gemma-2-2b": ({"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216, "num_attention_heads": 8,
                    "num_key_value_heads": 4, "head_dim": 256, "num_hidden_layers": 26, "vocab_size": 256000,
                    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh",
                    "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256, "sliding_window": 4096,
                    "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,
                    "cache_implementation": "hybrid", "rope_theta": 10000.0}, 2.614341888),
    "GLM-4-9B-0414": ({"model_type": "glm4", "hidden_size": 4096, "intermediate_size": 13696,
                       "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "num_hidden_layers": 40,
                       "vocab_size": 151552, "attention_bias": True, "partial_rotary_factor": 0.5,
                       "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}, 9.40),
}


@pytest.mark.parametrize("name", list(_RELEASED_SHAPES))
def test_released_block_shape_configs_import_with_their_published_sizes(name):
    """Accounting of the imported spec = transformers' own parameter count for the same config (built on the meta
    device) = the model card's size (to its rounding)."""
    from archspec.accounting import param_breakdown
    from archspec.hf import spec_from_config

    data, billions = _RELEASED_SHAPES[name]
    m = load_spec_dict(spec_from_config(data, f"{name}/config.json", "x")).model
    parts, _ = param_breakdown(m)
    config = transformers.AutoConfig.for_model(**data)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(parts.values()) == _numel(hf)
    assert sum(parts.values()) == pytest.approx(billions * 1e9, abs=0.01e9 if billions < 1 else 0.06e9)


def test_gemma2_files_without_layer_types_slide_the_even_layers_as_transformers_does():
    """Gemma2Config without layer_types: layer i slides when (i + 1) % 2; the spec equals the one read from the
    layer_types transformers fills in, and a window no shorter than the context hides nothing (full attention)."""
    from archspec.hf import spec_from_config

    data = CASES["gemma2"]().to_dict()
    assert data["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]
    without = {k: v for k, v in data.items() if k != "layer_types"}
    assert spec_from_config(without, "c", "x") == spec_from_config(data, "c", "x")
    model = load_spec_dict(spec_from_config(without, "c", "x")).model
    assert [b.attention.sparsity.kind for b in model.blocks()] == ["sliding_window", "dense", "sliding_window"]
    wide = load_spec_dict(spec_from_config(_set(data, sliding_window=C), "c", "x")).model
    assert {b.attention.sparsity.kind for b in wide.blocks()} == {"dense"}


def test_gemma2_greedy_generation_through_the_rolling_and_full_caches_equals_hf_generate(tmp_path, capsys):
    """Sandwich (1 + w) blocks, capped scores, query_pre_attn_scalar, window 6 layers beside global ones: KV-cached
    greedy decoding gives HF's tokens. The post-norm gains are raised so the sublayers, not the sqrt(d)-scaled
    embedding, steer the residual (lively text)."""
    hf, src = _hf_dir(tmp_path, "gemma2_generate", seed=7)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "post_" in name and "layernorm" in name:
                p.mul_(8.0)
            elif p.ndim == 2 and any(k in name for k in ("q_proj", "k_proj")):
                p.mul_(4.0)
    hf.save_pretrained(src)
    _, _, ours, _ = _import(tmp_path, src, capsys=capsys)
    _assert_greedy_equals_hf(hf, ours)


@pytest.mark.parametrize("preset", ["gemma2-like-tiny", "gemma2-like"])
def test_the_gemma2_presets_export_as_gemma2_with_hf_equal_logits(preset, tmp_path, capsys):
    """Gemma 2's recipe in the preset is one transformers' gemma2 says: exported, HF computes the same logits."""
    from archspec.train.checkpoint import save_weights

    spec = load_spec(str(Path(__file__).resolve().parent.parent / "specs" / f"{preset}.yaml"))
    torch.manual_seed(0)
    ours = generate(spec, write=False).Model()
    save_weights(tmp_path / "p.pt", canonical_dict(spec), model_hash(spec), ours.state_dict())
    out = tmp_path / "hf"
    assert main(["export-hf", str(tmp_path / "p.pt"), "-o", str(out)]) == 0, capsys.readouterr().err
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gemma2" and config["query_pre_attn_scalar"] == spec.model.attention.head_dim
    assert (config["attn_logit_softcapping"], config["final_logit_softcapping"]) == (50.0, 30.0)
    assert config["layer_types"] == ["sliding_attention", "full_attention"] * (spec.model.n_layers // 2)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    assert _numel(hf) == _numel(ours)
    idx = torch.randint(0, spec.model.vocab_size, (1, 16), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(_hf_logits(hf, idx), _logits(ours, idx), atol=ATOL, rtol=0)
