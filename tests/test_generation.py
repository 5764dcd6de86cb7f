"""Generation inside the generated module (issue 15): the KV cache, positions at an offset, sampling, generate(),
and speculative decoding (archspec.sample) on top of them.

The central property: running a sequence through the cache in pieces (a prefill, a chunk of several tokens, then one
token at a time) gives the logits of one full forward, in fp32 to a tight tolerance, for every registered kind of
every family (so a kind that lands later is checked without touching this file).
"""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import assume, find, given, settings

from archspec import testing as T
from archspec.accounting import account, kv_cache_bytes
from archspec.codegen import generate, render
from archspec.kinds import families
from archspec.sample import SpeculativeStats, speculative_stream
from archspec.spec import load_spec_dict

VOCAB, CONTEXT, D_MODEL = 61, 24, 32
LAYOUTS = {"MHA": 4, "GQA": 2, "MQA": 1}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Decoding runs many tiny ops: on a shared 2-core machine, two threads spend most of their time waiting for
    each other. One thread makes these tests several times faster; the previous setting is restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _example(strategy) -> dict:
    return find(strategy, lambda _: True)  # the simplest valid fields of that kind


def _spec(attention: dict | None = None, **model):
    body = {"vocab_size": VOCAB, "context_length": CONTEXT, "d_model": D_MODEL, "n_layers": 2,
            "attention": {"n_heads": 4, "n_kv_heads": 2, **(attention or {})}, **model}
    return load_spec_dict({"name": "gen", "model": body})


def _model(spec, gen_dir, seed: int = 0):
    torch.manual_seed(seed)
    return generate(spec, out_dir=gen_dir).Model().eval()


def assert_cached_pieces_match_full_forward(model, vocab: int, length: int, *, seed: int = 0) -> None:
    """Prefill ~1/3 of the sequence, then a chunk of 3 tokens (several queries against a longer cache: the case SDPA's
    top-left is_causal gets wrong), then one token per step; the logits must equal one full forward's."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (2, length), generator=g)
    prefill = max(1, length // 3)
    cuts = [0, prefill, min(length, prefill + 3), *range(min(length, prefill + 3) + 1, length + 1)]
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, length)
        pieces = [model(idx[:, a:b], cache=cache) for a, b in zip(cuts, cuts[1:]) if b > a]
    assert cache[0].length == length
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=2e-5, rtol=1e-5)


# ── prefill + decode == one forward, for every kind ─────────────────────────────────────────────────────────────

_POSITIONAL = sorted(families()["positional"].members)
_SPARSITY = sorted(families()["sparsity"].members)
_FFN = sorted(families()["ffn"].members)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("positional", _POSITIONAL)
def test_cache_matches_full_forward_for_every_positional_kind_and_kv_layout(positional, layout, gen_dir):
    fields = _example(T.positionals(D_MODEL, kinds=[positional]))
    spec = _spec({"n_kv_heads": LAYOUTS[layout], "positional": {"kind": positional, **fields}})
    assert_cached_pieces_match_full_forward(_model(spec, gen_dir), VOCAB, CONTEXT)


@pytest.mark.parametrize("sparsity", _SPARSITY)
def test_cache_matches_full_forward_for_every_attention_pattern(sparsity, gen_dir):
    fields = _example(T.sparsities(CONTEXT, kinds=[sparsity]))
    spec = _spec({"sparsity": {"kind": sparsity, **fields}})
    assert_cached_pieces_match_full_forward(_model(spec, gen_dir), VOCAB, CONTEXT)


@pytest.mark.parametrize("ffn", _FFN)
def test_cache_matches_full_forward_for_every_ffn_kind(ffn, gen_dir):
    # a kind the generic strategies do not draw (`none`: a block without a channel mixer) is tried with its defaults
    try:
        fields = _example(T.ffns(D_MODEL, kinds=[ffn], max_hidden=64))
    except ValueError:  # "no ffn kind among [...] fits": the kind has no strategy of its own
        fields = {}
    spec = _spec(ffn={"kind": ffn, **fields})
    assert_cached_pieces_match_full_forward(_model(spec, gen_dir), VOCAB, CONTEXT)


@settings(max_examples=12, deadline=None)
@given(T.valid_specs(train=False, max_layers=2, min_context=2, max_context=20))
def test_cache_matches_full_forward_on_drawn_specs(gen_dir, spec):
    m = spec.model
    # An FFN with a capacity (tokens dropped per forward call) routes a sequence differently from one token at a
    # time; the promise is for dropless routing, what generation uses.
    assume(all(getattr(b.ffn, "capacity_factor", None) is None for b in m.blocks()))
    assert_cached_pieces_match_full_forward(_model(spec, gen_dir), m.vocab_size, m.context_length)


# ── the cache itself ────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cache_holds_kv_heads_and_its_bytes_equal_the_accounting(layout, gen_dir):
    spec = _spec({"n_kv_heads": LAYOUTS[layout]})
    model = _model(spec, gen_dir)
    cache = model.new_cache(3, 20)
    assert len(cache) == spec.model.n_layers
    assert cache[0].k.shape == (3, LAYOUTS[layout], 20, spec.model.attention.head_dim)
    assert sum(c.nbytes for c in cache) == kv_cache_bytes(spec.model, 20, "fp32", batch_size=3)
    model.to(torch.bfloat16)
    cache = model.new_cache(1, CONTEXT)
    assert cache[0].k.dtype == torch.bfloat16
    assert sum(c.nbytes for c in cache) == kv_cache_bytes(spec.model, CONTEXT, "bf16")
    # MHA pays N_HEADS / N_KV_HEADS times the bytes of its grouped variants
    mha = kv_cache_bytes(_spec({"n_kv_heads": 4}).model, 20, "fp32")
    assert kv_cache_bytes(spec.model, 20, "fp32") * (4 // LAYOUTS[layout]) == mha


def test_positions_past_the_context_are_refused(gen_dir):
    model = _model(_spec(), gen_dir)
    cache = model.new_cache(1, CONTEXT)
    with torch.no_grad():
        model(torch.zeros(1, CONTEXT - 1, dtype=torch.long), cache=cache)
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="exceeds CONTEXT_LENGTH"):
            model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="exceed CONTEXT_LENGTH"):
        model.generate(torch.zeros(1, 20, dtype=torch.long), 5)


def test_a_single_query_against_a_longer_cache_is_not_masked_top_left(gen_dir):
    """The bug the issue names: with is_causal=True, one new query against S cached keys sees only key 0. Here the
    last token's logits must depend on every earlier token."""
    model = _model(_spec({"positional": {"kind": "none"}}), gen_dir)
    idx = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(1))
    changed = idx.clone()
    changed[0, 5] = (idx[0, 5] + 1) % VOCAB
    outs = []
    with torch.no_grad():
        for seq in (idx, changed):
            cache = model.new_cache(1, 10)
            model(seq[:, :9], cache=cache)
            outs.append(model(seq[:, 9:], cache=cache))
    assert (outs[0] - outs[1]).abs().max() > 1e-4


# ── generate(), sampling ────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("positional", ["rope", "learned"])
def test_greedy_generation_with_the_cache_equals_recomputing_every_step(positional, gen_dir):
    model = _model(_spec({"positional": {"kind": positional}}), gen_dir, seed=3)
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(2))
    out = model.generate(prompt, 15, temperature=0)
    seq = prompt
    with torch.no_grad():
        for _ in range(15):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)  # the whole sequence each step
    assert torch.equal(out, seq)


def test_seeded_sampling_is_reproducible_and_the_seed_matters(gen_dir):
    model = _model(_spec(), gen_dir)
    prompt = torch.zeros(1, 3, dtype=torch.long)

    def run(seed, **kw):
        return model.generate(prompt, 18, temperature=1.0, generator=torch.Generator().manual_seed(seed), **kw)

    assert torch.equal(run(7), run(7))
    assert not torch.equal(run(7), run(8))
    assert torch.equal(run(7, top_k=1), model.generate(prompt, 18, temperature=0))  # top-1 is greedy


def test_top_k_and_top_p_keep_the_tokens_they_promise():
    from archspec import runtime as module  # the sampling rule every generated model's stream() uses

    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    assert torch.allclose(module.next_token_probs(logits), torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    assert torch.allclose(module.next_token_probs(logits, top_k=2), torch.tensor([[2 / 3, 1 / 3, 0.0, 0.0]]))
    # nucleus: the smallest set reaching 0.7 is {0.5, 0.25}; reaching 0.5 is {0.5}
    assert torch.allclose(module.next_token_probs(logits, top_p=0.7), torch.tensor([[2 / 3, 1 / 3, 0.0, 0.0]]))
    assert torch.allclose(module.next_token_probs(logits, top_p=0.5), torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    cold = module.next_token_probs(logits, temperature=0.1)
    assert cold[0, 0] > 0.99


def test_generation_stops_at_eos(gen_dir):
    model = _model(_spec(), gen_dir)
    prompt = torch.zeros(1, 3, dtype=torch.long)
    greedy = model.generate(prompt, 10, temperature=0)
    eos = int(greedy[0, 5])  # the third generated token
    first = (greedy[0, 3:] == eos).nonzero()[0].item()
    stopped = model.generate(prompt, 10, temperature=0, eos_id=eos)
    assert torch.equal(stopped, greedy[:, : 3 + first + 1])


COPY_OUT = {  # a sparse model (window and global-local layers: the blockwise kernels) and an MoE (grouped GEMM)
    "sparse": {"vocab_size": 64, "context_length": 32, "d_model": 16, "n_layers": 2, "attention": {
        "n_heads": 2, "n_kv_heads": 1, "sparsity": {"kind": "sliding_window", "window": 4}},
        "layers": {"g": {"select": [1], "attention": {"sparsity": {"kind": "global_local", "window": 4,
                                                                       "n_global": 2}}}}},
    "moe": {"vocab_size": 64, "context_length": 32, "d_model": 16, "n_layers": 2, "attention": {"n_heads": 2},
            "ffn": {"kind": "moe", "n_experts": 4, "top_k": 2, "expert": {"kind": "glu", "hidden_dim": 16}}},
}


@pytest.mark.parametrize("case", sorted(COPY_OUT))
def test_a_copied_out_model_runs_with_only_the_runtime_beside_it(case, tmp_path):
    """What the README says a copied-out model needs: its file, plus archspec/__init__.py and archspec/runtime/ (torch
    and the standard library otherwise). In an empty directory, with nothing else of archspec importable."""
    import shutil

    import archspec

    spec = load_spec_dict({"name": f"copy-{case}", "model": COPY_OUT[case]})
    (tmp_path / "mymodel.py").write_text(render(spec), encoding="utf-8")
    package = Path(archspec.__file__).parent
    (tmp_path / "archspec").mkdir()
    shutil.copy(package / "__init__.py", tmp_path / "archspec" / "__init__.py")
    shutil.copytree(package / "runtime", tmp_path / "archspec" / "runtime",
                    ignore=shutil.ignore_patterns("__pycache__"))
    code = textwrap.dedent("""
        import sys, torch
        import mymodel
        import archspec.runtime
        assert archspec.runtime.__file__.startswith(sys.argv[1]), archspec.runtime.__file__
        torch.manual_seed(0)
        m = mymodel.Model()
        idx = torch.randint(0, 64, (2, 24))
        logits, loss = m(idx, idx)
        loss.backward()  # trains: the kernels' backward is there too
        out = m.eval().generate(idx[:1, :4], 8, temperature=0)
        assert out.shape == (1, 12), out.shape
        others = sorted(n for n in sys.modules if n.startswith("archspec") and n != "archspec"
                        and not n.startswith("archspec.runtime"))
        assert not others, others
        print("ok", sum(c.nbytes for c in m.new_cache(1, 12)))
    """)
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ok", str(kv_cache_bytes(spec.model, 12, "fp32"))]


# ── speculative decoding ────────────────────────────────────────────────────────────────────────────────────────


def _target_and_draft(gen_dir):
    target = _model(_spec({"n_kv_heads": 2}, n_layers=3), gen_dir, seed=11)
    draft_spec = load_spec_dict({"name": "draft", "model": {
        "vocab_size": VOCAB, "context_length": CONTEXT, "d_model": 16, "n_layers": 1,
        "attention": {"n_heads": 2, "n_kv_heads": 1}}})
    return target, _model(draft_spec, gen_dir, seed=12)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_speculative_greedy_is_token_for_token_the_target_greedy(k, gen_dir):
    target, draft = _target_and_draft(gen_dir)
    prompt = torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(5))
    alone = target.generate(prompt, 18, temperature=0)[0, 4:].tolist()
    stats = SpeculativeStats()
    fast = list(speculative_stream(target, draft, prompt, 18, k=k, temperature=0, stats=stats))
    assert fast == alone
    assert stats.target_forwards < 18 or stats.accepted == 0  # rounds happened, each adding >= 1 token
    assert stats.target_forwards == len(stats.rounds) and sum(stats.rounds) == stats.accepted


def test_speculative_with_the_target_as_its_own_draft_accepts_everything(gen_dir):
    target, _ = _target_and_draft(gen_dir)
    prompt = torch.zeros(1, 2, dtype=torch.long)
    stats = SpeculativeStats()
    out = list(speculative_stream(target, target, prompt, 20, k=4, temperature=0, stats=stats))
    assert out == target.generate(prompt, 20, temperature=0)[0, 2:].tolist()
    assert stats.acceptance_rate == 1.0
    assert stats.target_forwards == 4  # 20 tokens = 4 rounds of 4 drafted + 1 of the target's own


def test_speculative_sampling_keeps_the_target_distribution(gen_dir):
    """Sampled speculative decoding must emit tokens distributed as the target's, whatever the draft proposes:
    the first emitted token over many seeds against the target's own next-token distribution."""
    vocab = 6
    spec = lambda name, d, seed: _model(load_spec_dict({"name": name, "model": {  # noqa: E731
        "vocab_size": vocab, "context_length": 8, "d_model": d, "n_layers": 1, "tie_embeddings": False,
        "attention": {"n_heads": 2}}}), gen_dir, seed=seed)
    target, draft = spec("t6", 16, 1), spec("d6", 8, 2)
    with torch.no_grad():  # make both distributions far from uniform and from each other
        target.lm_head.weight.mul_(20)
        draft.lm_head.weight.mul_(20)
    prompt = torch.tensor([[1, 2]])
    from archspec.runtime import next_token_probs

    with torch.no_grad():
        p = next_token_probs(target(prompt)[:, -1])[0]
        q = next_token_probs(draft(prompt)[:, -1])[0]
    assert (p - q).abs().sum() / 2 > 0.2  # the draft is a poor guess: the test would catch a biased acceptance
    n = 1000
    counts = torch.zeros(vocab)
    g = torch.Generator().manual_seed(0)
    for _ in range(n):
        first = next(speculative_stream(target, draft, prompt, 2, k=1, temperature=1.0, generator=g))
        counts[first] += 1
    tv = (counts / n - p).abs().sum().item() / 2
    assert tv < 0.08, (counts / n, p)  # a draft-biased rule would be ~0.25 off


# ── rolling buffers: a window layer caches what its pattern can still see ───────────────────────────────────────

# Patterns with a bounded cache, each with the positions it keeps (the accounting's `cached_positions`).
ROLLING = {
    "sliding_window": ({"kind": "sliding_window", "window": 5}, 5),
    "global_local": ({"kind": "global_local", "window": 4, "n_global": 2}, 2 + 4),
    "block_sparse": ({"kind": "block_sparse", "block_size": 3, "n_blocks_back": 1, "global_first_block": True},
                     3 + 2 * 3),
    "block_sparse_local": ({"kind": "block_sparse", "block_size": 3, "n_blocks_back": 1, "global_first_block": False},
                           2 * 3),
}


def _mixed_spec(sparsity: dict, *, positional: str = "rope", every_layer: bool = False, context: int = CONTEXT):
    """Three layers: with `every_layer`, all of them use `sparsity`; else layers 0 and 2 do and layer 1 is dense (a
    per-layer group), so a model's cache mixes ring buffers and full caches."""
    attention = {"n_heads": 4, "n_kv_heads": 2, "positional": {"kind": positional}}
    model = {"vocab_size": VOCAB, "context_length": context, "d_model": D_MODEL, "n_layers": 3,
             "tie_embeddings": False}
    if every_layer:
        attention["sparsity"] = sparsity
    else:
        model["layers"] = {"windowed": {"select": [0, 2], "attention": {"sparsity": sparsity}}}
    return load_spec_dict({"name": "rolling", "model": {**model, "attention": attention}})


def _lively(model):
    """A random untied head scaled up: at init, greedy decoding soon repeats one token (every later step then agrees
    with any draft and with any cache bug that keeps the argmax); these logits keep changing with the context."""
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(0))
    return model


def _pieces(model, idx, prefill: int, cache) -> torch.Tensor:
    """Logits of idx fed through `cache`: `prefill` tokens, then 3 at once, then one at a time."""
    length = idx.size(1)
    cuts = sorted({0, prefill, min(length, prefill + 3), *range(min(length, prefill + 3), length + 1)})
    with torch.no_grad():
        return torch.cat([model(idx[:, a:b], cache=cache) for a, b in zip(cuts, cuts[1:])], dim=1)


@pytest.mark.parametrize("prefill", [2, 11], ids=["prompt-shorter-than-window", "prompt-longer-than-window"])
@pytest.mark.parametrize("pattern", ROLLING)
def test_rolling_cache_holds_the_window_and_gives_the_full_forward_logits(pattern, prefill, gen_dir):
    sparsity, kept = ROLLING[pattern]
    spec = _mixed_spec(sparsity)
    model = _model(spec, gen_dir)
    idx = torch.randint(0, VOCAB, (2, CONTEXT), generator=torch.Generator().manual_seed(4))
    cache = model.new_cache(2, CONTEXT)
    assert [c.k.size(2) for c in cache] == [kept, CONTEXT, kept]  # ring buffers around the dense layer's full cache
    assert [block.attn.new_cache(1, 4).k.size(2) for block in model.blocks] == [min(kept, 4), 4, min(kept, 4)]
    # The bytes are the accounting's, per layer: at context_length (build --json) and at any length.
    assert sum(c.nbytes for c in cache) == kv_cache_bytes(spec.model, CONTEXT, "fp32", batch_size=2)
    assert sum(c.nbytes for c in model.new_cache(1)) == account(spec, kv_dtype="fp32").kv_cache_bytes_per_sequence
    with torch.no_grad():
        full = model(idx)
    rolled = _pieces(model, idx, prefill, cache)
    # The ring buffers wrapped (the window's oldest slots were overwritten), yet the logits are the full forward's,
    # and those of a cache that never drops a position (rollback as long as the sequence: the full-cache path).
    assert cache[0].length == CONTEXT and cache[0].oldest > cache[0].n_global
    torch.testing.assert_close(rolled, full, atol=2e-5, rtol=1e-5)
    never_drops = model.new_cache(2, CONTEXT, rollback=CONTEXT)
    assert never_drops[0].k.size(2) == CONTEXT
    torch.testing.assert_close(rolled, _pieces(model, idx, prefill, never_drops), atol=2e-5, rtol=1e-5)


def test_rolling_cache_takes_back_what_its_rollback_allows_and_refuses_more(gen_dir):
    spec = _mixed_spec(ROLLING["sliding_window"][0], every_layer=True)
    model = _model(spec, gen_dir)
    idx = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(1, 20, rollback=3)
        assert cache[0].k.size(2) == 5 + 3
        model(idx[:, :12], cache=cache)
        model(torch.randint(0, VOCAB, (1, 4)), cache=cache)  # 4 wrong tokens at positions 12..15
        for c in cache:
            c.truncate(12)  # take all 4 back: 4 <= rollback + 1
        torch.testing.assert_close(model(idx[:, 12:], cache=cache), full[:, 12:], atol=2e-5, rtol=1e-5)
        plain = model.new_cache(1, 20)
        model(idx[:, :12], cache=plain)
        model(idx[:, 12:15], cache=plain)
        with pytest.raises(ValueError, match="cannot roll back to position 12"):
            plain[0].truncate(12)


@pytest.mark.parametrize("positional", ["rope", "none"])
def test_a_windowed_model_generates_past_its_context_as_a_full_forward_would(positional, gen_dir):
    context = 12
    spec = _mixed_spec({"kind": "sliding_window", "window": 4}, positional=positional, every_layer=True,
                       context=context)
    model = _lively(_model(spec, gen_dir, seed=2))
    prompt = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(3))
    out = model.generate(prompt, 30, temperature=0)  # 37 positions, three times the context
    assert out.shape == (2, 37) and len(set(out[0, 12:].tolist())) > 3  # not one token repeated
    seq = prompt
    with torch.no_grad():
        for _ in range(30):  # the whole sequence each step, no cache: positions past the table computed
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq)
    cache = model.new_cache(1, 37)
    assert all(c.k.size(2) == 4 for c in cache)  # the window, however long the sequence


@pytest.mark.parametrize("why, spec", [
    ("layer 1 has dense causal attention", lambda: _mixed_spec({"kind": "sliding_window", "window": 4},
                                                               context=12)),
    ("absolute", lambda: _mixed_spec({"kind": "sliding_window", "window": 4}, positional="learned",
                                     every_layer=True, context=12)),
    ("global", lambda: _mixed_spec({"kind": "global_local", "window": 4, "n_global": 1}, every_layer=True,
                                   context=12)),
])
def test_a_model_that_cannot_run_past_its_context_refuses_with_the_reason(why, spec, gen_dir):
    from archspec.errors import UserError
    from archspec.kinds.attention import past_context_refusal
    from archspec.sample import check_length

    spec = spec()
    assert why in (past_context_refusal(spec.model) or "")
    model = _model(spec, gen_dir)
    with pytest.raises(ValueError, match="exceed CONTEXT_LENGTH 12"):
        model.generate(torch.zeros(1, 7, dtype=torch.long), 6)
    with pytest.raises(UserError, match=f"exceeds context_length 12 of rolling; lower --max-new-tokens to 5 .*{why}"):
        check_length(spec, 7, 6)
    check_length(spec, 7, 5)


def test_speculative_decoding_with_window_models_rolls_back_within_the_ring(gen_dir):
    """Target and draft attend within windows: each round's rejected drafts are taken back from ring buffers (made
    with rollback = k), and generation runs past both contexts; greedy output is still the target's alone."""
    target = _lively(_model(_mixed_spec({"kind": "sliding_window", "window": 5}, every_layer=True, context=16),
                            gen_dir, seed=21))
    draft = copy.deepcopy(target)  # the target with a noisy head: it guesses some tokens right and others wrong
    with torch.no_grad():
        draft.lm_head.weight.add_(torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(9)))
    prompt = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(8))
    alone = target.generate(prompt, 30, temperature=0)[0, 6:].tolist()
    assert len(set(alone)) > 5
    for k in (2, 5):
        stats = SpeculativeStats()
        assert list(speculative_stream(target, draft, prompt, 30, k=k, temperature=0, stats=stats)) == alone
        assert 0 < stats.accepted < stats.drafted  # some drafts were kept, others rejected and rolled back


@pytest.mark.parametrize("preset", ["gpt3-like-tiny", "mistral-like-tiny", "longformer-like-tiny"])
def test_preset_caches_are_the_bytes_build_json_reports(preset, gen_dir):
    """`build --json`'s kv_cache_bytes_per_sequence (bf16, context_length, each layer's need) is what the generated
    model allocates for one sequence."""
    from pathlib import Path

    from archspec.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parent.parent / "specs" / f"{preset}.yaml")
    model = _model(spec, gen_dir)
    cache = model.new_cache(1, dtype=torch.bfloat16)
    assert sum(c.nbytes for c in cache) == account(spec).kv_cache_bytes_per_sequence
    assert min(c.k.size(2) for c in cache) < spec.model.context_length  # some layer keeps less than every position
