"""HF `mamba2` both ways (issue 45): Mamba2ForCausalLM (every layer norm → Mamba2Mixer → residual, no MLP) is a spec
with `model.mixer: {kind: mamba2}` and `ffn: {kind: none}`.

A tiny random Mamba2ForCausalLM (every parameter redrawn: A_log, dt_bias, D, the conv and the gated norm included),
saved and imported with `archspec import-hf`: parameter counts, logits and greedy generation equal transformers'.
Exported back with `archspec export-hf`: transformers reloads it with equal logits, and a second import gives the same
spec and weights. Hybrid types whose parts archspec lacks are refused naming the part. No downloads."""

from __future__ import annotations

import json

import pytest
import torch

from archspec.cli import main
from archspec.spec import canonical_dict
from tests.test_hf_interop import _import, _numel, _randomise

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

V, C, ATOL = 96, 24, 1e-4
_NO_IDS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
CASES = {
    # two groups of B/C, chunks shorter than the sequence (and not dividing it), untied
    "grouped": dict(num_heads=8, head_dim=8, state_size=4, n_groups=2, expand=2, conv_kernel=4, chunk_size=5),
    # one group, biases on the projections, no conv bias, tied, a chunk longer than the sequence
    "biased_tied": dict(num_heads=4, head_dim=8, state_size=6, n_groups=1, expand=1, conv_kernel=3, chunk_size=64,
                        use_bias=True, use_conv_bias=False, tie_word_embeddings=True),
}


def _config(case: str):
    return transformers.Mamba2Config(vocab_size=V, hidden_size=32, num_hidden_layers=2, **CASES[case], **_NO_IDS)


def _hf_logits(model, idx):
    with torch.no_grad():
        return model.eval()(input_ids=idx, use_cache=False).logits


@pytest.mark.parametrize("case", list(CASES))
def test_mamba2_import_export_round_trip(case, tmp_path, capsys):
    hf = transformers.AutoModelForCausalLM.from_config(_config(case))
    _randomise(hf, seed=len(case))
    src = tmp_path / "hf"
    hf.save_pretrained(src)
    spec, state, ours, ckpt = _import(tmp_path, src, capsys=capsys)

    model = canonical_dict(spec)["model"]
    assert model["mixer"]["kind"] == "mamba2" and model["ffn"] == {"kind": "none"} and "attention" not in model
    assert _numel(ours) == _numel(hf)
    idx = torch.randint(0, V, (2, C), generator=torch.Generator().manual_seed(1))
    want = _hf_logits(hf, idx)
    assert want.abs().max() > 0.1
    torch.testing.assert_close(ours.eval()(idx), want, atol=ATOL, rtol=0)

    out = tmp_path / "exported"
    assert main(["export-hf", str(ckpt), "-o", str(out)]) == 0, capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["model_type"] == "mamba2"
    back = transformers.AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(_hf_logits(back, idx), want, atol=ATOL, rtol=0)

    spec2, state2, _, _ = _import(tmp_path, out, name="again", capsys=capsys)
    assert canonical_dict(spec2)["model"] == canonical_dict(spec)["model"]
    assert all(torch.equal(state2["model"][k], v) for k, v in state["model"].items())


def test_mamba2_greedy_generation_equals_transformers(tmp_path, capsys):
    """Greedy decoding through the conv and SSM states, against transformers' own cached generation."""
    hf = transformers.AutoModelForCausalLM.from_config(_config("grouped"))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():  # weights at a scale where greedy choices vary from step to step
        for name, p in hf.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g) if "norm" in name
                    else 0.3 * torch.randn(p.shape, generator=g))
    hf.save_pretrained(tmp_path / "hf")
    _, _, ours, _ = _import(tmp_path, tmp_path / "hf", capsys=capsys)
    prompt = torch.randint(0, V, (1, 7), generator=torch.Generator().manual_seed(8))
    want = hf.eval().generate(prompt, max_new_tokens=12, do_sample=False, min_new_tokens=12)
    got = ours.eval().generate(prompt, max_new_tokens=12, temperature=0)
    assert len(set(want[0, 7:].tolist())) > 3  # the continuation is not one repeated token
    assert got.tolist() == want.tolist()


def test_a_mamba2_model_cannot_be_written_as_another_type_and_hybrids_name_the_missing_part():
    from archspec.hf.convert import _config_as, hf_type
    from archspec.hf.types import TYPES
    from archspec.kinds.hf import HFUnsupported
    from archspec.spec import load_spec_dict

    hybrid = load_spec_dict({"name": "h", "model": {
        "vocab_size": V, "context_length": C, "d_model": 32, "n_layers": 2, "attention": {"n_heads": 4},
        "layers": {"s": {"select": [0], "mixer": {"kind": "mamba2", "head_dim": 8, "d_state": 4}}}}})
    with pytest.raises(HFUnsupported, match=r"model\.layers\.s\.mixer\.kind .*llama"):
        _config_as(hybrid, TYPES["llama"])
    with pytest.raises(HFUnsupported, match=r"mamba2"):
        _config_as(hybrid, TYPES["mamba2"])  # its attention layer: mamba2 mixes tokens by Mamba-2 only
    for model_type, part in (("nemotron_h", "MLP alone"), ("falcon_h1", "side by side")):
        with pytest.raises(HFUnsupported, match=part):
            hf_type(model_type, "config.json")


def test_a_clamped_time_step_is_refused_by_its_key(tmp_path, capsys):
    hf = transformers.AutoModelForCausalLM.from_config(_config("grouped"))
    hf.save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    data = json.loads(path.read_text())
    data["time_step_limit"] = [0.0, 0.5]
    path.write_text(json.dumps(data))
    assert main(["import-hf", str(tmp_path / "hf"), "-o", str(tmp_path / "s.yaml")]) == 2
    err = capsys.readouterr().err
    assert "time_step_limit" in err and "Traceback" not in err
