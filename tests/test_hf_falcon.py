"""Falcon both ways (issue 47): falcon-7b's shape (multi-query, attention and MLP in parallel from one LayerNorm), the
new decoder architecture (grouped q/k/v per K/V head in one fused query_key_value; two norms ln_attn/ln_mlp, or one),
the multi-head and sequential variants. Each tiny random FalconConfig imports with transformers' logits and greedy
tokens, exports to a directory transformers reloads with the same logits, and imports back to the same spec and
weights; ALiBi Falcons and switch combinations transformers cannot run are refused by key."""

from __future__ import annotations

import json

import pytest
import torch

from archspec.cli import main
from archspec.codegen import generate
from archspec.hf import config_from_spec, spec_from_config, state_from_hf, state_to_hf
from archspec.hf.types import FALCON, FALCON_NEW
from archspec.kinds.hf import HFUnsupported
from archspec.spec import canonical_dict, load_spec_dict
from tests.test_hf_interop import ATOL, C, V, _assert_greedy_equals_hf, _hf_logits, _import, _logits, _numel, _randomise

transformers = pytest.importorskip("transformers")

BASE = {"vocab_size": V, "hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 6,
        "max_position_embeddings": C, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
CASES = {  # name: (FalconConfig changes, the block archspec builds, K/V heads)
    "falcon_7b": ({}, {"parallel": True, "shared_norm": True}, 1),
    "new_two_norms": ({"new_decoder_architecture": True, "num_kv_heads": 2, "bias": True},
                      {"parallel": True, "shared_norm": False}, 2),
    "new_one_norm": ({"new_decoder_architecture": True, "num_kv_heads": 3, "num_ln_in_parallel_attn": 1},
                     {"parallel": True, "shared_norm": True}, 3),
    "multi_head": ({"multi_query": False, "bias": True, "ffn_hidden_size": 80}, {"parallel": True, "shared_norm": True},
                   6),
    "sequential": ({"parallel_attn": False, "activation": "relu"}, {"parallel": False}, 1),
}


def _hf_dir(tmp_path, case: str, seed: int = 0):
    config = transformers.FalconConfig(**BASE, **CASES[case][0])
    model = transformers.FalconForCausalLM(config)
    model.config._attn_implementation = "eager"
    _randomise(model, seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # lively text (not one token repeated): larger embeddings, sharper attention
        model.get_input_embeddings().weight.mul_(3.0)
        for name, p in model.named_parameters():
            if name.endswith(("ln_attn.weight", "ln_mlp.weight")):  # gains near 1, as _randomise gives other norms
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("query_key_value.weight"):
                p.mul_(6.0)
    out = tmp_path / f"hf-{case}"
    model.save_pretrained(out)
    return model.eval(), out


@pytest.mark.parametrize("case", list(CASES))
def test_falcon_imports_with_equal_logits_and_greedy_tokens_and_exports_back(case, tmp_path, capsys):
    hf, src = _hf_dir(tmp_path, case, seed=len(case))
    spec, state, ours, ckpt = _import(tmp_path, src, capsys=capsys)
    m = spec.model
    block, kv = CASES[case][1], CASES[case][2]
    assert m.attention.n_kv_heads == kv and m.norm.kind == "layernorm" and m.attention.positional.kind == "rope"
    assert {k: getattr(m.block, k) for k in block} == block
    assert _numel(ours) == _numel(hf)
    idx = torch.randint(0, V, (2, C), generator=torch.Generator().manual_seed(1))
    want = _hf_logits(hf, idx)
    assert want.abs().max() > 0.1
    torch.testing.assert_close(_logits(ours, idx), want, atol=ATOL, rtol=0)
    _assert_greedy_equals_hf(hf, ours)

    out = tmp_path / "exported"
    assert main(["export-hf", str(ckpt), "-o", str(out)]) == 0, capsys.readouterr().err
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == "falcon" and written["alibi"] is False
    back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    assert type(back).__name__ == "FalconForCausalLM" and _numel(back) == _numel(hf)
    torch.testing.assert_close(_hf_logits(back, idx), want, atol=ATOL, rtol=0)
    spec2, state2, _, _ = _import(tmp_path, out, name="again", capsys=capsys)  # archspec → HF → archspec
    assert canonical_dict(spec2)["model"] == canonical_dict(spec)["model"]
    assert all(torch.equal(state2["model"][k], v) for k, v in state["model"].items())


def _spec(n_heads=6, n_kv=2, parallel=True, shared_norm=False, **changes):
    model = {"vocab_size": V, "context_length": C, "d_model": 48, "n_layers": 2,
             "norm": {"kind": "layernorm", "eps": 1e-5, "bias": True},
             "attention": {"n_heads": n_heads, "n_kv_heads": n_kv, "bias": False,
                           "positional": {"kind": "rope", "theta": 10000.0}},
             "ffn": {"kind": "mlp", "activation": "gelu", "hidden_dim": 192, "bias": False},
             "block": {"parallel": parallel, "shared_norm": shared_norm} if parallel else {},
             "tie_embeddings": True, **changes}
    return load_spec_dict({"name": "falcon-like", "model": model})


def test_the_fused_rows_are_grouped_per_kv_head_as_falcon_splits_them():
    """HF's query_key_value rows: each K/V group's query heads, then its key and value (head_dim 8, 3 queries a
    group); ours: every query, then every key, then every value. Both ways exactly."""
    spec = _spec(n_heads=6, n_kv=2)
    hf_type, _ = config_from_spec(spec)
    assert hf_type is FALCON_NEW
    ours = generate(spec, write=False).Model()
    _randomise(ours, seed=4)
    state = ours.state_dict()
    theirs = state_to_hf(spec.model, hf_type, state)["transformer.h.0.self_attention.query_key_value.weight"]
    qkv = state["blocks.0.attn.qkv_proj.weight"]
    d = 8
    for g in range(2):
        rows = theirs[g * 5 * d:(g + 1) * 5 * d]
        torch.testing.assert_close(rows[:3 * d], qkv[g * 3 * d:(g + 1) * 3 * d], atol=0, rtol=0)  # its queries
        torch.testing.assert_close(rows[3 * d:4 * d], qkv[48 + g * d:48 + (g + 1) * d], atol=0, rtol=0)  # its key
        torch.testing.assert_close(rows[4 * d:], qkv[64 + g * d:64 + (g + 1) * d], atol=0, rtol=0)  # its value
    back = state_from_hf(spec.model, hf_type, state_to_hf(spec.model, hf_type, state), "model.safetensors")
    assert all(torch.equal(back[k], state[k]) for k in state)


@pytest.mark.parametrize("changes, key", [
    ({"alibi": True}, "alibi"),
    ({"new_decoder_architecture": True, "parallel_attn": False}, "parallel_attn"),
    ({"num_ln_in_parallel_attn": 2}, "num_ln_in_parallel_attn"),
    ({"multi_query": False, "num_kv_heads": 2}, "num_kv_heads"),
    ({"new_decoder_architecture": True, "num_kv_heads": 4}, "num_kv_heads"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    # a written null: transformers' `if config.multi_query` reads it as false (every head its own K/V), archspec's
    # default was true (one K/V head): the import built another model than transformers does
    ({"multi_query": None}, "multi_query"),
    ({"parallel_attn": None}, "parallel_attn"),
], ids=["alibi", "new-sequential", "two-norms-old", "mha-kv", "kv-divides", "derived-kv", "null-mq", "null-parallel"])
def test_what_falcon_archspec_cannot_run_is_refused_by_key(changes, key):
    data = {**transformers.FalconConfig(**BASE).to_dict(), **changes}
    data.pop("num_key_value_heads", None) if key != "num_key_value_heads" else None
    with pytest.raises(HFUnsupported, match=rf"config.json: {key}: .*\(falcon\)"):
        spec_from_config(data, "config.json", "f")


def test_alibi_falcon_is_refused_in_one_line_at_the_cli(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({**transformers.FalconConfig(**BASE).to_dict(), "alibi": True}))
    assert main(["import-hf", str(tmp_path), "-o", str(tmp_path / "f.yaml")]) == 2
    err = capsys.readouterr().err
    assert "alibi: true: Falcon adds ALiBi divided by sqrt(head_dim)" in err and "Traceback" not in err


def test_export_picks_the_falcon_shape_and_refuses_grouped_query_sequential_blocks():
    assert config_from_spec(_spec(n_kv=1, shared_norm=True))[0] is FALCON  # falcon-7b's shape
    hf_type, config = config_from_spec(_spec(n_kv=3, shared_norm=True))  # new architecture, one norm
    assert hf_type is FALCON and config["new_decoder_architecture"] and config["num_ln_in_parallel_attn"] == 1
    with pytest.raises(HFUnsupported) as info:
        config_from_spec(_spec(n_kv=2, parallel=False))
    assert any(r.startswith("falcon: model.attention.n_kv_heads: 2 cannot be expressed as falcon with a sequential")
               for r in info.value.problems), info.value.problems


# Released configs (tiiuae/falcon-7b, tiiuae/falcon-40b: config.json's fields that matter) and transformers' own
# count of each, in billions (falcon-7b: 6.92; falcon-40b: 41.30 with this config).
_RELEASED = {
    "falcon-7b": ({"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
                   "vocab_size": 65024, "multi_query": True, "parallel_attn": True, "new_decoder_architecture": False,
                   "bias": False, "alibi": False, "apply_residual_connection_post_layernorm": False,
                   "layer_norm_epsilon": 1e-5, "hidden_dropout": 0.0, "attention_dropout": 0.0,
                   "bos_token_id": 11, "eos_token_id": 11}, 6.92),
    "falcon-40b": ({"model_type": "falcon", "hidden_size": 8192, "num_attention_heads": 128, "num_kv_heads": 8,
                    "num_hidden_layers": 60, "vocab_size": 65024, "new_decoder_architecture": True,
                    "parallel_attn": True, "bias": False, "alibi": False, "layer_norm_epsilon": 1e-5,
                    "bos_token_id": 11, "eos_token_id": 11}, 41.30),
}


@pytest.mark.parametrize("name", list(_RELEASED))
def test_released_falcon_configs_import_at_transformers_parameter_count(name):
    from archspec.accounting import param_breakdown

    data, billions = _RELEASED[name]
    m = load_spec_dict(spec_from_config(data, f"{name}/config.json", "x")).model
    parts, _ = param_breakdown(m)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**data))
    assert sum(parts.values()) == _numel(hf)
    assert sum(parts.values()) == pytest.approx(billions * 1e9, abs=0.01e9)
