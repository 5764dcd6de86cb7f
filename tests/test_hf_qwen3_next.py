"""HF `qwen3_next` both ways (issue 45): Qwen3-Next's Gated DeltaNet / gated-attention layer pattern (`layer_types`)
becomes mixer layer groups, its MoE with a gated shared expert the moe kind, its (1 + w) norms rmsnorm's unit_offset.

A tiny random Qwen3NextForCausalLM (every parameter redrawn: A_log, dt_bias, the conv taps and the norms included),
saved and imported with `archspec import-hf`: parameter counts, logits and greedy generation equal transformers'.
Exported back with `archspec export-hf`: transformers reloads it with equal logits, and a second import gives the
same spec and weights. No downloads."""

from __future__ import annotations

import json

import pytest
import torch

from archspec.cli import main
from archspec.spec import canonical_dict
from tests.test_hf_interop import _import, _numel, _randomise

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
if not hasattr(transformers, "Qwen3NextConfig"):  # pragma: no cover
    pytest.skip("this transformers has no qwen3_next", allow_module_level=True)

V, C, ATOL = 96, 32, 1e-4
_NO_IDS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
LIN, FULL = "linear_attention", "full_attention"

CASES = {
    # Qwen3-Next's 3:1 pattern, 2 value heads per q/k head, MoE in every layer but one (mlp_only_layers)
    "hybrid": dict(layer_types=[LIN, LIN, LIN, FULL], mlp_only_layers=[1]),
    # the pattern from full_attention_interval; q/k/v/o biases; no GVA (as many value as q/k heads); unnormalised gates
    "interval": dict(num_hidden_layers=3, full_attention_interval=2, attention_bias=True, linear_num_value_heads=2,
                     norm_topk_prob=False),
    # Gated DeltaNet in every layer: no attention, no positions in the spec
    "linear_only": dict(layer_types=[LIN, LIN]),
}


def _config(case: str):
    extra = dict(CASES[case])
    n_layers = extra.pop("num_hidden_layers", None) or len(extra.get("layer_types", []))
    base = dict(vocab_size=V, max_position_embeddings=C, hidden_size=32, num_hidden_layers=n_layers,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48,
                linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=6,
                linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                shared_expert_intermediate_size=24, decoder_sparse_step=1)
    return transformers.Qwen3NextConfig(**{**base, **extra}, **_NO_IDS)


def _hf_logits(model, idx):
    with torch.no_grad():
        return model.eval()(input_ids=idx, use_cache=False).logits


@pytest.mark.parametrize("case", list(CASES))
def test_qwen3_next_import_export_round_trip(case, tmp_path, capsys):
    hf = transformers.AutoModelForCausalLM.from_config(_config(case), attn_implementation="eager")
    _randomise(hf, seed=len(case))
    with torch.no_grad():  # a decay that neither vanishes nor explodes over C positions
        for layer in hf.model.layers:
            if hasattr(layer, "linear_attn"):
                layer.linear_attn.A_log.uniform_(-1.0, 0.5)
    src = tmp_path / "hf"
    hf.save_pretrained(src)
    spec, state, ours, ckpt = _import(tmp_path, src, capsys=capsys)

    linear = [i for i, t in enumerate(hf.config.layer_types) if t == LIN]
    assert [i for i, b in enumerate(spec.model.blocks()) if b.token_mixer.kind == "gated_deltanet"] == linear
    if case == "linear_only":
        assert "attention" not in canonical_dict(spec)["model"]
    else:
        assert spec.model.attention.output_gate
    assert _numel(ours) == _numel(hf)
    idx = torch.randint(0, V, (2, C), generator=torch.Generator().manual_seed(1))
    want = _hf_logits(hf, idx)
    assert want.abs().max() > 0.1
    torch.testing.assert_close(ours.eval()(idx), want, atol=ATOL, rtol=0)

    out = tmp_path / "exported"
    assert main(["export-hf", str(ckpt), "-o", str(out)]) == 0, capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3_next"
    back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    assert back.config.layer_types == hf.config.layer_types
    torch.testing.assert_close(_hf_logits(back, idx), want, atol=ATOL, rtol=0)

    spec2, state2, _, _ = _import(tmp_path, out, name="again", capsys=capsys)
    assert canonical_dict(spec2)["model"] == canonical_dict(spec)["model"]
    assert all(torch.equal(state2["model"][k], v) for k, v in state["model"].items())


def test_qwen3_next_greedy_generation_equals_transformers(tmp_path, capsys):
    """Greedy decoding through the delta-rule state, the conv state and the KV cache, against transformers' own
    cached generation."""
    hf = transformers.AutoModelForCausalLM.from_config(_config("hybrid"), attn_implementation="eager")
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():  # weights at a scale where greedy choices vary from step to step
        for name, p in hf.named_parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=g) if "norm" in name or "A_log" in name
                    else 0.3 * torch.randn(p.shape, generator=g))
    hf.save_pretrained(tmp_path / "hf")
    _, _, ours, _ = _import(tmp_path, tmp_path / "hf", capsys=capsys)
    prompt = torch.randint(0, V, (1, 5), generator=torch.Generator().manual_seed(8))
    want = hf.eval().generate(prompt, max_new_tokens=20, do_sample=False, min_new_tokens=20)
    got = ours.eval().generate(prompt, max_new_tokens=20, temperature=0)
    assert len(set(want[0, 5:].tolist())) > 3  # the continuation is not one repeated token
    assert got.tolist() == want.tolist()


def test_a_gated_deltanet_or_gated_attention_model_is_refused_by_types_without_them():
    from archspec.hf.convert import _config_as
    from archspec.hf.types import TYPES
    from archspec.kinds.hf import HFUnsupported
    from archspec.spec import load_spec_dict

    base = {"vocab_size": V, "context_length": C, "d_model": 32, "n_layers": 3}
    gdn = load_spec_dict({"name": "h", "model": {**base, "attention": {"n_heads": 4},
                                                 "layers": {"g": {"select": [1], "mixer": {"kind": "gated_deltanet"}}}}})
    with pytest.raises(HFUnsupported, match=r"model\.layers\.g\.mixer\.kind .*llama"):
        _config_as(gdn, TYPES["llama"])
    gated = load_spec_dict({"name": "a", "model": {**base, "attention": {"n_heads": 4, "output_gate": True}}})
    with pytest.raises(HFUnsupported, match=r"model\.attention\.output_gate"):
        _config_as(gated, TYPES["llama"])
