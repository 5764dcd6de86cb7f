"""HF `bamba` both ways (issue 45): BambaForCausalLM (Mamba-2 layers and GQA layers by attn_layer_indices, each
followed by a SwiGLU; half-layout partial rotary) is a spec whose layers the Mamba-2 mixer and attention share, the
mamba2 mixer kind in the layer groups transformers' attn_layer_indices leaves to Mamba-2.

A tiny random BambaForCausalLM (every parameter redrawn: A_log, dt_bias, D, the conv and the gated norm included),
saved and imported with `archspec import-hf`: parameter counts, logits and greedy generation equal transformers'.
Exported back with `archspec export-hf`: transformers reloads it with equal logits, and a second import gives the same
spec and weights. A config switch archspec has no part for is refused by its key. No downloads."""

from __future__ import annotations

import json

import pytest
import torch

from archspec.cli import main
from archspec.spec import canonical_dict
from tests.test_hf_interop import _import, _numel, _randomise

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
if not hasattr(transformers, "BambaConfig"):  # pragma: no cover
    pytest.skip("this transformers has no bamba", allow_module_level=True)

V, C, ATOL = 96, 24, 1e-4
_NO_IDS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
CASES = {
    # Mamba-2 around one attention layer: two groups of B/C, chunks shorter than the sequence (and not dividing it)
    "hybrid": dict(num_hidden_layers=3, attn_layer_indices=[1], mamba_n_groups=2, mamba_chunk_size=5),
    # attention first, biases everywhere (q/k/v/o, the MLP, the Mamba-2 projections), no conv bias, tied, the
    # default mamba_d_head ("auto"), a chunk longer than the sequence, another rotary fraction (rope_parameters)
    "biased_tied": dict(num_hidden_layers=2, attn_layer_indices=[0], attention_bias=True, mlp_bias=True,
                        mamba_proj_bias=True, mamba_conv_bias=False, tie_word_embeddings=True, mamba_d_head="auto",
                        mamba_chunk_size=64, mamba_d_conv=3,
                        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25}),
    # no attn_layer_indices: every layer Mamba-2 (each with its SwiGLU), no attention in the spec
    "mamba_only": dict(num_hidden_layers=2, mamba_n_groups=4, mamba_chunk_size=7),
}


def _config(case: str):
    extra = dict(CASES[case])
    base = dict(vocab_size=V, max_position_embeddings=C, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                num_key_value_heads=2, mamba_n_heads=8, mamba_d_head=8, mamba_d_state=4, mamba_expand=2)
    return transformers.BambaConfig(**{**base, **extra}, **_NO_IDS)


def _hf_logits(model, idx):
    with torch.no_grad():
        return model.eval()(input_ids=idx, use_cache=False).logits


@pytest.mark.parametrize("case", list(CASES))
def test_bamba_import_export_round_trip(case, tmp_path, capsys):
    hf = transformers.AutoModelForCausalLM.from_config(_config(case), attn_implementation="eager")
    _randomise(hf, seed=len(case))
    src = tmp_path / "hf"
    hf.save_pretrained(src)
    spec, state, ours, ckpt = _import(tmp_path, src, capsys=capsys)

    mamba = [i for i, t in enumerate(hf.config.layers_block_type) if t == "linear_attention"]
    assert [i for i, b in enumerate(spec.model.blocks()) if b.token_mixer.kind == "mamba2"] == mamba
    model = canonical_dict(spec)["model"]
    assert model["ffn"]["kind"] == "glu" and model["ffn"]["activation"] == "silu"
    if case == "mamba_only":
        assert "attention" not in model and model["mixer"]["kind"] == "mamba2"
    else:
        assert model["attention"]["positional"]["partial"] == hf.config.rope_parameters["partial_rotary_factor"]
    assert _numel(ours) == _numel(hf)
    idx = torch.randint(0, V, (2, C), generator=torch.Generator().manual_seed(1))
    want = _hf_logits(hf, idx)
    assert want.abs().max() > 0.1
    torch.testing.assert_close(ours.eval()(idx), want, atol=ATOL, rtol=0)

    out = tmp_path / "exported"
    assert main(["export-hf", str(ckpt), "-o", str(out)]) == 0, capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["model_type"] == "bamba"
    back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    assert back.config.layers_block_type == hf.config.layers_block_type
    assert back.config.rope_parameters["partial_rotary_factor"] == hf.config.rope_parameters["partial_rotary_factor"]
    torch.testing.assert_close(_hf_logits(back, idx), want, atol=ATOL, rtol=0)

    spec2, state2, _, _ = _import(tmp_path, out, name="again", capsys=capsys)
    assert canonical_dict(spec2)["model"] == canonical_dict(spec)["model"]
    assert all(torch.equal(state2["model"][k], v) for k, v in state["model"].items())


def test_bamba_greedy_generation_equals_transformers(tmp_path, capsys):
    """Greedy decoding through the conv and SSM states and the KV cache, against transformers' cached generation."""
    hf = transformers.AutoModelForCausalLM.from_config(_config("hybrid"), attn_implementation="eager")
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


# config.json edits archspec has no part for, each refused by the key that asks for it
REFUSED = {
    "hidden_act": ("gelu", "hidden_act"),  # the Mamba-2 conv's activation (the SwiGLU's too): archspec's is silu
    "time_step_limit": ([0.0, 0.5], "time_step_limit"),  # a clamped dt
    "partial_rotary_factor": (0.25, "partial_rotary_factor"),  # top level only: transformers ignores it (0.5)
    "rope_parameters": ({"rope_type": "default", "rope_theta": 1e4, "mrope_section": [1]}, "rope_parameters"),
    "attn_layer_indices": ([5], "attn_layer_indices"),  # past the last layer
    "mamba_n_heads": (6, "mamba_n_heads"),  # 6 heads of mamba_d_head 8 are not mamba_expand · hidden_size
}


@pytest.mark.parametrize("key", list(REFUSED))
def test_a_bamba_switch_archspec_lacks_is_refused_by_its_key(key, tmp_path, capsys):
    hf = transformers.AutoModelForCausalLM.from_config(_config("hybrid"))
    hf.save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    data = json.loads(path.read_text())
    value, named = REFUSED[key]
    if key == "partial_rotary_factor":
        data["rope_parameters"].pop("partial_rotary_factor")
    data[key] = value
    path.write_text(json.dumps(data))
    capsys.readouterr()  # the save's progress bar
    assert main(["import-hf", str(tmp_path / "hf"), "-o", str(tmp_path / "s.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and "Traceback" not in err and len(err.splitlines()) == 1


def _spec(attention=None, mixer=None, ffn=None, mamba=True):
    from archspec.spec import load_spec_dict

    layers = {"s": {"select": [0], "mixer": {"kind": "mamba2", "head_dim": 8, "d_state": 4, **(mixer or {})}}}
    return load_spec_dict({"name": "g", "model": {
        "vocab_size": V, "context_length": C, "d_model": 32, "n_layers": 2, "norm": {"kind": "rmsnorm", "eps": 1e-5},
        "attention": {"n_heads": 4, "positional": {"kind": "rope"}, **(attention or {})},
        "ffn": {"kind": "glu", "hidden_dim": 48, **(ffn or {})}, "layers": layers if mamba else {}}})


# spec fields bamba cannot say, each refused on export by the field's path
UNSAYABLE = {
    "geglu": (dict(ffn={"activation": "gelu"}), r"model\.ffn\.activation"),  # hidden_act drives the Mamba-2 conv too
    "mixer_eps": (dict(mixer={"norm_eps": 1e-6}), r"model\.layers\.s\.mixer\.norm_eps"),  # one rms_norm_eps
    "head_dim": (dict(attention={"head_dim": 16}), r"model\.attention\.head_dim"),  # hidden_size // heads wide
    "interleaved": (dict(attention={"positional": {"kind": "rope", "layout": "interleaved"}}),
                    r"model\.attention\.positional\.layout"),
}


@pytest.mark.parametrize("case", list(UNSAYABLE))
def test_a_spec_field_bamba_cannot_say_is_refused_on_export_by_its_path(case):
    from archspec.hf.convert import _config_as
    from archspec.hf.types import TYPES
    from archspec.kinds.hf import HFUnsupported

    fields, path = UNSAYABLE[case]
    assert _config_as(_spec(), TYPES["bamba"])["attn_layer_indices"] == [1]  # the same spec without it is written
    with pytest.raises(HFUnsupported, match=path):
        _config_as(_spec(**fields), TYPES["bamba"])


def test_geglu_is_written_as_bamba_when_no_layer_is_mamba2():
    from archspec.hf.convert import _config_as
    from archspec.hf.types import TYPES

    out = _config_as(_spec(ffn={"activation": "gelu"}, mamba=False), TYPES["bamba"])
    assert out["attn_layer_indices"] == [0, 1] and out["hidden_act"] != "silu"


def test_a_mamba2_model_whose_mixer_eps_differs_cannot_be_written_as_mamba2():
    from archspec.hf.convert import _config_as
    from archspec.hf.types import TYPES
    from archspec.kinds.hf import HFUnsupported
    from archspec.spec import load_spec_dict

    def spec(eps):
        return load_spec_dict({"name": "m", "model": {
            "vocab_size": V, "context_length": C, "d_model": 32, "n_layers": 2, "norm": {"kind": "rmsnorm", "eps": 1e-5},
            "ffn": {"kind": "none"}, "mixer": {"kind": "mamba2", "head_dim": 8, "d_state": 4, "norm_eps": eps}}})

    assert _config_as(spec(1e-5), TYPES["mamba2"])["layer_norm_epsilon"] == 1e-5
    with pytest.raises(HFUnsupported, match=r"model\.mixer\.norm_eps"):
        _config_as(spec(1e-6), TYPES["mamba2"])


def test_the_hybrid_preset_is_written_as_bamba_and_computes_the_same(tmp_path):
    """specs/mamba2-hybrid-like-tiny (Mamba-2 in layers 0-2, GQA with full rotary in layer 3, a SwiGLU everywhere) is
    Bamba's shape: export picks bamba, and transformers, given the config and weights, computes the same logits (a
    full rotary fraction: transformers' own default of 0.5 would change them)."""
    from pathlib import Path

    from archspec.codegen import generate
    from archspec.hf.convert import config_from_spec, state_to_hf
    from archspec.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parent.parent / "specs" / "mamba2-hybrid-like-tiny.yaml")
    hf_type, config = config_from_spec(spec)
    assert hf_type.model_type == "bamba" and config["attn_layer_indices"] == [3]
    assert config["rope_parameters"]["partial_rotary_factor"] == 1.0
    ours = generate(spec, write=False).Model()
    _randomise(ours, seed=11)
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(tmp_path),
                                                       attn_implementation="eager")
    state = state_to_hf(spec.model, hf_type, ours.state_dict())
    assert set(state) == {k for k, _ in hf.named_parameters()}
    hf.load_state_dict(state, strict=False)
    idx = torch.randint(0, spec.model.vocab_size, (2, C), generator=torch.Generator().manual_seed(2))
    want = _hf_logits(hf, idx)
    assert want.abs().max() > 0.1
    torch.testing.assert_close(ours.eval()(idx), want, atol=ATOL, rtol=0)


def test_a_nonzero_z_loss_coefficient_is_said_on_import_not_dropped_silently(tmp_path, capsys):
    hf = transformers.AutoModelForCausalLM.from_config(_config("mamba_only"))
    hf.save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    data = json.loads(path.read_text())
    for value, said in ((0.0, False), (1e-4, True)):
        data["z_loss_coefficient"] = value
        path.write_text(json.dumps(data))
        capsys.readouterr()
        assert main(["import-hf", str(tmp_path / "hf"), "-o", str(tmp_path / f"s{value}.yaml")]) == 0
        err = capsys.readouterr().err
        assert ("z_loss_coefficient: 0.0001 weighs a term" in err) == said, err
