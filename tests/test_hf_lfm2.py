"""HF `lfm2` both ways (issue 43): LFM2's conv/attention layer pattern (`layer_types`) becomes mixer layer groups.

A tiny random Lfm2ForCausalLM (every parameter redrawn, the conv taps and norms included), saved and imported with
`archspec import-hf`: parameter counts, logits and greedy generation equal transformers'. Exported back with
`archspec export-hf`: transformers reloads it with equal logits, and a second import gives the same spec and weights.
No downloads. (transformers' own Lfm2 needs `use_cache=False` for a model without attention layers: its mask helper
asks the cache for an attention layer.)"""

from __future__ import annotations

import json

import pytest
import torch

from archspec.cli import main
from archspec.spec import canonical_dict
from tests.test_hf_interop import _import, _numel, _randomise

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

V, C, ATOL = 96, 32, 1e-4
_NO_IDS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
CONV, FULL = "conv", "full_attention"

CASES = {
    # LFM2's hybrid: conv and GQA layers with q/k norm, tied, the MLP width as written
    "hybrid": dict(layer_types=[CONV, FULL, CONV, FULL], conv_L_cache=3, block_auto_adjust_ff_dim=False,
                   intermediate_size=40),
    # transformers' width rule (2/3, times the multiplier, rounded up to a multiple), a kernel of 4, biases
    "hybrid_adjusted": dict(layer_types=[FULL, CONV, CONV], conv_L_cache=4, conv_bias=True,
                            block_auto_adjust_ff_dim=True, intermediate_size=60, block_multiple_of=8,
                            tie_word_embeddings=False),
    # full_attn_idxs instead of layer_types
    "attn_idxs": dict(full_attn_idxs=[2], conv_L_cache=2, block_auto_adjust_ff_dim=False, intermediate_size=40),
    # conv in every layer: no attention, no positions in the spec
    "conv_only": dict(layer_types=[CONV, CONV], conv_L_cache=3, block_auto_adjust_ff_dim=False,
                      intermediate_size=40),
}


def _config(case: str):
    extra = dict(CASES[case])
    n_layers = len(extra.get("layer_types", [])) or 3
    return transformers.Lfm2Config(vocab_size=V, max_position_embeddings=C, hidden_size=32, num_hidden_layers=n_layers,
                                   num_attention_heads=4, num_key_value_heads=2, **extra, **_NO_IDS)


def _hf_logits(model, idx):
    with torch.no_grad():
        return model.eval()(input_ids=idx, use_cache=False).logits


@pytest.mark.parametrize("case", list(CASES))
def test_lfm2_import_export_round_trip(case, tmp_path, capsys):
    hf = transformers.AutoModelForCausalLM.from_config(_config(case), attn_implementation="eager")
    _randomise(hf, seed=len(case))
    src = tmp_path / "hf"
    hf.save_pretrained(src)
    spec, state, ours, ckpt = _import(tmp_path, src, capsys=capsys)

    convs = [i for i, t in enumerate(hf.config.layer_types) if t == CONV]
    assert [i for i, b in enumerate(spec.model.blocks()) if b.token_mixer is not b.attention] == convs
    assert all(b.token_mixer.L_cache == hf.config.conv_L_cache for b in spec.model.blocks()
               if b.token_mixer is not b.attention)
    if case == "conv_only":
        assert "attention" not in canonical_dict(spec)["model"]
    assert _numel(ours) == _numel(hf)
    idx = torch.randint(0, V, (2, C), generator=torch.Generator().manual_seed(1))
    want = _hf_logits(hf, idx)
    assert want.abs().max() > 0.1
    torch.testing.assert_close(ours.eval()(idx), want, atol=ATOL, rtol=0)

    out = tmp_path / "exported"
    assert main(["export-hf", str(ckpt), "-o", str(out)]) == 0, capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["model_type"] == "lfm2"
    back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    assert back.config.layer_types == hf.config.layer_types
    torch.testing.assert_close(_hf_logits(back, idx), want, atol=ATOL, rtol=0)

    spec2, state2, _, _ = _import(tmp_path, out, name="again", capsys=capsys)
    assert canonical_dict(spec2)["model"] == canonical_dict(spec)["model"]
    assert all(torch.equal(state2["model"][k], v) for k, v in state["model"].items())


def test_lfm2_greedy_generation_equals_transformers(tmp_path, capsys):
    """Greedy decoding through the conv state and the KV cache, against transformers' own cached generation."""
    config = _config("hybrid")
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():  # weights at a scale where greedy choices vary from step to step
        for name, p in hf.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g) if "norm" in name
                    else 0.3 * torch.randn(p.shape, generator=g))
    hf.save_pretrained(tmp_path / "hf")
    _, _, ours, _ = _import(tmp_path, tmp_path / "hf", capsys=capsys)
    prompt = torch.randint(0, V, (1, 5), generator=torch.Generator().manual_seed(8))
    want = hf.eval().generate(prompt, max_new_tokens=20, do_sample=False, min_new_tokens=20)
    got = ours.eval().generate(prompt, max_new_tokens=20, temperature=0)
    assert len(set(want[0, 5:].tolist())) > 3  # the continuation is not one repeated token
    assert got.tolist() == want.tolist()


def test_a_conv_model_cannot_be_written_as_an_attention_only_type(tmp_path, capsys):
    """An attention-only type is refused by name for a conv layer; lfm2, the one that can say it, is chosen."""
    from archspec.hf.convert import _config_as
    from archspec.hf.types import TYPES
    from archspec.kinds.hf import HFUnsupported
    from archspec.spec import load_spec_dict

    spec = load_spec_dict({"name": "h", "model": {
        "vocab_size": V, "context_length": C, "d_model": 32, "n_layers": 3, "attention": {"n_heads": 4},
        "layers": {"c": {"select": [1], "mixer": {"kind": "short_conv"}}}}})
    with pytest.raises(HFUnsupported, match=r"model\.layers\.c\.mixer\.kind .*llama"):
        _config_as(spec, TYPES["llama"])


def test_an_lfm2_without_conv_layers_imports(tmp_path, capsys):
    """transformers writes the conv's keys (conv_L_cache, conv_bias) into every Lfm2Config; when no layer is a conv no
    layer reads them, so they are not 'fields archspec does not map' (that refusal used to stop every attention-only
    LFM2). The import computes transformers' logits."""
    hf = transformers.AutoModelForCausalLM.from_config(
        transformers.Lfm2Config(vocab_size=V, max_position_embeddings=C, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, layer_types=[FULL, FULL], conv_L_cache=5,
                                conv_bias=True, block_auto_adjust_ff_dim=False, intermediate_size=40, **_NO_IDS),
        attn_implementation="eager")
    _randomise(hf, seed=3)
    hf.save_pretrained(tmp_path / "hf")
    assert "conv_L_cache" in json.loads((tmp_path / "hf" / "config.json").read_text())
    spec, _, ours, _ = _import(tmp_path, tmp_path / "hf", capsys=capsys)
    assert all(b.token_mixer is b.attention for b in spec.model.blocks())
    idx = torch.randint(0, V, (2, C), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(ours.eval()(idx), _hf_logits(hf, idx), atol=ATOL, rtol=0)


@pytest.mark.parametrize("idxs", [[9], [3], [1, 3], ["1"], [True], [1.0], [0.5], [None], [[1]]])
def test_full_attn_idxs_are_layer_indices(idxs, tmp_path, capsys):
    """full_attn_idxs names layers: an index past the model, or a value Python's `in` would read as a layer (`true`
    and `1.0` as layer 1, `"1"` as none), is refused by its key in one line, before anything is written. Without the
    check such a config imported silently with the wrong mixer in some layers."""
    config = _config("attn_idxs").to_dict()  # three layers
    config.pop("layer_types")
    config["full_attn_idxs"] = idxs
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out.yaml"
    assert main(["import-hf", str(tmp_path / "config.json"), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "full_attn_idxs" in err[0] and "0..2" in err[0], err
    assert not out.exists()
