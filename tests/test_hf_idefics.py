"""HF `idefics` as a whole model (issue 46): transformers' IdeficsForVisionText2Text — a LLaMA-shaped decoder, gated
cross-attention layers every cross_layer_interval layers, a Perceiver resampler — imported with `archspec import-hf`
and exported with `archspec export-hf`, its vision encoder left out (its features are the media input).

A tiny random IDEFICS built here (every parameter redrawn, the gates open), saved with `save_pretrained`, imported:
parameter counts equal transformers' without the vision encoder, logits and greedy generation equal transformers' fed
the same features as image_encoder_embeddings, with IDEFICS' image_attention_mask built from the markers by archspec's
rule (the processor's, tested against transformers' own function). Exported back: transformers loads it, missing only
the vision encoder, with equal logits, and a second import gives the same spec and weights. Config switches archspec
has no part for are refused by key, one line, exit 2 (a Hypothesis property over the switches). No downloads."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from archspec.cli import main
from archspec.spec import canonical_dict, load_spec_dict
from tests.test_hf_interop import _import

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

V, C, D, ATOL = 60, 32, 32, 1e-4
_NO_IDS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
VISION = {"embed_dim": 24, "image_size": 16, "patch_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
          "intermediate_size": 32}  # (16 // 8)² + 1 = 5 features per image
PERCEIVER = {"use_resampler": True, "resampler_n_latents": 3, "resampler_depth": 2, "resampler_n_heads": 2,
             "resampler_head_dim": 8}

CASES = {
    # IDEFICS' shape: the resampler, a cross-attention layer every 2 blocks, two additional tokens (<image> last)
    "resampled": dict(num_hidden_layers=4, cross_layer_interval=2, use_resampler=True, additional_vocab_size=2,
                      perceiver_config=PERCEIVER),
    # no resampler: the text attends to the encoder's 5 features per image, every block; tied embeddings
    "features": dict(num_hidden_layers=2, cross_layer_interval=1, use_resampler=False, additional_vocab_size=0,
                     tie_word_embeddings=True),
    # tied with additional rows: IDEFICS ties lm_head.additional_fc to the additional embedding too
    "tied_additional": dict(num_hidden_layers=4, cross_layer_interval=4, use_resampler=True, additional_vocab_size=3,
                            tie_word_embeddings=True, perceiver_config={**PERCEIVER, "resampler_depth": 1}),
}


def _config(case: str, **extra):
    return transformers.IdeficsConfig(**{
        "vocab_size": V, "hidden_size": D, "intermediate_size": 40, "num_attention_heads": 4,
        "max_position_embeddings": C, "rms_norm_eps": 1e-6, "vision_config": VISION, **_NO_IDS, **CASES[case],
        **extra})


def _hf(case: str, seed: int = 0):
    model = transformers.IdeficsForVisionText2Text(_config(case)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # every weight redrawn, gates open (tanh(α) away from 0), norms around 1
        for name, p in model.named_parameters():
            norm = p.ndim == 1 and name.endswith("weight") and ("norm" in name or ".ln." in name)
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g) if norm else 0.3 * torch.randn(p.shape, generator=g))
    model.tie_weights()
    return model


def _inputs(marker: int, features: int, seed: int = 1):
    """Two rows, 2 items given: row 0 marks both (tokens 0, 1 before any marker see none), row 1 only the first."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, V, (2, C), generator=g)
    idx[:, 2], idx[0, 17] = marker, marker
    return idx, torch.randn(2, 2, features, VISION["embed_dim"], generator=g)


def _hf_logits(model, idx, media, marker):
    from archspec.hf.idefics import hf_inputs

    with torch.no_grad():
        return model(input_ids=idx, image_encoder_embeddings=media, image_attention_mask=hf_inputs(idx, marker, 2),
                     use_cache=False).logits


@pytest.mark.parametrize("case", list(CASES))
def test_idefics_import_export_round_trip(case, tmp_path, capsys):
    hf = _hf(case, seed=len(case))
    hf.save_pretrained(tmp_path / "hf")
    spec, state, ours, ckpt = _import(tmp_path, tmp_path / "hf", capsys=None)
    err = capsys.readouterr().err
    assert err.count("vision encoder") == 1 and "model.vision_model" in err  # said once, not silently

    m, cfg = spec.model, hf.config
    assert m.vocab_size == V + cfg.additional_vocab_size and m.media.marker_id == m.vocab_size - 1
    assert m.media.positions(m) == list(range(0, cfg.num_hidden_layers, cfg.cross_layer_interval))
    assert (m.media.resampler is not None) == cfg.use_resampler
    assert m.media.width == VISION["embed_dim"]
    vision = sum(p.numel() for n, p in hf.named_parameters() if n.startswith("model.vision_model."))
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters()) - vision

    features = 5  # what IDEFICS' vision encoder gives per image here; the resampler makes 3 of them
    idx, media = _inputs(m.media.marker_id, features)
    want = _hf_logits(hf, idx, media, m.media.marker_id)
    got = ours.eval()(idx, media=media)
    assert want.abs().max() > 0.5
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    # the media matter: without them transformers' logits differ (the test would pass for a text-only import else)
    assert (_hf_logits(hf, idx, torch.zeros_like(media), m.media.marker_id) - want).abs().max() > 1e-2
    # no media: transformers with an image_attention_mask of zeros (every token sees none; the dense parts still run)
    with torch.no_grad():
        none = hf(input_ids=idx, image_encoder_embeddings=media, use_cache=False,
                  image_attention_mask=torch.zeros(2, C, 2, dtype=torch.long)).logits
    torch.testing.assert_close(ours(idx), none, atol=ATOL, rtol=0)

    out = tmp_path / "exported"
    assert main(["export-hf", str(ckpt), "-o", str(out)]) == 0, capsys.readouterr().err
    assert "vision encoder is not in the export" in capsys.readouterr().err
    assert json.loads((out / "config.json").read_text())["model_type"] == "idefics"
    back, info = transformers.IdeficsForVisionText2Text.from_pretrained(out, output_loading_info=True)
    assert info["missing_keys"] and all(k.startswith("model.vision_model.") for k in info["missing_keys"])
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    torch.testing.assert_close(_hf_logits(back.eval(), idx, media, m.media.marker_id), want, atol=ATOL, rtol=0)

    spec2, state2, _, _ = _import(tmp_path, out, name="again", capsys=capsys)
    assert canonical_dict(spec2)["model"] == canonical_dict(spec)["model"]
    assert all(torch.equal(state2["model"][k], v) for k, v in state["model"].items())


def test_idefics_greedy_generation_equals_transformers(tmp_path, capsys):
    """Greedy decoding with the media's keys and values made once (MediaCache) against transformers' generate, which
    recomputes the cross-attention from image_encoder_embeddings at every step."""
    from archspec.hf.idefics import hf_inputs

    hf = _hf("resampled", seed=8)
    hf.save_pretrained(tmp_path / "hf")
    spec, _, ours, _ = _import(tmp_path, tmp_path / "hf", capsys=capsys)
    marker = spec.model.media.marker_id
    idx, media = _inputs(marker, 5, seed=3)
    prompt, media = idx[:1, :6], media[:1]  # a marker at 2: the prompt's tail and every new token see item 0
    want = hf.generate(input_ids=prompt, image_encoder_embeddings=media,
                       image_attention_mask=hf_inputs(prompt, marker, 2), max_new_tokens=12, min_new_tokens=12,
                       do_sample=False)
    got = ours.eval().generate(prompt, 12, temperature=0, media=media)
    assert marker not in want[0, 6:].tolist()  # transformers would not switch image on a generated marker (docs)
    assert len(set(want[0, 6:].tolist())) > 3
    assert got.tolist() == want.tolist()


class _Tokenizer:
    """What transformers' packing function asks of a tokenizer: the <image> id and the eos id."""

    def __init__(self, image: int, eos: int):
        self.image, self.eos_token_id = image, eos

    def convert_tokens_to_ids(self, token: str) -> int:
        assert token == "<image>"
        return self.image


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["text", "marker", "eos"]), min_size=1, max_size=20), st.integers(1, 4))
def test_the_image_a_token_sees_is_idefics_processors_without_an_eos_after_an_image(tokens, n_items):
    """IDEFICS' processor (image_attention_mask_for_packed_input_ids, then one-hot over the images given) and
    archspec's rule agree on every text, except after an end-of-document token that follows an image: the processor
    then hides every image until the next marker, archspec does not (docs/flamingo.md, IDEFICS)."""
    from transformers.models.idefics.processing_idefics import (
        image_attention_mask_for_packed_input_ids,
        incremental_to_binary_attention_mask,
    )

    from archspec.hf.idefics import hf_inputs

    marker, eos = 9, 2
    idx = torch.tensor([[{"text": 5, "marker": marker, "eos": eos}[t] for t in tokens]])
    incremental, _ = image_attention_mask_for_packed_input_ids(idx.clone(), _Tokenizer(marker, eos), "pt")
    theirs = incremental_to_binary_attention_mask(incremental, "pt", num_classes=n_items)
    ours = hf_inputs(idx, marker, n_items)
    seen_marker, differs_possible = False, False
    for t in tokens:  # an eos after a marker, followed by a token before the next marker
        if t == "marker":
            seen_marker = True
        elif t == "eos" and seen_marker:
            differs_possible = True
    if not differs_possible:
        assert torch.equal(ours, theirs)
    else:  # where they differ, only the processor hides an image (a row of zeros), never a different one
        diff = (ours != theirs).any(-1)[0]
        assert (theirs[0][diff] == 0).all()


# ── what archspec has no part for: refused by key ───────────────────────────────────────────────────────────────

SWITCHES = {  # config key (dotted for a nested config) → (a value archspec maps, one it refuses)
    "alpha_type": ("float", "vector"),
    "qk_layer_norms": (False, True),
    "hidden_act": ("silu", "gelu"),
    "cross_layer_interval": (2, 3),  # 4 layers: 3 does not divide them (transformers would index past its layers)
    "perceiver_config.qk_layer_norms_perceiver": (False, True),
    "vision_config.image_size": (16, [16, 8]),  # not square
}


def _write(tmp_path, data) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return str(path)


@settings(max_examples=30, deadline=None)
@given(refused=st.sets(st.sampled_from(sorted(SWITCHES))), resampler=st.booleans(), additional=st.integers(0, 3),
       freeze=st.booleans())
def test_idefics_switches_map_or_are_refused_by_key(tmp_path_factory, refused, resampler, additional, freeze):
    """Every switch archspec has a part for maps (resampler on or off, additional vocabulary, the freeze_* flags,
    which only say what trains); each one it has none for is refused: exit 2, one line naming a refused key, nothing
    written. (qk_layer_norms_perceiver counts only with the resampler.)"""
    import contextlib
    import io

    tmp_path = tmp_path_factory.mktemp("switch")
    data = _config("resampled", use_resampler=resampler, additional_vocab_size=additional,
                   freeze_text_layers=freeze, freeze_lm_head=freeze).to_dict()
    for key in refused:
        head, _, tail = key.partition(".")
        if tail:
            data[head][tail] = SWITCHES[key][1]
        else:
            data[head] = SWITCHES[key][1]
    effective = {k for k in refused if k != "perceiver_config.qk_layer_norms_perceiver" or resampler}
    out = tmp_path / "out.yaml"
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = main(["import-hf", _write(tmp_path, data), "-o", str(out)])
    if not effective:
        assert code == 0, stderr.getvalue()
        spec = load_spec_dict({"name": "x", "model": yaml.safe_load(out.read_text())["model"]})
        assert spec.model.vocab_size == V + additional
        assert (spec.model.media.resampler is not None) == resampler
        assert spec.model.media.tokens == (3 if resampler else 5)
        return
    assert code == 2, stderr.getvalue()
    lines = [line for line in stderr.getvalue().strip().splitlines() if not line.startswith("warning:")]
    assert len(lines) == 1, lines
    assert any(k in lines[0] for k in effective), (lines, effective)
    assert not out.exists()


@pytest.mark.parametrize("key, value, said", [
    ("perceiver_config", {**PERCEIVER, "resampler_spin": 2}, "perceiver_config.resampler_spin"),
    ("perceiver_config", {**PERCEIVER, "resampler_depth": 0}, "perceiver_config.resampler_depth"),
    ("vision_config", {**VISION, "embed_dim": "wide"}, "vision_config.embed_dim"),
    ("vision_config", {**VISION, "image_size": 4}, "vision_config.image_size"),
    ("image_token_id", 99, "image_token_id"),
    ("vision_config", "clip", "vision_config"),
    ("perceiver_config", [3], "perceiver_config"),
    ("additional_vocab_size", -1, "additional_vocab_size"),
    ("num_attention_heads", 5, "num_attention_heads: 5: must divide hidden_size"),  # found by review
])
def test_bad_idefics_values_are_refused_by_key(key, value, said, tmp_path, capsys):
    data = _config("resampled").to_dict()
    data[key] = value
    out = tmp_path / "out.yaml"
    assert main(["import-hf", _write(tmp_path, data), "-o", str(out)]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("warning:")]
    assert len(err) == 1 and said in err[0], err
    assert not out.exists()


def test_the_image_token_comes_from_the_tokenizer_beside_the_config(tmp_path, capsys):
    """IDEFICS' config does not say which token is <image>; its tokenizer.json does, and the import reads it there
    (else the vocabulary's last id, said)."""
    data = _config("resampled").to_dict()
    added = [{"id": 60, "content": "<fake_token_around_image>"}, {"id": 61, "content": "<image>"}]
    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": added}))
    data["additional_vocab_size"] = 3  # the last id is 62, not the <image>
    out = tmp_path / "out.yaml"
    assert main(["import-hf", _write(tmp_path, data), "-o", str(out)]) == 0
    assert "marker_id" not in capsys.readouterr().err
    assert yaml.safe_load(out.read_text())["model"]["media"]["marker_id"] == 61


# ── export: what IDEFICS cannot say, by field ───────────────────────────────────────────────────────────────────

LM = {"vocab_size": V, "context_length": C, "d_model": D, "n_layers": 4, "attention": {"n_heads": 4},
      "norm": {"kind": "rmsnorm", "eps": 1e-6}, "ffn": {"kind": "glu", "hidden_dim": 40}}
MEDIA = {"width": 24, "tokens": 3, "marker_id": V - 1,
         "cross_attention": {"every": 2, "n_heads": 4, "ffn_hidden": 40},
         "resampler": {"depth": 1, "n_heads": 2, "head_dim": 8, "max_input_tokens": 5}}


@pytest.mark.parametrize("change, field", [
    ({"media": {**MEDIA, "cross_attention": {"every": None, "layers": [1, 3], "n_heads": 4, "ffn_hidden": 40}}},
     "model.media.cross_attention.layers"),
    ({"media": {**MEDIA, "cross_attention": {"every": 3, "n_heads": 4, "ffn_hidden": 40}}},
     "model.media.cross_attention.every"),
    ({"media": {**MEDIA, "cross_attention": {"every": 2, "n_heads": 2, "ffn_hidden": 40}}},
     "model.media.cross_attention.n_heads"),
    ({"media": {**MEDIA, "cross_attention": {"every": 2, "n_heads": 4, "head_dim": 4, "ffn_hidden": 40}}},
     "model.media.cross_attention.head_dim"),
    ({"media": {**MEDIA, "cross_attention": {"every": 2, "n_heads": 4, "ffn_hidden": 48}}},
     "model.media.cross_attention.ffn_hidden"),
    ({"media": {**MEDIA, "tokens": 4, "resampler": None}}, "model.media.tokens"),
    ({"ffn": {"kind": "glu", "activation": "gelu", "hidden_dim": 40}}, "model.ffn.activation"),
    ({"ffn": {"kind": "mlp", "hidden_dim": 40}}, "model.ffn"),
    ({"attention": {"n_heads": 4, "n_kv_heads": 2}}, "model.attention.n_kv_heads"),
])
def test_export_refuses_what_idefics_cannot_say_by_field(change, field):
    from archspec.hf.convert import config_from_spec
    from archspec.kinds.hf import HFUnsupported

    spec = load_spec_dict({"name": "x", "model": {**LM, "media": MEDIA, **change}})
    with pytest.raises(HFUnsupported) as err:
        config_from_spec(spec)
    assert str(err.value).startswith(field + ":"), str(err.value)


def test_export_writes_blocks_0_n_2n_given_as_a_list():
    from archspec.hf.convert import config_from_spec

    for every in (4, 9):  # one layer, at block 0: IDEFICS' interval is the number of layers
        one = load_spec_dict({"name": "x", "model": {**LM, "media": {
            **MEDIA, "cross_attention": {"every": every, "n_heads": 4, "ffn_hidden": 40}}}})
        assert config_from_spec(one)[1]["cross_layer_interval"] == 4
    spec = load_spec_dict({"name": "x", "model": {**LM, "media": {
        **MEDIA, "cross_attention": {"every": None, "layers": [0, 2], "n_heads": 4, "ffn_hidden": 40}}}})
    hf, config = config_from_spec(spec)
    assert hf.model_type == "idefics" and config["cross_layer_interval"] == 2
    assert config["image_token_id"] == V - 1 and config["use_resampler"] is True
    text = load_spec_dict({"name": "t", "model": LM})
    assert config_from_spec(text)[0].model_type == "llama"  # a text-only model is never written as idefics
