"""Flamingo's media input (issue 46): gated cross-attention layers (tanh gates at 0 leave the language model as it
was), the Perceiver resampler, which media item a token sees, cached generation with the media's keys and values
made once, the accounting (numel, FlopCounterMode, the decoding state's bytes) and the hashes of text-only specs."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from archspec.accounting import account, kv_cache_bytes
from archspec.codegen import generate
from archspec.kinds.mixer.cross_attention import GatedCrossAttentionSpec
from archspec.kinds import MixerKind
from archspec.spec import SpecError, load_spec, load_spec_dict, model_hash

ROOT = Path(__file__).resolve().parent.parent
MARKER = 60
LM = {"vocab_size": 61, "context_length": 32, "d_model": 32, "n_layers": 4,
      "attention": {"n_heads": 4, "n_kv_heads": 2}}
MEDIA = {"width": 24, "tokens": 3, "max_items": 3, "marker_id": MARKER,
         "cross_attention": {"every": 2, "n_heads": 2, "ffn_hidden": 48}}
RESAMPLED = {**MEDIA, "resampler": {"depth": 2, "n_heads": 2, "head_dim": 8, "max_input_tokens": 10}}


def _spec(media: dict | None, **extra):
    return load_spec_dict({"name": "fl", "model": {**LM, **({"media": media} if media else {}), **extra}})


def _model(media: dict | None, seed: int = 0, **extra):
    spec = _spec(media, **extra)
    torch.manual_seed(seed)
    return spec, generate(spec, write=False).Model().eval()


def _trained_looking(model: torch.nn.Module, seed: int = 1, keep_gates: bool = True) -> None:
    """Every weight random at a scale training leaves (not the init's), the tanh gates at 0 unless told."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if keep_gates and name.endswith(("alpha_cross_attn", "alpha_dense")):
                continue
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.ndim > 1 else 1.0) + (1.0 if p.ndim == 1 else 0))


def _ids(T: int = 20, markers: tuple[int, ...] = (3, 11), batch: int = 2, seed: int = 0) -> torch.Tensor:
    idx = torch.randint(0, MARKER, (batch, T), generator=torch.Generator().manual_seed(seed))
    idx[:, list(markers)] = MARKER
    return idx


def _media(items: int = 2, tokens: int = 3, width: int = 24, batch: int = 2, seed: int = 5) -> torch.Tensor:
    return torch.randn(batch, items, tokens, width, generator=torch.Generator().manual_seed(seed))


# ── the gates ────────────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("media", [MEDIA, RESAMPLED], ids=["plain", "resampler"])
def test_closed_gates_leave_the_language_model_unchanged(media):
    """α = 0: the logits equal the same model without the cross-attention layers, with trained-looking weights
    everywhere else and media given; opened gates change them (so the comparison can fail)."""
    _, text_only = _model(None)
    _, flamingo = _model(media)
    _trained_looking(flamingo)
    missing, unexpected = text_only.load_state_dict(
        {k: v for k, v in flamingo.state_dict().items() if not k.startswith(("xattn.", "resampler."))}, strict=True), []
    idx = _ids()
    feats = _media(tokens=10 if "resampler" in media else 3)
    with torch.no_grad():
        assert torch.equal(flamingo(idx, media=feats), text_only(idx))
        assert torch.equal(flamingo(idx), text_only(idx))  # no media: the dense part's gate closes it too
        for layer in flamingo.xattn.values():
            layer.alpha_cross_attn.fill_(0.7)
        opened = flamingo(idx, media=feats)
    assert not torch.allclose(opened, text_only(idx), atol=1e-3)


def test_text_only_specs_keep_their_hash_and_their_keys():
    """model.media is new (Since): a spec without it hashes as before, and its module has no media parameters."""
    for path in sorted((ROOT / "specs").glob("*-tiny.yaml")):
        spec = load_spec(path)
        if spec.model.media is None:
            written = (ROOT / "generated" / f"{spec.name}.py").read_text()
            assert f'SPEC_HASH = "{model_hash(spec)}"' in written, path.name
    assert model_hash(_spec(None)) != model_hash(_spec(MEDIA))
    _, flamingo = _model(MEDIA)
    _, text_only = _model(None)
    extra = set(flamingo.state_dict()) - set(text_only.state_dict())
    assert extra and all(k.startswith("xattn.") for k in extra)
    assert set(text_only.state_dict()) <= set(flamingo.state_dict())


# ── which media a token sees ─────────────────────────────────────────────────────────────────────────────────────


def test_a_token_sees_only_the_item_whose_marker_last_precedes_it():
    _, model = _model(MEDIA)
    _trained_looking(model, keep_gates=False)  # gates open
    idx = _ids(markers=(3, 11))
    feats = _media()
    changed_second = feats.clone()
    changed_second[:, 1] += 1.0
    changed_first = feats.clone()
    changed_first[:, 0] += 1.0
    with torch.no_grad():
        base, second, first = (model(idx, media=m) for m in (feats, changed_second, changed_first))
        text = model(idx)
    # before the first marker: no media at all (the dense part only, as without media)
    assert torch.allclose(base[:, :3], text[:, :3], atol=1e-5)
    # between the markers: item 0 only; from the second marker on: item 1 (and item 0 through the earlier tokens'
    # self-attention, so the first item's change reaches later tokens too, but the second's never earlier ones)
    assert torch.allclose(base[:, :11], second[:, :11], atol=1e-5)
    assert not torch.allclose(base[:, 11:], second[:, 11:], atol=1e-3)
    assert not torch.allclose(base[:, 3:11], first[:, 3:11], atol=1e-3)
    assert torch.allclose(base[:, :3], first[:, :3], atol=1e-5)


def test_markers_beyond_the_items_given_see_nothing():
    _, model = _model(MEDIA)
    _trained_looking(model, keep_gates=False)
    idx = _ids(markers=(3, 11))
    one = _media(items=1)
    with torch.no_grad():
        a = model(idx, media=one)
        b = model(idx, media=torch.cat([one, torch.zeros_like(one)], dim=1))  # a second item of zeros
    # two computations of different lengths (the second item masked out) round differently: 2e-5 measured on logits
    # of magnitude 9; a token that saw the second item would differ by far more (the test above: over 1e-3)
    assert torch.allclose(a[:, :11], b[:, :11], atol=1e-4, rtol=1e-4)


# ── generation ───────────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("media", [MEDIA, RESAMPLED], ids=["plain", "resampler"])
def test_cached_decoding_equals_the_full_forward(media):
    """Prefill and one token at a time, the media's keys and values made once by new_cache, give the full forward's
    logits; a marker met while decoding switches the item seen, as in the full forward."""
    _, model = _model(media)
    _trained_looking(model, keep_gates=False)
    idx = _ids(T=24, markers=(3, 11, 17))
    feats = _media(items=3, tokens=10 if "resampler" in media else 3)
    with torch.no_grad():
        full = model(idx, media=feats)
        cache = model.new_cache(2, 24, media=feats)
        parts = [model(idx[:, :9], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(9, 24)]
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-4)
    with pytest.raises(ValueError, match="new_cache"):
        model(idx[:, :1], cache=model.new_cache(2, 24), media=feats)


def test_generate_and_stream_take_the_media():
    _, model = _model(MEDIA)
    _trained_looking(model, keep_gates=False)
    idx = _ids(T=8, markers=(2,), batch=1)
    feats = _media(items=1, batch=1)
    with torch.no_grad():
        out = model.generate(idx, 6, temperature=0, media=feats)
        seq = idx
        for _ in range(6):  # greedy by full forwards
            seq = torch.cat([seq, model(seq, media=feats)[:, -1].argmax(-1, keepdim=True)], dim=1)
        streamed = torch.cat([idx, *model.stream(idx, 6, temperature=0, media=feats)], dim=1)
        text_only = model.generate(idx, 6, temperature=0)
    assert torch.equal(out, seq) and torch.equal(streamed, seq)
    assert not torch.equal(out, text_only)  # the media changed what was generated


def test_truncate_takes_markers_back():
    _, model = _model(MEDIA)
    _trained_looking(model, keep_gates=False)
    idx = _ids(T=12, markers=(3, 8), batch=1)
    feats = _media(items=2, batch=1)
    with torch.no_grad():
        cache = model.new_cache(1, 16, media=feats, rollback=4)
        model(idx, cache=cache)
        for c in cache:
            c.truncate(6)  # before the second marker
        again = model(idx[:, 6:], cache=cache)
    assert torch.allclose(again, model(idx, media=feats)[:, 6:], atol=1e-4)


# ── accounting ───────────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("media", [MEDIA, RESAMPLED], ids=["plain", "resampler"])
def test_params_are_numel_and_cache_bytes_are_what_new_cache_holds(media):
    spec, model = _model(media)
    acc = account(spec)
    assert acc.total == sum(p.numel() for p in model.parameters())
    assert acc.by_component["cross_attention"] == sum(p.numel() for p in model.xattn.parameters())
    if "resampler" in media:
        assert acc.by_component["resampler"] == sum(p.numel() for p in model.resampler.parameters())
    cache = model.new_cache(1, 32, media=_media(items=1, batch=1, tokens=10 if "resampler" in media else 3))
    assert sum(c.nbytes for c in cache) == kv_cache_bytes(spec.model, 32, "fp32")
    text = kv_cache_bytes(_spec(None).model, 32, "fp32")
    assert kv_cache_bytes(spec.model, 32, "fp32") - text == 2 * 2 * 2 * 16 * 3 * 3 * 4  # layers·(K,V)·inner·S·fp32


@pytest.mark.parametrize("media", [MEDIA, RESAMPLED], ids=["plain", "resampler"])
def test_flops_match_flop_counter_at_the_media_length(media):
    """Forward FLOPs per token, cross-attention at max_items · tokens media tokens and (with a resampler) the items'
    resampling at max_input_tokens features, against FlopCounterMode."""
    spec, model = _model(media)
    T = 32
    idx = _ids(T=T, markers=(0, 9, 20))
    feats = _media(items=3, tokens=10 if "resampler" in media else 3)
    counter = FlopCounterMode(display=False)
    # (with grad: under no_grad, FlopCounterMode's module tracker trips over the latents' expanded view)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH), counter:
        model(idx[:1], media=feats[:1])
    acc = account(spec, T, full_attention=True)
    expected = acc.flops_forward * T
    assert abs(counter.get_total_flops() - expected) <= 0.005 * expected
    assert acc.flops_by_component["cross_attention"] > 0
    # more media tokens per item cost more per text token
    wider = _spec({**media, "tokens": media["tokens"] * 2})
    assert account(wider, T).flops_by_component["cross_attention"] > acc.flops_by_component["cross_attention"]


def test_the_cross_attention_unit_answers_the_mixer_contract():
    unit = _spec(MEDIA).model.media.cross_attention
    assert isinstance(unit, GatedCrossAttentionSpec) and isinstance(unit, MixerKind)
    assert not type(unit).__abstractmethods__


# ── spec rules ───────────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("change, path", [
    ({"marker_id": 61}, "model.media.marker_id"),
    ({"cross_attention": {"every": None, "layers": [0, 7]}}, "model.media.cross_attention.layers"),
    ({"cross_attention": {"every": 2, "layers": [0]}}, "model.media.cross_attention.every"),
    ({"cross_attention": {"n_heads": 5}}, "model.media.cross_attention.n_heads"),
    ({"width": 0}, "model.media.width"),
])
def test_bad_media_specs_name_the_field(change, path):
    with pytest.raises(SpecError) as err:
        _spec({**MEDIA, **change})
    assert any(line.startswith(path) for line in err.value.problems), err.value.problems


def test_chosen_layers():
    spec, model = _model({**MEDIA, "cross_attention": {"every": None, "layers": [1, 3], "n_heads": 2}})
    assert sorted(model.xattn.keys()) == ["1", "3"]
    assert account(spec).total == sum(p.numel() for p in model.parameters())


def test_presets_build():
    for name in ("flamingo-like-tiny", "flamingo-like"):
        spec = load_spec(ROOT / "specs" / f"{name}.yaml")
        assert spec.model.media is not None
    spec = load_spec(ROOT / "specs" / "flamingo-like-tiny.yaml")
    model = generate(spec, write=False).Model().eval()
    assert account(spec).total == sum(p.numel() for p in model.parameters())
    idx = torch.tensor([[spec.model.media.marker_id, 72, 105]])
    with torch.no_grad():
        assert model(idx, media=torch.randn(1, 1, 20, spec.model.media.width)).shape == (1, 3, 320)


# ── archspec sample --media ──────────────────────────────────────────────────────────────────────────────────────


def _write(path, **tensors):
    from archspec.media import write_safetensors

    write_safetensors(path, tensors)
    return str(path)


def test_sample_with_media(tmp_path, capsys):
    from archspec.cli import main

    spec = str(ROOT / "specs" / "flamingo-like-tiny.yaml")
    good = _write(tmp_path / "m.safetensors", media=torch.randn(2, 20, 64))
    assert main(["sample", spec, "--media", good, "--prompt", "<media>a cat <media>a dog", "--max-new-tokens", "4",
                 "--temperature", "0", "-q"]) == 0


@pytest.mark.parametrize("tensors, words", [
    ({"media": torch.randn(1, 20, 32)}, "width 32"),
    ({"media": torch.full((1, 20, 64), float("nan"))}, "NaN"),
    ({"media": torch.randn(5, 20, 64)}, "5 items"),
    ({"media": torch.randn(1, 40, 64)}, "40 tokens per item"),
    ({"media": torch.randn(20, 64)}, "3 dimensions"),
    ({"features": torch.randn(1, 20, 64)}, "no tensor named 'media'"),
    ({"media": torch.randn(2, 20, 64)}, "2 items, and --prompt marks 1"),
    (None, "no such file"),
    (b"not a safetensors file at all", "not a safetensors file"),
], ids=["width", "nan", "too-many-items", "too-many-tokens", "shape", "no-media-tensor", "markers", "missing",
        "garbage"])
def test_bad_media_exits_2_naming_it(tmp_path, capsys, tensors, words):
    from archspec.cli import main

    spec = str(ROOT / "specs" / "flamingo-like-tiny.yaml")
    path = tmp_path / "m.safetensors"
    if isinstance(tensors, dict):
        _write(path, **tensors)
    elif isinstance(tensors, bytes):
        path.write_bytes(tensors)
    code = main(["sample", spec, "--media", str(path), "--prompt", "<media> x", "--max-new-tokens", "2", "-q"])
    err = capsys.readouterr().err
    assert code == 2 and words in err and "m.safetensors" in err and "Traceback" not in err, err


def test_media_for_a_text_only_model_exits_2(tmp_path, capsys):
    from archspec.cli import main

    path = _write(tmp_path / "m.safetensors", media=torch.randn(1, 3, 24))
    code = main(["sample", str(ROOT / "specs" / "llama-like-tiny.yaml"), "--media", path, "--prompt", "<media>",
                 "--max-new-tokens", "2", "-q"])
    assert code == 2 and "takes no media" in capsys.readouterr().err


def test_safetensors_reader_matches_the_library(tmp_path):
    """Our pickle-free reader reads what safetensors writes, and refuses a byte range outside the file."""
    from safetensors.torch import save_file

    from archspec.errors import UserError
    from archspec.media import read_safetensors

    t = {"media": torch.randn(2, 3, 4), "other": torch.randn(5).to(torch.bfloat16)}
    save_file(t, str(tmp_path / "a.safetensors"))
    back = read_safetensors(tmp_path / "a.safetensors")
    assert all(torch.equal(back[k], t[k]) for k in t)
    raw = bytearray((tmp_path / "a.safetensors").read_bytes())
    (tmp_path / "b.safetensors").write_bytes(raw[:-8])  # the last tensor's bytes cut short
    with pytest.raises(UserError, match="byte range"):
        read_safetensors(tmp_path / "b.safetensors")


# ── the media corpus (interleaved media + text) ─────────────────────────────────────────────────────────────────


def _byte_encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def test_media_corpus_reads_example_data(tmp_path):
    """Example data generated here, deterministically (no download): documents with markers and safetensors beside
    them, each item at its marker (the loop's windows of them: tests/test_media_training.py)."""
    from archspec.data.corpus.media import MediaCorpus, write_example

    root = write_example(tmp_path / "a", documents=4, width=64, tokens=16)
    again = write_example(tmp_path / "b", documents=4, width=64, tokens=16)
    source = MediaCorpus(path=str(root)).open()
    assert source.content_hash == MediaCorpus(path=str(again)).open().content_hash  # deterministic
    spec = load_spec(ROOT / "specs" / "flamingo-like-tiny.yaml")
    examples = source.examples(_byte_encode, spec.model)
    assert [media.size(0) for _, media in examples] == [1, 2, 1, 2]
    assert all(ids.count(257) == media.size(0) for ids, media in examples)
    # the media are part of the data hash
    (again / "0000.safetensors").write_bytes((again / "0001.safetensors").read_bytes())
    assert MediaCorpus(path=str(again)).open().content_hash != source.content_hash


def test_media_corpus_refuses_what_does_not_fit(tmp_path):
    from archspec.data.corpus.media import MediaCorpus, write_example
    from archspec.errors import UserError

    root = write_example(tmp_path, documents=2, width=32, tokens=16)
    spec = load_spec(ROOT / "specs" / "flamingo-like-tiny.yaml")
    with pytest.raises(UserError, match="0000.safetensors: width 32"):
        MediaCorpus(path=str(root)).open().examples(_byte_encode, spec.model)
    (root / "0001.safetensors").unlink()
    with pytest.raises(UserError, match="0001.txt: no media beside it"):
        MediaCorpus(path=str(root)).open()


# ── HF's IDEFICS (transformers' open Flamingo) as the reference ─────────────────────────────────────────────────


def _idefics_config(**extra):
    from transformers import IdeficsConfig

    cfg = IdeficsConfig(hidden_size=32, num_attention_heads=4, intermediate_size=48, rms_norm_eps=1e-6,
                        hidden_act="silu", dropout=0.0, qk_layer_norms=False, alpha_type="float",
                        alpha_initializer="zeros",  # ("normal" with alpha_type float fails in transformers 5.25)
                        vision_config={"embed_dim": 24}, **extra)
    cfg._attn_implementation = "eager"
    return cfg


def test_gated_cross_attention_equals_idefics_on_shared_weights():
    """Our GATED XATTN-DENSE layer and transformers' IdeficsGatedCrossAttentionLayer, the same weights (open gates),
    the same media tokens and visibility (IDEFICS' image_attention_mask and cross_attention_gate): equal outputs."""
    from transformers.models.idefics.modeling_idefics import IdeficsGatedCrossAttentionLayer

    from archspec.runtime import media_items

    _, model = _model({**MEDIA, "cross_attention": {"every": 2, "n_heads": 4, "ffn_hidden": 48}},
                      norm={"kind": "rmsnorm", "eps": 1e-6})
    _trained_looking(model, keep_gates=False)
    ours = model.xattn["0"]
    theirs = IdeficsGatedCrossAttentionLayer(_idefics_config(), layer_idx=0).eval()
    missing, unexpected = theirs.load_state_dict(ours.state_dict(), strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)

    idx = _ids(T=20, markers=(3, 11))
    media = _media(items=2, tokens=3, width=24).reshape(2, 6, 24)  # (B, items · tokens, width)
    x = torch.randn(2, 20, 32, generator=torch.Generator().manual_seed(3))
    item = media_items(idx, MARKER, 2)  # (B, T)
    sees = item[:, :, None] == (torch.arange(6) // 3)  # (B, T, S)
    gate = (item >= 0).float()  # IDEFICS: 0 where a token sees no image
    mask = torch.zeros(2, 1, 20, 6).masked_fill(~(sees | (item < 0)[:, :, None])[:, None], torch.finfo(torch.float32).min)
    with torch.no_grad():
        expected = theirs(x, image_hidden_states=media, image_attention_mask=mask, cross_attention_gate=gate)
        got = ours(x, ours.cross_attn.media_kv(media), item)
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()


def test_perceiver_resampler_equals_idefics_on_shared_weights():
    from transformers.models.idefics.perceiver import IdeficsPerceiverResampler

    _, model = _model({**RESAMPLED, "resampler": {"depth": 2, "n_heads": 2, "head_dim": 8, "max_input_tokens": 10}})
    _trained_looking(model)
    theirs = IdeficsPerceiverResampler(_idefics_config(perceiver_config={"qk_layer_norms_perceiver": False}),
                                       embed_dim=24, depth=2, n_heads=2, head_dim=8, n_latents=3).eval()
    theirs.load_state_dict(model.resampler.state_dict(), strict=True)
    feats = torch.randn(4, 10, 24, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.allclose(model.resampler(feats), theirs(feats), atol=1e-5)


# ── media_recall ─────────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("name", ["tp", "pp"])
def test_a_media_model_is_not_split_yet(name):
    with pytest.raises(SpecError) as err:
        load_spec_dict({"name": "x", "model": {**LM, "media": MEDIA}, "train": {"parallel": {name: 2}}})
    assert any(line.startswith(f"train.parallel.{name}") and "model.media" in line for line in err.value.problems)


def test_the_memory_plan_counts_the_cross_attention_layers():
    """Weights through the accounting; activations: each cross-attention layer's own saved bytes (its MixerKind
    saved_bytes), in front of the blocks it sits at."""
    from archspec.memory import plan_memory

    text, media = _spec(None), _spec(MEDIA)
    a, b = plan_memory(text), plan_memory(media)
    unit = media.model.media.cross_attention
    tokens = media.train.batch_size * media.train.seq_len
    per_sequence = sum(media.model.media.saved_bytes_per_sequence(media.model, 4).values())  # media tokens, k, v
    assert b.activations - a.activations == (2 * unit.saved_bytes(media.model, media.train.seq_len, 4, "cpu") * tokens
                                             + per_sequence * media.train.batch_size)
    assert b.weights > a.weights


def test_export_of_a_media_model_is_refused_by_field():
    from archspec.hf.convert import config_from_spec
    from archspec.kinds.hf import HFUnsupported

    # written as IDEFICS (tests/test_hf_idefics.py) where it can be; here its cross-attention has its own heads
    with pytest.raises(HFUnsupported, match=r"^model\.media\.cross_attention\.n_heads: "):
        config_from_spec(_spec(MEDIA))


# ── properties ───────────────────────────────────────────────────────────────────────────────────────────────────

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=24), st.integers(0, 4), st.lists(st.integers(1, 5), max_size=8))
def test_the_item_a_token_sees_is_the_last_marker_at_or_before_it_however_the_text_is_fed(markers, n_items, chunks):
    """media_items (the full forward) and MediaCache.advance (any chunking, as generation feeds it) agree with the
    rule read off directly: the index of the last marker at or before the token, -1 if none or not given."""
    from archspec.runtime import MediaCache, media_items

    idx = torch.tensor([[MARKER if m else 7 for m in markers]])
    expected, seen = [], -1
    for m in markers:
        seen += m
        expected.append(seen if seen < n_items else -1)
    assert media_items(idx, MARKER, n_items).tolist() == [expected]
    cache = MediaCache(1, 1, 4, 1, 1, len(markers))
    cache.n_items = n_items
    got, at = [], 0
    for size in chunks + [len(markers)]:
        if at >= len(markers):
            break
        got += cache.advance(idx[:, at : at + size], MARKER)[0].tolist()
        at += size
    assert got == expected


@settings(max_examples=8, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=5), st.integers(0, 2**16))
def test_cached_decoding_equals_the_full_forward_in_any_chunks(chunks, seed):
    _, model = _model(MEDIA)
    _trained_looking(model, keep_gates=False)
    idx = _ids(T=24, markers=(0, 7, 15), seed=seed % 97)
    feats = _media(items=3, seed=seed)
    with torch.no_grad():
        full = model(idx, media=feats)
        cache = model.new_cache(2, 24, media=feats)
        parts, at = [], 0
        for size in chunks * 24:
            if at >= 24:
                break
            parts.append(model(idx[:, at : at + size], cache=cache))
            at += size
    # float32 rounding of two orders of summation, relative to logits of magnitude ~10 (trained-looking weights): up
    # to 2.3e-4 over seeds, 1e-13 in float64 (checked); a wrong item or position would differ by over 1e-2
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-4, rtol=1e-4)
