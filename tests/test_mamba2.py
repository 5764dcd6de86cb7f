"""Mamba-2 (issue 45): the chunked SSD scan equals the step-by-step recurrence (float64, drawn shapes and chunk sizes),
its memory grows linearly with T; the mixer equals transformers' Mamba2Mixer on the same weights; every figure the
accounting gives (params, FLOPs of the chunked algorithm, state bytes, saved bytes) is checked against the generated
module; cached decoding, greedy generation, state rollback for speculative decoding; a block without an FFN; bad
shapes exit 2 naming the field."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from archspec.accounting import account, kv_cache_bytes
from archspec.cli import main
from archspec.codegen import generate
from archspec.runtime.ssd import SSMCache, chunking, gated_rms_norm, ssd_chunked, ssd_flops, ssd_recurrent
from archspec.spec import SpecError, load_spec_dict, model_hash, model_json
from archspec.testing.assertions import (assert_greedy_generation_is_argmax_of_full_forwards,
                                         assert_rollback_matches_full_forward)

BASE = {"vocab_size": 61, "context_length": 40, "d_model": 32, "n_layers": 3}
SSM = {"kind": "mamba2", "head_dim": 8, "d_state": 4, "n_groups": 2, "chunk_size": 8}
SSM_ONLY = {**BASE, "mixer": SSM, "ffn": {"kind": "none"}}
HYBRID = {**BASE, "n_layers": 4, "attention": {"n_heads": 4, "n_kv_heads": 2},
          "ffn": {"kind": "glu", "hidden_dim": 48},
          "layers": {"ssm": {"select": [0, 1, 2], "mixer": SSM}}}
BIASED = {**SSM_ONLY, "mixer": {**SSM, "bias": True, "conv_bias": False, "expand": 1, "head_dim": 4, "n_groups": 1}}
CASES = {"ssm-only": SSM_ONLY, "hybrid": HYBRID, "biased": BIASED}


def _spec(model: dict, name: str = "ssm", train: dict | None = None):
    return load_spec_dict({"name": name, "model": model, **({"train": train} if train else {})})


def _model(model: dict, seed: int = 0):
    spec = _spec(model)
    torch.manual_seed(seed)
    return spec, generate(spec, write=False).Model().eval()


# ── the scan ─────────────────────────────────────────────────────────────────────────────────────────────────────


def _inputs(b, t, h, p, g, n, seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    dt = torch.nn.functional.softplus(r(b, t, h))  # > 0, as the mixer makes it
    A = -torch.exp(r(h))  # < 0
    return r(b, t, h, p), dt, A, r(b, t, g, n), r(b, t, g, n), r(h), r(b, h, p, n)


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 2), t=st.integers(1, 45), groups=st.integers(1, 3), per_group=st.integers(1, 3),
       p=st.integers(1, 4), n=st.integers(1, 5), chunk=st.integers(1, 17), initial=st.booleans(),
       seed=st.integers(0, 2**16))
def test_the_chunked_scan_equals_the_recurrence_in_float64(b, t, groups, per_group, p, n, chunk, initial, seed):
    """Any shape, any chunk size (longer or shorter than T, T rarely a multiple of it), with or without a carried
    state: the chunked form's outputs and final state are the recurrence's."""
    x, dt, A, B, C, D, s0 = _inputs(b, t, groups * per_group, p, groups, n, seed)
    s0 = s0 if initial else None
    y_ref, s_ref = ssd_recurrent(x, dt, A, B, C, D, s0)
    y, s = ssd_chunked(x, dt, A, B, C, chunk, D, s0)
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(s, s_ref, atol=1e-10, rtol=1e-10)


def test_the_chunked_scan_keeps_memory_linear_in_the_length():
    """What autograd keeps for backward doubles when T doubles (no (T × T) tensor anywhere), and its largest tensor
    is bounded by T · chunk per head, not T²."""

    def kept(t: int) -> tuple[int, int]:
        x, dt, A, B, C, D, _ = _inputs(1, t, 4, 8, 1, 8, 0, torch.float32)
        x.requires_grad_(True)
        sizes: list[int] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda v: sizes.append(v.numel()) or v, lambda v: v):
            ssd_chunked(x, dt, A, B, C, 16, D)[0].sum()
        return sum(sizes), max(sizes)

    (small, small_max), (big, big_max) = kept(256), kept(512)
    assert 1.8 < big / small < 2.2
    assert big_max <= 4 * 512 * 16 and big_max < 512 * 512


def test_the_scan_flops_are_what_flop_counter_counts():
    for t, chunk in ((37, 8), (40, 8), (5, 64), (64, 64)):
        x, dt, A, B, C, D, _ = _inputs(2, t, 6, 4, 3, 5, 1, torch.float32)
        with FlopCounterMode(display=False) as counter:
            ssd_chunked(x, dt, A, B, C, chunk, D)
        assert counter.get_total_flops() == ssd_flops(t, chunk, 6, 4, 5, 3) * t * 2
    assert chunking(5, 64) == (5, 1) and chunking(37, 8) == (8, 5)


def test_the_mixer_is_transformers_mamba2_mixer():
    """The generated Mamba2 module with a Mamba2Mixer's weights (same names) computes the same function, in one
    pass and cached step by step; and the gated norm is Mamba2RMSNormGated (× silu(z) first, then per group)."""
    from transformers import Mamba2Config
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer, Mamba2RMSNormGated

    cfg = Mamba2Config(hidden_size=32, num_heads=8, head_dim=8, state_size=4, n_groups=2, expand=2, conv_kernel=4,
                       chunk_size=8, num_hidden_layers=1, vocab_size=61, use_conv_bias=True, use_bias=False)
    torch.manual_seed(0)
    theirs = Mamba2Mixer(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.3)
    spec, model = _model(SSM_ONLY)
    ours = model.blocks[0].ssm
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 21, 32)
    with torch.no_grad():
        want = theirs(x)
        torch.testing.assert_close(ours(x), want, atol=1e-5, rtol=1e-5)
        cache = ours.new_cache(2, 21)
        steps = [ours(x[:, :13], cache=cache)] + [ours(x[:, t : t + 1], cache=cache) for t in range(13, 21)]
    torch.testing.assert_close(torch.cat(steps, 1), want, atol=1e-5, rtol=1e-5)
    norm = Mamba2RMSNormGated(16, group_size=4, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_()
    y, z = torch.randn(3, 16), torch.randn(3, 16)
    torch.testing.assert_close(gated_rms_norm(y, z, norm.weight, 4, 1e-5), norm(y, z))


# ── accounting through the mixer contract ────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("case", list(CASES))
def test_params_and_state_bytes_equal_the_generated_module(case):
    spec, model = _model(CASES[case])
    acc = account(spec)
    named = dict(model.named_parameters())
    assert acc.total == sum(p.numel() for p in model.parameters())
    assert acc.by_component["ssm"] == sum(p.numel() for n, p in named.items() if ".ssm." in n)
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        sizes = set()
        for T in (1, 7, spec.model.context_length):
            cache = model.new_cache(2, T, dtype=dtype)
            ssm = [c for c, b in zip(cache, spec.model.blocks()) if b.token_mixer is not b.attention]
            sizes.add(sum(c.nbytes for c in ssm))
            assert sum(c.nbytes for c in cache) == kv_cache_bytes(spec.model, T, name, 2)
        assert len(sizes) == 1  # the Mamba-2 state does not grow with the context
    assert all(b.token_mixer.state_bytes_per_token(spec.model, 2) == 0
               for b in spec.model.blocks() if b.token_mixer is not b.attention)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("T", [40, 19])
def test_forward_flops_of_the_chunked_algorithm_match_flop_counter(case, T):
    spec, model = _model(CASES[case])
    idx = torch.randint(0, spec.model.vocab_size, (1, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH), \
            FlopCounterMode(display=False) as counter:
        model(idx)
    expected = account(spec, seq_len=T, full_attention=True).flops_forward * T
    assert abs(counter.get_total_flops() - expected) <= 1e-6 * expected + 1
    assert account(spec, seq_len=T).flops_by_component["ssm_scan"] > 0


def test_saved_bytes_are_what_autograd_keeps_within_a_margin():
    """The memory plan's per-token figure for the mixer against the tensors autograd saves in its forward (shared
    storages counted once), at a length that pads its last chunk."""
    spec, model = _model(SSM_ONLY)
    mixer, m = model.blocks[0].ssm, spec.model
    x = torch.randn(1, 37, m.d_model, requires_grad=True)
    storages: dict = {}
    with torch.autograd.graph.saved_tensors_hooks(
            lambda v: storages.setdefault(v.untyped_storage().data_ptr(), v.untyped_storage().nbytes()) and v,
            lambda v: v):
        mixer.train()(x).sum()
    measured = sum(storages.values()) / 37
    planned = m.blocks()[0].token_mixer.saved_bytes(m, 37, 4, "cpu")
    assert 0.5 * measured <= planned <= 1.5 * measured, (planned, measured)


def test_pipeline_stages_weigh_mamba2_layers_by_their_own_cost():
    from archspec.accounting import block_breakdown
    from archspec.train.stages import layer_costs

    spec = _spec(HYBRID)
    flops, params, _ = layer_costs(spec, 40)
    ssm, att = spec.model.blocks()[0], spec.model.blocks()[3]
    m = spec.model
    assert flops[0] == round(sum(ssm.token_mixer.mixer_flops(m, 40).values()) + ssm.ffn.flops(m.d_model))
    assert flops[3] != flops[0] and params[0] == block_breakdown(m, 40)[0]["params"]


# ── generation ───────────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("case", list(CASES))
def test_cached_decoding_equals_the_full_forward(case):
    spec, model = _model(CASES[case], seed=1)
    idx = torch.randint(0, spec.model.vocab_size, (2, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, 40, dtype=torch.float32)
        # a prefill longer than a chunk and not a multiple of it, a chunk of 3, then one position at a time
        steps = [model(idx[:, :19], cache=cache), model(idx[:, 19:22], cache=cache)]
        steps += [model(idx[:, t : t + 1], cache=cache) for t in range(22, 30)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert all(c.length == 30 for c in cache)


def test_the_ssm_state_takes_back_rejected_positions():
    # a prefill longer than a chunk and not a multiple of it; four drafts, one accepted
    assert_rollback_matches_full_forward(_model(SSM_ONLY, seed=3)[1], 61, prefill=10, drafts=4, after=5, rtol=1e-5)
    fresh = SSMCache(1, 8, 4, 2, 3, 5, rollback=2)
    assert fresh.nbytes == 8 * (3 + 2) * 4 + 2 * 3 * 5 * 4 * 3  # conv positions, the state and two kept states


def test_greedy_generation_equals_argmax_of_full_forwards():
    assert_greedy_generation_is_argmax_of_full_forwards(_model({**HYBRID, "tie_embeddings": False}, seed=5)[1], 61,
                                                        new_tokens=8)


def test_speculative_decoding_through_ssm_states_is_the_target_greedy(k=3):
    """A Mamba-2/attention target with a Mamba-2 draft: each round takes both models' states back to the tokens
    kept, and the output is token for token the target's greedy output."""
    from archspec.sample import SpeculativeStats, speculative_stream

    _, target = _model({**HYBRID, "tie_embeddings": False}, seed=8)
    _, draft = _model({**SSM_ONLY, "tie_embeddings": False}, seed=9)
    prompt = torch.randint(0, 61, (1, 5), generator=torch.Generator().manual_seed(10))
    stats = SpeculativeStats()
    got = list(speculative_stream(target, draft, prompt, 10, k=k, stats=stats))
    assert got == target.generate(prompt, max_new_tokens=10, temperature=0)[0, 5:].tolist()
    assert stats.drafted > stats.accepted  # drafts were rejected, so states were taken back


def test_archspec_sample_generates_from_a_mamba2_spec(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"name": "s", "model": {**SSM_ONLY, "vocab_size": 320}}))
    assert main(["sample", str(path), "--prompt", "ab", "--max-new-tokens", "4", "--device", "cpu",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out.strip()


# ── the block without an FFN, the spec ──────────────────────────────────────────────────────────────────────────


def test_a_block_without_a_channel_mixer_holds_one_norm_and_no_ffn():
    spec, model = _model(SSM_ONLY)
    src = generate(spec, write=False).source
    assert "class FeedForward" not in src and "self.ffn" not in src and "feed-forward" not in src
    assert sorted(n for n, _ in model.blocks[0].named_children()) == ["resid_drop", "ssm", "ssm_norm"]
    assert account(spec).by_component["norm"] == spec.model.d_model * (3 + 1)  # one per block, the final norm
    assert model_hash(_spec(json.loads(model_json(spec)))) == model_hash(spec)


@pytest.mark.parametrize("model, field", [
    ({**SSM_ONLY, "mixer": {**SSM, "head_dim": 5}}, "model.mixer.head_dim"),
    ({**SSM_ONLY, "mixer": {**SSM, "n_groups": 3}}, "model.mixer.n_groups"),
    ({**SSM_ONLY, "mixer": {**SSM, "d_state": 0}}, "model.mixer.d_state"),
    ({**SSM_ONLY, "mixer": {**SSM, "chunk_size": 0}}, "model.mixer.chunk_size"),
    ({**SSM_ONLY, "mixer": {**SSM, "chunk_size": -4}}, "model.mixer.chunk_size"),
    ({**SSM_ONLY, "mixer": {**SSM, "conv_kernel": 1}}, "model.mixer.conv_kernel"),
    ({**HYBRID, "layers": {"ssm": {"select": [0], "mixer": {**SSM, "head_dim": 7}}}}, "model.layers.ssm.mixer.head_dim"),
    ({**SSM_ONLY, "block": {"norm_placement": "post"}}, "model.ffn.kind"),
], ids=["head_dim", "n_groups", "d_state-0", "chunk-0", "chunk-negative", "conv-1", "group-head_dim", "no-ffn-post"])
def test_bad_shapes_exit_2_naming_the_field(model, field, tmp_path, capsys):
    with pytest.raises(SpecError) as err:
        _spec(model)
    assert any(line.startswith(field) for line in err.value.problems), err.value.problems
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps({"name": "bad", "model": model}))
    assert main(["build", str(path), "--out", str(tmp_path), "--no-record"]) == 2
    err_text = capsys.readouterr().err
    assert field in err_text and "Traceback" not in err_text


def test_tensor_parallelism_is_refused_naming_the_mixer_and_tp():
    with pytest.raises(SpecError) as err:
        _spec({**HYBRID, "vocab_size": 320}, train={"parallel": {"kind": "fsdp", "tp": 2}})
    text = " ".join(err.value.problems)
    assert "model.layers.ssm.mixer" in text and "mamba2" in text and "tp" in text, text
