"""HF directories as an adversary (or a released file) writes them (issue 42): every number of a config.json bounded
before anything is sized by it, with the spec's own bounds; weights that are not finite floats refused; echoed input
cut; transformers' activation aliases honoured (Gemma's `gelu` is the tanh form, checked on logits); training-only
keys of released configs imported with a note; unmapped fields refused on one line; `import-hf --help` lists every
type the registry of types holds."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archspec.cli import main

LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 16,
         "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False}
NUMERIC = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "intermediate_size",
           "vocab_size", "max_position_embeddings", "head_dim", "rms_norm_eps", "rope_theta", "sliding_window")
HOSTILE_NUMBERS = st.one_of(
    st.sampled_from([10**9, 10**18, 2**63, -1, -(10**9), 0, 1e9, 1e300, -0.0, float("nan"), float("inf"),
                     -float("inf"), 2.5, True, "12", None, [3], {"a": 1}]),
    st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True))


def _run_import(tmp_path, data, *extra) -> tuple[int, str]:
    src = tmp_path / "cfg"
    src.mkdir(exist_ok=True)
    (src / "config.json").write_text(json.dumps(data))
    out = tmp_path / "out.yaml"
    out.unlink(missing_ok=True)
    return main(["import-hf", str(src), "-o", str(out), *extra]), out


@given(key=st.sampled_from(NUMERIC), value=HOSTILE_NUMBERS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_every_number_of_a_config_is_bounded_before_anything_is_sized_by_it(tmp_path, capsys, key, value):
    """Any value in any numeric field: a spec (exit 0) or one line naming the field (exit 2); never a traceback, an
    allocation the size of the value (1e9 layers), or a spec beyond the spec's bounds."""
    code, out = _run_import(tmp_path, {**LLAMA, key: value})
    err = capsys.readouterr().err
    assert code in (0, 2), err
    if code == 2:
        lines = [line for line in err.strip().splitlines() if not line.startswith(("note:", "warning:"))]
        assert len(lines) == 1 and "Traceback" not in err and len(lines[0]) < 2100, err
        assert not out.exists()


@pytest.mark.parametrize("key, value, words", [
    ("num_hidden_layers", 10**9, "num_hidden_layers: 1000000000 is out of range"),
    ("num_hidden_layers", -1, "num_hidden_layers: -1 is out of range"),
    ("num_attention_heads", 0, "num_attention_heads: 0 is out of range"),
    ("num_hidden_layers", 1e9, "num_hidden_layers: expected int"),
    ("rms_norm_eps", float("nan"), "rms_norm_eps: nan: expected a finite number"),
])
def test_the_issues_configs_end_with_one_line_naming_the_field(tmp_path, capsys, key, value, words):
    code, _ = _run_import(tmp_path, {**LLAMA, key: value})
    err = capsys.readouterr().err.strip()
    assert code == 2 and words in err and len(err.splitlines()) == 1, err


def test_an_unmapped_key_of_ten_megabytes_is_refused_on_one_short_line(tmp_path, capsys):
    code, _ = _run_import(tmp_path, {**LLAMA, "k" * 10_000_000: "v" * 1000, "other_unmapped": 1})
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and len(err) < 2100 and "2 fields archspec does not map" in err


def _exported_llama(tmp_path):
    """A tiny LLaMA model directory written by export-hf (config.json + model.safetensors)."""
    from archspec.codegen import generate
    from archspec.spec import canonical_dict, load_spec_dict, model_hash
    from archspec.train.checkpoint import save_weights

    spec = load_spec_dict({"name": "x", "model": {"vocab_size": 64, "context_length": 16, "d_model": 32,
                                                  "n_layers": 1, "attention": {"n_heads": 4}}})
    save_weights(tmp_path / "x.pt", canonical_dict(spec), model_hash(spec),
                 generate(spec, write=False).Model().state_dict())
    assert main(["export-hf", str(tmp_path / "x.pt"), "-o", str(tmp_path / "hf")]) == 0
    return tmp_path / "hf"


@pytest.mark.parametrize("tamper", ["nan", "inf", "int32", "int8", "bool"])
def test_weights_that_are_not_finite_floats_are_refused(tmp_path, capsys, tamper):
    from safetensors.torch import load_file, save_file

    src = _exported_llama(tmp_path)
    tensors = load_file(str(src / "model.safetensors"))
    name = next(k for k in tensors if k.endswith("q_proj.weight"))
    t = tensors[name]
    if tamper in ("nan", "inf"):
        t = t.clone()
        t[0, 0] = float(tamper)
    else:
        t = t.to(getattr(torch, tamper))
    tensors[name] = t
    save_file(tensors, str(src / "model.safetensors"))
    capsys.readouterr()
    code = main(["import-hf", str(src), "-o", str(tmp_path / "s.yaml"), "--checkpoint", str(tmp_path / "w.pt")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and name in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "w.pt").exists() and not (tmp_path / "s.yaml").exists()


def test_gemmas_gelu_is_the_tanh_form_as_in_transformers_on_logits(tmp_path, capsys):
    """Released Gemma files say `hidden_act: gelu`; transformers' GemmaConfig runs gelu_pytorch_tanh for it. The
    import reads it so (with a note), and the logits equal transformers' (exact GELU would differ by ~1e-3)."""
    from tests.test_hf_interop import _hf_dir, _hf_logits, _import, _logits

    hf, src = _hf_dir(tmp_path, "gemma", seed=3)
    config = json.loads((src / "config.json").read_text())
    config.update(hidden_act="gelu")
    config.pop("hidden_activation", None)
    (src / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    spec, _, model, _ = _import(tmp_path, src)
    assert spec.model.ffn.activation == "gelu_tanh"
    idx = torch.randint(0, spec.model.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    assert torch.allclose(_logits(model, idx), _hf_logits(hf, idx), atol=2e-5)


def test_every_act2fn_name_archspec_reads_computes_what_transformers_computes():
    from transformers.activations import ACT2FN

    from archspec.kinds.ffn.activations import FROM_HF

    x = torch.linspace(-6, 6, 2001, dtype=torch.float64)
    ours = {"relu": torch.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
            "sigmoid": torch.sigmoid, "gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh")}
    for hf_name, name in FROM_HF.items():
        assert torch.allclose(ACT2FN[hf_name](x), ours[name](x), atol=1e-9), hf_name


def test_exact_gelu_is_not_exported_as_gemma():
    from archspec.hf.types import GEMMA
    from archspec.kinds.hf import HFUnsupported

    with pytest.raises(HFUnsupported, match="tanh"):
        GEMMA.rewrite[1](None, {"hidden_act": "gelu"})


def test_training_only_keys_of_released_configs_import_with_a_note(capsys):
    import warnings

    from archspec.hf import spec_from_config
    from archspec.spec import load_spec_dict
    from tests.test_hf_interop import _V3

    data = {k: v for k, v in _V3.items() if k != "quantization_config"}
    data.update(aux_loss_alpha=0.001, seq_aux=True)  # as deepseek-ai/DeepSeek-V3's config.json has them
    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always")
        load_spec_dict(spec_from_config(data, "DeepSeek-V3/config.json", "v3"))
    said = " ".join(str(n.message) for n in notes)
    assert "aux_loss_alpha, seq_aux: training-only" in said


def test_phi_2s_dropouts_import_with_a_note(tmp_path, capsys):
    phi2 = {"model_type": "phi", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 16,
            "resid_pdrop": 0.1, "embd_pdrop": 0.0, "attention_dropout": 0.0, "partial_rotary_factor": 0.5,
            "hidden_act": "gelu_new", "layer_norm_eps": 1e-5, "qk_layernorm": False, "tie_word_embeddings": False}
    code, out = _run_import(tmp_path, phi2)
    err = capsys.readouterr().err
    assert code == 0 and "dropout rates differ" in err and "model.dropout = 0.1" in err
    from archspec.spec import load_spec

    assert load_spec(out).model.dropout == pytest.approx(0.1)


def test_import_hf_help_lists_every_type_the_registry_holds(capsys):
    from archspec.hf.types import TYPES

    with pytest.raises(SystemExit):
        from archspec.cli.hf import import_hf_cmd

        import_hf_cmd.main(["--help"], prog_name="archspec import-hf")
    text = " ".join(capsys.readouterr().out.split())
    assert all(t in text for t in TYPES) and len(TYPES) >= 20
    from archspec.cli.hf import registered_types

    assert registered_types() == list(TYPES)  # read from types.py's source (no torch for --help): the same list
