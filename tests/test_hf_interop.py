"""HF transformers interop (issue 16): `archspec import-hf` and `archspec export-hf`, both ways, through the CLI.

Every model is built here from a tiny config, every parameter re-drawn (norm weights around 1, biases non-zero, so
a mapping that only works at the default init fails), saved with `save_pretrained` (safetensors), imported, and
compared in fp32 with eager attention on both sides: parameter counts equal, logits within 1e-4 at T = context
length (no sliding window is in play: the types that have one are refused until archspec has the kind). Then
exported back, loaded with `AutoModelForCausalLM.from_pretrained` (logits equal again) and imported once more:
the spec and every weight come back exactly. No downloads.
"""

from __future__ import annotations

import json

import pytest
import torch

from archspec.cli import main
from archspec.codegen import generate
from archspec.spec import canonical_dict, load_spec, load_spec_dict, spec_hash

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


@pytest.mark.parametrize("model", [
    {"norm": {"kind": "layernorm"}, "attention": {"n_heads": 4, "bias": True, "positional": {"kind": "learned"}},
     "ffn": {"kind": "mlp", "activation": "gelu_tanh", "hidden_dim": 40}},
    {"attention": {"n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "qk_norm": {"eps": 1e-5},
                   "positional": {"kind": "rope", "theta": 1000.0, "scaling": {"kind": "linear", "factor": 3.0}}},
     "norm": {"kind": "rmsnorm", "eps": 1e-5}, "ffn": {"kind": "glu", "activation": "gelu", "hidden_dim": 24},
     "tie_embeddings": False},
], ids=["gpt2-like", "qwen3-like"])
def test_archspec_to_hf_to_archspec_is_lossless(model, tmp_path, capsys):
    from archspec.train.checkpoint import save_weights

    spec = load_spec_dict({"name": "mine", "model": {"vocab_size": V, "context_length": C, "d_model": 32,
                                                     "n_layers": 2, **model}})
    ours = generate(spec, write=False).Model()
    _randomise(ours, 7)
    save_weights(tmp_path / "mine.pt", canonical_dict(spec), spec_hash(spec), ours.state_dict())
    out = tmp_path / "hf"
    assert main(["export-hf", str(tmp_path / "mine.pt"), "-o", str(out)]) == 0, capsys.readouterr().err
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    assert _numel(hf) == _numel(ours)
    idx = torch.randint(0, V, (2, C), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(_hf_logits(hf, idx), _logits(ours, idx), atol=ATOL, rtol=0)
    spec2, state2, _, _ = _import(tmp_path, out, name="back", capsys=capsys)
    assert canonical_dict(spec2)["model"] == canonical_dict(spec)["model"]
    assert all(torch.equal(state2["model"][k], v) for k, v in ours.state_dict().items())


# ── refusals: by field name, exit 2, nothing written ────────────────────────────────────────────────────────────


def _llama_config() -> dict:
    return CASES["llama"]().to_dict()


def _set(data: dict, **changes) -> dict:
    return {**data, **changes}


REFUSED = {
    "partial_rotary": (lambda: _set(_llama_config(), partial_rotary_factor=0.5), "partial_rotary_factor"),
    "yarn": (lambda: _set(_llama_config(), rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}),
             "rope_type 'yarn'"),
    "softcapping": (lambda: _set(_llama_config(), final_logit_softcapping=30.0), "final_logit_softcapping"),
    "unknown_type": (lambda: _set(_llama_config(), model_type="bert"), "model_type: 'bert'"),
    "mixtral": (lambda: _set(_llama_config(), model_type="mixtral"), "model_type: 'mixtral' needs"),
    "mistral_window": (lambda: _set(CASES["mistral"]().to_dict(), sliding_window=8), "sliding_window: 8"),
    "qwen2_mixed_layers": (lambda: {k: v for k, v in _set(CASES["qwen2"]().to_dict(), use_sliding_window=True,
                                                          sliding_window=8, max_window_layers=1).items()
                                    if k != "layer_types"}, "layer_types"),
    "dropouts_differ": (lambda: _set(CASES["gpt2"]().to_dict(), attn_pdrop=0.1), "dropout rates differ"),
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
], ids=["sinusoidal", "nope", "gpt2-without-norm-bias", "out-bias-only"])
def test_export_refuses_what_hf_cannot_express(model, field, tmp_path, capsys):
    from archspec.train.checkpoint import save_weights

    spec = load_spec_dict({"name": "x", "model": {"vocab_size": V, "context_length": C, "d_model": 32,
                                                  "n_layers": 1, **model}})
    save_weights(tmp_path / "x.pt", canonical_dict(spec), spec_hash(spec),
                 generate(spec, write=False).Model().state_dict())
    code = main(["export-hf", str(tmp_path / "x.pt"), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and field in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_export_refuses_a_non_empty_directory_and_a_missing_source(tmp_path, capsys):
    from archspec.train.checkpoint import save_weights

    spec = load_spec_dict({"name": "x", "model": {"vocab_size": V, "context_length": C, "d_model": 32,
                                                  "n_layers": 1, "attention": {"n_heads": 4}}})
    save_weights(tmp_path / "x.pt", canonical_dict(spec), spec_hash(spec),
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


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "qwen2", "qwen3", "mistral"])
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
    assert m.tie_embeddings == ref.tie_word_embeddings
