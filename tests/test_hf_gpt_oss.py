"""gpt-oss both ways (issue 47): a tiny random GptOssConfig (attention sinks, alternating sliding/full layers, biased
experts with gpt-oss's clamped SwiGLU stored interleaved in gate_up_proj, a biased router, yarn or plain rope)
imports with transformers' logits and greedy tokens, exports to a directory transformers reloads with the same
logits, and imports back to the same spec and weights. The released gpt-oss-20b config imports at transformers'
parameter count (on the meta device: no download, no memory); what gpt_oss cannot say is refused by name."""

from __future__ import annotations

import json

import pytest
import torch

from archspec.accounting import account
from archspec.cli import main
from archspec.codegen import generate
from archspec.hf import spec_from_config
from archspec.spec import canonical_dict, load_spec_dict
from tests.test_hf_interop import ATOL, C, V, _assert_greedy_equals_hf, _hf_logits, _import, _logits, _numel, _randomise

transformers = pytest.importorskip("transformers")

BASE = {"vocab_size": V, "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "num_local_experts": 4, "num_experts_per_tok": 2,
        "intermediate_size": 16, "sliding_window": 6, "max_position_embeddings": C,
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
CASES = {
    "plain_rope": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
    # GptOssConfig's own rope (yarn, 32× from 4096, truncate false); a sharper clamp so that it bites more often
    "default_yarn": {"swiglu_limit": 2.5, "swiglu_alpha": 1.5, "max_position_embeddings": 8192},
}


def _hf_model(case: str, seed: int = 0):
    model = transformers.GptOssForCausalLM(transformers.GptOssConfig(**{**BASE, **CASES[case]}))
    model.config._attn_implementation = "eager"  # the sinks' reference path
    _randomise(model, seed)
    with torch.no_grad():  # sinks, router bias and expert pre-activations large enough to matter
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.mul_(20.0)
            elif ".router." in name:
                p.mul_(10.0)
            elif name.endswith("gate_up_proj"):
                p.mul_(30.0)
        model.get_input_embeddings().weight.mul_(3.0)
    return model.eval()


def _hf_dir(tmp_path, case: str, seed: int = 0):
    model = _hf_model(case, seed)
    out = tmp_path / f"hf-{case}"
    model.save_pretrained(out)
    return model, out


@pytest.mark.parametrize("case", list(CASES))
def test_gpt_oss_imports_with_equal_logits_and_greedy_tokens_and_exports_back(case, tmp_path, capsys):
    hf, src = _hf_dir(tmp_path, case, seed=len(case))
    spec, state, ours, ckpt = _import(tmp_path, src, capsys=capsys)
    m = spec.model
    assert m.attention.sinks and m.attention.sparsity.kind == "sliding_window" and m.attention.sparsity.window == 6
    assert [b.attention.sparsity.kind for b in m.blocks()] == ["sliding_window", "dense"] * 2  # alternating
    assert all(b.attention.sinks for b in m.blocks())
    ffn = m.ffn
    assert ffn.router_bias and ffn.expert.bias and ffn.clamped_swiglu is not None
    assert (ffn.clamped_swiglu.limit, ffn.clamped_swiglu.alpha) == (hf.config.swiglu_limit, hf.config.swiglu_alpha)
    assert (m.attention.positional.scaling is not None) == (case == "default_yarn")
    assert _numel(ours) == _numel(hf) == account(spec).total
    idx = torch.randint(0, V, (2, C), generator=torch.Generator().manual_seed(1))
    want = _hf_logits(hf, idx)
    assert want.abs().max() > 0.1
    torch.testing.assert_close(_logits(ours, idx), want, atol=ATOL, rtol=0)
    _assert_greedy_equals_hf(hf, ours)

    out = tmp_path / "exported"
    assert main(["export-hf", str(ckpt), "-o", str(out)]) == 0, capsys.readouterr().err
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == "gpt_oss" and written["layer_types"] == ["sliding_attention", "full_attention"] * 2
    back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    assert type(back).__name__ == "GptOssForCausalLM" and _numel(back) == _numel(hf)
    torch.testing.assert_close(_hf_logits(back, idx), want, atol=ATOL, rtol=0)
    spec2, state2, _, _ = _import(tmp_path, out, name="again", capsys=capsys)  # archspec → HF → archspec
    assert canonical_dict(spec2)["model"] == canonical_dict(spec)["model"]
    assert all(torch.equal(state2["model"][k], v) for k, v in state["model"].items())


def test_the_interleaved_gate_up_maps_to_readable_gate_and_up(tmp_path, capsys):
    """gate_proj[e] is HF's gate_up_proj[e][:, 0::2] transposed, up_proj[e] its [:, 1::2]: checked on the tensors."""
    hf, src = _hf_dir(tmp_path, "plain_rope", seed=3)
    _, state, _, _ = _import(tmp_path, src, capsys=capsys)
    experts = hf.model.layers[1].mlp.experts
    ours = state["model"]
    torch.testing.assert_close(ours["blocks.1.ffn.experts.gate_proj"], experts.gate_up_proj[:, :, 0::2].transpose(1, 2))
    torch.testing.assert_close(ours["blocks.1.ffn.experts.up_proj"], experts.gate_up_proj[:, :, 1::2].transpose(1, 2))
    torch.testing.assert_close(ours["blocks.1.ffn.experts.gate_bias"], experts.gate_up_proj_bias[:, 0::2])
    torch.testing.assert_close(ours["blocks.1.ffn.experts.down_proj"], experts.down_proj.transpose(1, 2))
    torch.testing.assert_close(ours["blocks.1.attn.sinks"], hf.model.layers[1].self_attn.sinks)


def test_the_clamp_the_sinks_and_the_router_bias_each_change_the_output(tmp_path, capsys):
    """Each gpt-oss part is in effect in the tiny model: turning one off moves the logits (the comparison with
    transformers above would then not hold)."""
    _, src = _hf_dir(tmp_path, "default_yarn", seed=5)
    spec, state, ours, _ = _import(tmp_path, src, capsys=capsys)
    idx = torch.randint(0, V, (2, C), generator=torch.Generator().manual_seed(2))
    base = _logits(ours, idx)
    data = canonical_dict(spec)
    for change in ({"clamped_swiglu": {"limit": 1e4, "alpha": 1.5}}, {"router_bias": False}):
        model = generate(load_spec_dict({"name": "x", "model": {**data["model"], "ffn": {**data["model"]["ffn"], **change},
                                                                 "layers": data["model"]["layers"]}}),
                         write=False).Model()
        model.load_state_dict({k: v for k, v in state["model"].items() if "router.bias" not in k or change.get(
            "router_bias", True)}, strict=True)
        assert (_logits(model, idx) - base).abs().max() > 1e-3, change
    with torch.no_grad():
        for block in ours.blocks:
            block.attn.sinks.fill_(-1e4)
    assert (_logits(ours, idx) - base).abs().max() > 1e-3


# gpt-oss-20b's config.json as released (openai/gpt-oss-20b), written out from its public values.
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0, "eos_token_id": 200002,
    "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
    "initializer_range": 0.02, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12, "max_position_embeddings": 131072,
    "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24,
    "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 201088,
}


def test_released_gpt_oss_20b_config_imports_at_transformers_parameter_count():
    with pytest.warns(Warning, match="quantization_config"):
        spec = load_spec_dict(spec_from_config(dict(GPT_OSS_20B), "gpt-oss-20b/config.json", "gpt-oss-20b"))
    m = spec.model
    assert (m.n_layers, m.d_model, m.attention.n_heads, m.attention.n_kv_heads, m.attention.head_dim) == (24, 2880, 64,
                                                                                                         8, 64)
    assert (m.ffn.n_experts, m.ffn.top_k, m.ffn.expert.hidden_dim) == (32, 4, 2880)
    assert [b.attention.sparsity.kind for b in m.blocks()] == ["sliding_window", "dense"] * 12
    assert m.attention.sparsity.window == 128 and m.attention.positional.scaling.kind == "yarn"
    config = {k: v for k, v in GPT_OSS_20B.items() if k != "quantization_config"}  # the bf16 model it describes
    with torch.device("meta"):
        hf = transformers.GptOssForCausalLM(transformers.GptOssConfig(**config))
    want = _numel(hf)
    assert 20e9 < want < 22e9  # "21B parameters"
    assert account(spec).total == want
    with torch.device("meta"):
        ours = generate(spec, write=False).Model()
    assert _numel(ours) == want
    active = account(spec).active  # "3.6B active": 4 of 32 experts, attention, router, embeddings and head
    assert 3.5e9 < active < 4.3e9


@pytest.mark.parametrize("change,key", [
    ({"swiglu_limit": 0.0}, "swiglu_limit"), ({"swiglu_limit": -7.0}, "swiglu_limit"),
    ({"swiglu_alpha": 0.0}, "swiglu_alpha"), ({"experts_per_token": 3}, "experts_per_token"),
    ({"layer_types": ["sliding_attention", "chunked_attention"] * 2}, "layer_types"),
])
def test_bad_gpt_oss_configs_exit_2_naming_the_key(change, key, tmp_path, capsys):
    src = tmp_path / "cfg"
    src.mkdir()
    cfg = {**{k: v for k, v in BASE.items() if v is not None}, "model_type": "gpt_oss", "num_hidden_layers": 4, **change}
    (src / "config.json").write_text(json.dumps(cfg))
    assert main(["import-hf", str(src), "-o", str(tmp_path / "s.yaml")]) == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("setting,field", [
    ("model.ffn.clamped_swiglu={limit: 0}", "model.ffn.clamped_swiglu.limit"),
    ("model.ffn.clamped_swiglu={limit: -1.0}", "model.ffn.clamped_swiglu.limit"),
    ("model.ffn.clamped_swiglu={alpha: 0}", "model.ffn.clamped_swiglu.alpha"),
    ("model.ffn.clamped_swiglu={limit: 7, beta: 1}", "model.ffn.clamped_swiglu.beta"),
    ("model.ffn.expert.activation=gelu", "model.ffn.clamped_swiglu"),
    ("model.ffn.router_bias=sometimes", "model.ffn.router_bias"),
])
def test_bad_gpt_oss_spec_fields_exit_2_naming_the_field(setting, field, tmp_path, capsys):
    rc = main(["build", "specs/gpt-oss-like-tiny.yaml", "--set", setting, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and field in err and "Traceback" not in err


def test_sinks_and_the_clamp_are_refused_by_name_by_every_type_but_gpt_oss():
    from archspec.hf import config_from_spec
    from archspec.kinds.hf import HFUnsupported

    dense = load_spec_dict({"name": "s", "model": {"vocab_size": 64, "context_length": 16, "d_model": 32,
                                                   "n_layers": 2, "attention": {"n_heads": 4, "sinks": True}}})
    with pytest.raises(HFUnsupported) as e:  # gpt_oss's FFN is a MoE: no type takes sinks with a dense FFN
        config_from_spec(dense)
    llama = next(r for r in e.value.problems if r.startswith("llama:"))
    assert "model.attention.sinks" in llama
    tiny = load_spec_dict({"name": "t", "model": {"vocab_size": 64, "context_length": 16, "d_model": 32,
                                                  "n_layers": 2, "attention": {"n_heads": 4},
                                                  "ffn": {"kind": "moe", "n_experts": 4, "top_k": 2,
                                                          "expert": {"hidden_dim": 16},
                                                          "clamped_swiglu": {"limit": 3.0}}}})
    with pytest.raises(HFUnsupported) as e:
        config_from_spec(tiny)
    assert "model.ffn.clamped_swiglu" in next(r for r in e.value.problems if r.startswith("mixtral:"))
    assert next(r for r in e.value.problems if r.startswith("gpt_oss:")).startswith("gpt_oss: model.")  # by field
