"""Sparse attention (issue 14): every pattern equals a dense masked reference (forward and gradients), sees exactly the
keys the issue describes, computes only the tiles it needs, is accounted for exactly, and limits what reaches a
token: zero gradient beyond the window, a non-zero one from a global token, a receptive field of L·(w − 1) + 1."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from archspec import testing as T
from archspec.accounting import account
from archspec.cli import main
from archspec.codegen import generate
from archspec.runtime import sparse
from archspec.spec import SpecError, load_spec_dict
from tests.tiny import tiny_spec

# kind fields, and the name of the SparsePattern its template defines
PATTERNS = {
    "sliding_window": ({"kind": "sliding_window", "window": 7}, "SLIDING_WINDOW"),
    "global_local": ({"kind": "global_local", "window": 5, "n_global": 3}, "GLOBAL_LOCAL"),
    # more globals than a chunk of queries: the first chunks lie within the globals (their band is empty)
    "global_local_wide": ({"kind": "global_local", "window": 6, "n_global": 20}, "GLOBAL_LOCAL"),
    "block_sparse": ({"kind": "block_sparse", "block_size": 5, "n_blocks_back": 1}, "BLOCK_SPARSE"),
    "block_sparse_no_first": ({"kind": "block_sparse", "block_size": 4, "n_blocks_back": 2,
                               "global_first_block": False}, "BLOCK_SPARSE"),
}


def visible(fields: dict, i: int, j: int) -> bool:
    """The issue's words, independently of the templates: may query i see key j?"""
    if j > i:
        return False
    kind = fields["kind"]
    if kind == "sliding_window":  # HF Mistral: i - window < j <= i
        return i - fields["window"] < j
    if kind == "global_local":  # the first n_global positions are global
        return i - fields["window"] < j or j < fields["n_global"] or i < fields["n_global"]
    bs, back = fields["block_size"], fields["n_blocks_back"]
    return i // bs - j // bs <= back or (fields.get("global_first_block", True) and j // bs == 0)


def _spec(sparsity: dict, *, n_heads=4, n_kv_heads=2, positional=None, context=48, n_layers=1, d_model=32,
          name="sp") -> object:
    att = {"n_heads": n_heads, "n_kv_heads": n_kv_heads, "sparsity": sparsity}
    if positional is not None:
        att["positional"] = positional
    return tiny_spec(name, vocab_size=53, context_length=context, d_model=d_model, n_layers=n_layers, attention=att)


def _module(spec, tmp_path):
    return generate(spec, out_dir=tmp_path)


def dense_masked_reference(q, k, v, pattern, dropout_p=0.0):
    """The full-cost answer: a T×T boolean mask from the pattern's predicate, SDPA's math kernel."""
    T_ = q.size(2)
    i = torch.arange(T_)
    mask = pattern.mask_mod(None, None, i[:, None], i[None, :])  # (T, T)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.size(1) != q.size(1))


# ── the predicates say what the issue says ──────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("name", PATTERNS)
def test_pattern_predicate_and_key_count_are_the_issues(name, tmp_path):
    fields, const = PATTERNS[name]
    spec = _spec(fields)
    pattern = getattr(_module(spec, tmp_path).module, const)
    for T_ in (1, 2, 13, 37, 48):
        i = torch.arange(T_)
        got = pattern.mask_mod(None, None, i[:, None], i[None, :])
        want = torch.tensor([[visible(fields, a, b) for b in range(T_)] for a in range(T_)])
        assert torch.equal(got, want), T_
        # accounting: the exact mean key count (a sum over positions), the one the FLOPs use
        assert spec.model.attention.sparsity.keys(T_) * T_ == int(want.sum())
        assert account(spec, seq_len=T_).attention_keys == pytest.approx(int(want.sum()) / T_, rel=1e-12)


# ── equal to the dense masked reference, forward and gradients ──────────────────────────────────────────────────


# Every pattern with every K/V layout and every positional kind (each pair at least once).
LAYOUT_POSITIONAL = [((4, 4), "rope"), ((4, 2), "learned"), ((4, 1), "sinusoidal"), ((4, 2), "none")]


@pytest.mark.parametrize("name", PATTERNS)
@pytest.mark.parametrize("layout,positional", LAYOUT_POSITIONAL,
                         ids=[f"{'MHA' if h == kv else 'MQA' if kv == 1 else 'GQA'}-{p}" for (h, kv), p in LAYOUT_POSITIONAL])
def test_model_equals_dense_masked_reference(name, layout, positional, tmp_path, monkeypatch):
    """The whole generated model, once as generated and once with its attention replaced by the dense masked
    reference: logits and every parameter's gradient agree in float32, at a T that is no multiple of the block
    size nor of the chunk (several chunks, padding at the end)."""
    fields, _ = PATTERNS[name]
    spec = _spec(fields, n_heads=layout[0], n_kv_heads=layout[1], positional={"kind": positional}, n_layers=2)
    module = _module(spec, tmp_path).module
    torch.manual_seed(0)
    model = module.Model()
    idx = torch.randint(0, 53, (2, 37), generator=torch.Generator().manual_seed(1))

    def run():
        model.zero_grad()
        logits, loss = model(idx, idx)
        loss.backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    logits, grads = run()
    monkeypatch.setattr(module, "sparse_attention", dense_masked_reference)
    ref_logits, ref_grads = run()
    assert torch.allclose(logits, ref_logits, atol=1e-5, rtol=1e-5)
    for n in grads:
        assert torch.allclose(grads[n], ref_grads[n], atol=1e-5, rtol=1e-4), n


@pytest.mark.parametrize("name", PATTERNS)
@pytest.mark.parametrize("T_,blocks", [(1, None), (13, None), (37, 1), (37, 2), (64, 4), (61, 25)])
def test_blockwise_path_equals_reference_in_float64(name, T_, blocks, tmp_path):
    """The blockwise function itself, over chunk sizes (one chunk, many, a chunk longer than T; for block_sparse
    whole blocks, the chunk's alignment its band relies on) and lengths."""
    fields, const = PATTERNS[name]
    module = _module(_spec(fields, context=64), tmp_path).module
    pattern = getattr(module, const)
    if blocks is not None:
        chunk = blocks * fields.get("block_size", 4)
        pattern = sparse.SparsePattern(pattern.mask_mod, pattern.n_global, pattern.lookback, chunk, pattern.reach)
    g = torch.Generator().manual_seed(T_)
    q, k, v = (torch.randn(2, h, T_, 8, dtype=torch.float64, generator=g, requires_grad=True) for h in (6, 2, 2))
    y = sparse.blockwise_attention(q, k, v, pattern)
    ref = dense_masked_reference(q, k, v, pattern)
    gy = torch.randn(y.shape, dtype=torch.float64, generator=g)
    grads = torch.autograd.grad(y, (q, k, v), gy)
    ref_grads = torch.autograd.grad(ref, (q, k, v), gy)
    assert torch.allclose(y, ref, atol=1e-12)
    for a, b in zip(grads, ref_grads):
        assert torch.allclose(a, b, atol=1e-12)


# ── what reaches a token ────────────────────────────────────────────────────────────────────────────────────────


def _input_gradient(model, idx, t):
    """|d logits[:, t] / d (token embedding at each position)|, summed over batch and width: (T,)."""
    captured = {}

    def keep(_module, _inputs, out):
        out.retain_grad()
        captured["x"] = out

    handle = model.tok_emb.register_forward_hook(keep)
    try:
        model.zero_grad()
        model(idx)[:, t].sum().backward()
    finally:
        handle.remove()
    return captured["x"].grad.abs().sum(dim=(0, 2))


def test_one_window_layer_zero_gradient_beyond_the_window_nonzero_from_a_global_token(tmp_path):
    w, t = 6, 30
    idx = torch.randint(0, 53, (2, 40), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    window = _module(_spec({"kind": "sliding_window", "window": w}, name="win"), tmp_path).Model()
    grad = _input_gradient(window, idx, t)
    assert (grad[: t - w + 1] == 0).all()  # further back than the window: exactly zero
    assert (grad[t - w + 1 : t + 1] > 0).all()  # inside the window: every position reaches t
    assert (grad[t + 1 :] == 0).all()  # the future: causal
    torch.manual_seed(0)
    longformer = _module(_spec({"kind": "global_local", "window": w, "n_global": 2}, name="gl"), tmp_path).Model()
    grad = _input_gradient(longformer, idx, t)
    assert (grad[:2] > 0).all()  # the global tokens reach t from far beyond the window
    assert (grad[2 : t - w + 1] == 0).all()
    assert (grad[t - w + 1 : t + 1] > 0).all()


@pytest.mark.parametrize("n_layers,w", [(1, 4), (3, 4), (2, 7)])
def test_stacked_window_layers_see_exactly_L_times_w_minus_1_plus_1_positions(n_layers, w, tmp_path):
    t = 40
    torch.manual_seed(0)
    model = _module(_spec({"kind": "sliding_window", "window": w}, n_layers=n_layers, context=48), tmp_path).Model()
    grad = _input_gradient(model, torch.randint(0, 53, (2, 48), generator=torch.Generator().manual_seed(0)), t)
    reach = (grad > 0).nonzero().flatten().tolist()
    assert reach == list(range(t - n_layers * (w - 1), t + 1))  # L·(w - 1) + 1 positions, and no more


@pytest.mark.parametrize("name", PATTERNS)
def test_causal_under_perturbation(name, tmp_path):
    fields, _ = PATTERNS[name]
    model = _module(_spec(fields, n_layers=2), tmp_path).Model()
    for position in (0, 3, 17, 47):
        T.assert_causal(model, 53, 48, position)


# ── the blockwise path computes only the tiles it needs ─────────────────────────────────────────────────────────


def test_blockwise_path_multiplies_only_its_tiles(tmp_path):
    """FlopCounterMode over the attention: the tiles' products (the band of chunk + lookback keys per query, plus the
    globals), not T² — and the accounting's exact key count is what the pattern needs, below what the tiles hold."""
    w, T_, H, D = 32, 512, 4, 16
    spec = _spec({"kind": "sliding_window", "window": w}, context=T_)
    module = _module(spec, tmp_path).module
    q, k, v = (torch.randn(1, H, T_, D) for _ in range(3))
    counter = FlopCounterMode(display=False)
    pattern = sparse.SparsePattern(module.sliding_window_mask, 0, w - 1, 16, w)
    with counter:
        sparse.blockwise_attention(q, k, v, pattern)
    tile_keys = 16 + (w - 1)
    # each chunk of 16 queries × its band of 16 + (w - 1) keys, the band cut at position 0 for the first chunks
    keys = sum(16 * (start + 16 - max(0, start - (w - 1))) for start in range(0, T_, 16))
    assert counter.get_total_flops() == 2 * 2 * H * D * keys
    assert keys <= T_ * tile_keys
    assert counter.get_total_flops() < 2 * 2 * H * D * T_ * T_ / 8  # dense causal would be T²/2 keys
    assert spec.model.attention.sparsity.keys(T_) < tile_keys


def test_training_with_attention_dropout_takes_the_blockwise_path(tmp_path):
    spec = load_spec_dict({"name": "drop", "model": {"vocab_size": 53, "context_length": 32, "d_model": 32,
                                                      "n_layers": 1, "dropout": 0.5, "attention": {
                                                          "n_heads": 4, "sparsity": {"kind": "sliding_window",
                                                                                     "window": 5}}}})
    model = _module(spec, tmp_path).Model()
    idx = torch.randint(0, 53, (2, 32))
    model.train()
    _, loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(loss)
    model.eval()
    assert torch.equal(model(idx), model(idx))  # no dropout in eval


@pytest.mark.parametrize("name", ["global_local", "block_sparse"])
def test_blockwise_backward_with_dropout_is_the_gradient_of_its_forward(name, tmp_path):
    """The backward recomputes each tile and reapplies the keep-mask forward drew: with the RNG reseeded before each
    call the path is a deterministic function, and gradcheck (float64) compares it with finite differences."""
    fields, const = PATTERNS[name]
    module = _module(_spec(fields, context=64), tmp_path).module
    pattern = getattr(module, const)
    pattern = sparse.SparsePattern(pattern.mask_mod, pattern.n_global, pattern.lookback, 5, pattern.reach)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 13, 4, dtype=torch.float64, generator=g, requires_grad=True) for h in (4, 2, 2))

    def attend(q, k, v):
        torch.manual_seed(0)
        return sparse.blockwise_attention(q, k, v, pattern, dropout_p=0.3)

    with torch.no_grad():
        assert not torch.allclose(attend(q, k, v), sparse.blockwise_attention(q, k, v, pattern))  # something dropped
    assert torch.autograd.gradcheck(attend, (q, k, v))


@pytest.mark.slow
def test_compiled_block_equals_eager(tmp_path):
    """The training loop compiles each block: the compiled block calls the blockwise Function eagerly (a graph break,
    so that compile time does not grow with T), and its logits and gradients are the eager ones."""
    module = _module(_spec({"kind": "global_local", "window": 5, "n_global": 3}, context=40), tmp_path).module
    torch.manual_seed(0)
    model = module.Model()
    idx = torch.randint(0, 53, (2, 40), generator=torch.Generator().manual_seed(1))

    def run():
        model.zero_grad()
        logits, loss = model(idx, idx)
        loss.backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    logits, grads = run()
    for block in model.blocks:
        block.compile()
    compiled_logits, compiled_grads = run()
    assert torch.allclose(logits, compiled_logits, atol=1e-5)
    for n in grads:
        assert torch.allclose(grads[n], compiled_grads[n], atol=1e-5, rtol=1e-4), n


# ── FlexAttention (the CUDA path), checked on CPU as far as CPU allows: forward, eager ─────────────────────────


@pytest.mark.parametrize("name", PATTERNS)
def test_flex_block_mask_is_cached_and_flex_forward_matches(name, tmp_path):
    pytest.importorskip("torch.nn.attention.flex_attention")
    from torch.nn.attention.flex_attention import flex_attention

    fields, const = PATTERNS[name]
    module = _module(_spec(fields), tmp_path).module
    pattern = getattr(module, const)
    mask = sparse.flex_block_mask(pattern, 37, torch.device("cpu"))
    assert sparse.flex_block_mask(pattern, 37, torch.device("cpu")) is mask  # built once per (pattern, T)
    assert sparse.flex_block_mask(pattern, 36, torch.device("cpu")) is not mask
    q, k, v = torch.randn(1, 4, 37, 8), torch.randn(1, 2, 37, 8), torch.randn(1, 2, 37, 8)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention warns that it is unfused: here that is the point
        y = flex_attention(q, k, v, block_mask=mask, enable_gqa=True)
    assert torch.allclose(y, sparse.blockwise_attention(q, k, v, pattern), atol=1e-5)


def test_cpu_never_takes_the_flex_path(tmp_path, monkeypatch):
    module = _module(_spec(PATTERNS["sliding_window"][0]), tmp_path).module

    def refuse(*args, **kwargs):
        raise AssertionError("FlexAttention called on CPU")

    monkeypatch.setattr(sparse, "flex_attention_fn", refuse)
    monkeypatch.setattr(sparse, "flex_block_mask", refuse)
    model = module.Model()
    _, loss = model(torch.randint(0, 53, (2, 20)), torch.randint(0, 53, (2, 20)))
    loss.backward()


def test_dense_keeps_sdpa_is_causal(tmp_path):
    gen = _module(_spec({"kind": "dense"}), tmp_path)
    assert "is_causal=not start" in gen.source and "sparse_attention" not in gen.source


def test_the_kernels_live_in_the_runtime_and_the_file_names_them(tmp_path):
    """A sparse model file holds its pattern (the predicate and its SparsePattern) and calls sparse_attention by name;
    the blockwise Function, the FlexAttention dispatch and the caches are archspec.runtime's, rendered nowhere."""
    gen = _module(_spec(PATTERNS["global_local"][0]), tmp_path)
    for machinery in ("def blockwise_attention(", "class SparsePattern", "class BlockwiseAttention", "_TILE_BIASES",
                      "class RollingKVCache", "class KVCache", "def causal_mask("):
        assert machinery not in gen.source, machinery
    assert "from archspec.runtime import RollingKVCache, SparsePattern, sparse_attention, stream\n" in gen.source
    assert gen.module.sparse_attention is sparse.sparse_attention


# ── spec validation, accounting, build --json ───────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("sparsity,path", [
    ({"kind": "sliding_window", "window": 0}, "model.attention.sparsity.window"),
    ({"kind": "global_local", "window": 4, "n_global": 48}, "model.attention.sparsity.n_global"),
    ({"kind": "global_local", "window": 0}, "model.attention.sparsity.window"),
    ({"kind": "block_sparse", "block_size": 0}, "model.attention.sparsity.block_size"),
    ({"kind": "block_sparse", "n_blocks_back": -1}, "model.attention.sparsity.n_blocks_back"),
    ({"kind": "sliding_window", "window": 4, "n_global": 2}, "model.attention.sparsity.n_global"),
])
def test_invalid_patterns_are_refused_at_their_field(sparsity, path):
    with pytest.raises(SpecError) as err:
        _spec(sparsity)
    assert path in err.value.render()


def test_block_size_need_not_divide_the_context():
    spec = _spec({"kind": "block_sparse", "block_size": 5}, context=48)
    assert spec.model.attention.sparsity.block_size == 5


def test_build_json_has_kv_bytes_per_sequence_with_each_layers_real_cache(tmp_path, capsys):
    spec_path = tmp_path / "win.yaml"
    spec_path.write_text("name: win\nmodel: {vocab_size: 320, context_length: 64, d_model: 32, n_layers: 3,\n"
                         "  attention: {n_heads: 4, n_kv_heads: 2, sparsity: {kind: sliding_window, window: 10}}}\n")
    assert main(["build", str(spec_path), "--json", "--out", str(tmp_path), "--no-record"]) == 0
    obj = json.loads(capsys.readouterr().out)
    per_token = 2 * 3 * 2 * 8 * 2  # K and V · layers · KV heads · head_dim · bf16
    assert obj["kv_cache_bytes_per_token"] == per_token
    assert obj["kv_cache_bytes_per_sequence"] == per_token * 10  # a window layer holds at most its window
    dense = account(_spec({"kind": "dense"}, context=64, n_layers=3))
    assert dense.kv_cache_bytes_per_sequence == dense.kv_cache_bytes_per_token * 64
    gl = _spec({"kind": "global_local", "window": 10, "n_global": 4}, context=64)
    assert account(gl).kv_cache_bytes_per_sequence == 2 * 2 * 8 * 2 * 14  # the globals and the window
    bs = _spec({"kind": "block_sparse", "block_size": 8, "n_blocks_back": 2}, context=64)
    assert account(bs).kv_cache_bytes_per_sequence == 2 * 2 * 8 * 2 * (3 * 8 + 8)  # own + 2 back + the first


def test_build_table_shows_the_mean_key_count(tmp_path, capsys):
    spec_path = tmp_path / "win.yaml"
    spec_path.write_text("name: win\nmodel: {vocab_size: 320, context_length: 64, d_model: 32, n_layers: 1,\n"
                         "  attention: {n_heads: 4, sparsity: {kind: sliding_window, window: 10}}}\n")
    assert main(["build", str(spec_path), "--out", str(tmp_path), "--no-record"]) == 0
    out = capsys.readouterr().out
    assert f"{(55 + 54 * 10) / 64:.1f} keys/query" in out  # Σ min(t + 1, 10) over t < 64 = 1 + ... + 10 + 54·10


def test_ablation_report_shows_attention_flops_when_patterns_differ():
    from archspec.ablate.report import RunResult, VariantResult, table_rows

    def variant(index, attention_flops):
        runs = [RunResult(f"r{index}", 0, "FINISHED", 2.0, 1000.0, [(10, 2.0)], 256, {"val_loss": 2.0})]
        return VariantResult(index, f"v{index}", {}, 100, 100, 600, 512, runs, attention_flops)

    rows = table_rows([variant(0, 4096), variant(1, 1024)], 0)
    assert [r["attn FLOPs/tok"] for r in rows] == ["4.10k", "1.02k"]
    assert "attn FLOPs/tok" not in table_rows([variant(0, 4096), variant(1, 4096)], 0)[0]  # same pattern: no column
    spec = _spec(PATTERNS["sliding_window"][0], context=48)
    a = spec.model.attention
    # the accounting's attention figure: QKᵀ and AV at the exact mean key count, per layer
    assert account(spec).to_dict()["flops_per_token"]["attention"] == round(
        2 * 2 * a.n_heads * a.head_dim * spec.model.attention.sparsity.keys(48))


def test_memory_plan_counts_what_the_blockwise_path_keeps_on_cpu():
    """The blockwise path recomputes its tiles in backward: what it keeps (q, k, v and the output; counted against
    autograd's saved tensors in test_memory.py) does not grow with the window; attention dropout adds a keep-mask per
    tile entry. On CUDA, FlexAttention keeps what SDPA keeps."""
    from archspec.memory import block_saved_per_token

    dense = _spec({"kind": "dense"}, context=48).model
    narrow = _spec({"kind": "sliding_window", "window": 4}, context=48).model
    wide = _spec({"kind": "sliding_window", "window": 40}, context=48).model
    assert block_saved_per_token(narrow, 48, "cpu", False) == block_saved_per_token(wide, 48, "cpu", False)
    a = narrow.attention
    assert narrow.attention.sparsity.blockwise_kept_bytes(narrow, 4) == (2 * a.n_heads + 2 * a.n_kv_heads) * a.head_dim * 4
    assert dense.attention.sparsity.blockwise_kept_bytes(dense, 4) is None  # SDPA's, counted by archspec.memory
    dropout = load_spec_dict({"name": "drop", "model": {"vocab_size": 53, "context_length": 48, "d_model": 32,
                                                         "n_layers": 1, "dropout": 0.1, "attention": {
                                                             "n_heads": 4, "n_kv_heads": 2,
                                                             "sparsity": {"kind": "sliding_window", "window": 4}}}}).model
    masks = dropout.attention.sparsity.blockwise_kept_bytes(dropout, 4) - narrow.attention.sparsity.blockwise_kept_bytes(narrow, 4)
    assert masks >= a.n_heads * 4  # at least a byte per query head × the window's keys
    assert block_saved_per_token(wide, 48, "cuda", True) == block_saved_per_token(dense, 48, "cuda", True)
    # with attention dropout CUDA takes the blockwise path too (FlexAttention has no dropout): its bytes, in bf16
    from archspec.memory import _mixer_saved as _attention_saved  # the layer's token mixer: attention here

    assert _attention_saved(dropout, 48, 2, "cuda") == dropout.attention.sparsity.blockwise_kept_bytes(dropout, 2)
    assert _attention_saved(narrow, 48, 2, "cuda") != narrow.attention.sparsity.blockwise_kept_bytes(narrow, 2)  # SDPA's

