"""µP as a model option (issue 34): `model.parametrization: mup` follows Tensor Programs V's Table 3 for Adam relative
to `mup_base_width` (m = d_model / base): hidden matrices start at their standard std / sqrt(m) and train at lr / m,
the logits are multiplied by 1/m, and attention scores by 1/head_dim on every attention path (SDPA, the blockwise
sparse path, the KV-cached decode). The standard parametrization is unchanged (hash, file, optimizer groups).
`archspec mup-check` (archspec.ablate.mup) shows µP's activations flat across widths and standard's growing; the
rate-transfer test trains three widths over a grid of rates and finds one best rate under µP.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archspec import testing as T
from archspec.ablate.mup import (SLOPE_BOUND, best_rates, coordinate_check, parse_widths, rate_transfer, slope,
                                 widened)
from archspec.cli import main
from archspec.codegen import generate, render
from archspec.errors import UserError
from archspec.runtime import sparse
from archspec.spec import SpecError, load_spec, load_spec_dict, model_hash, parse_spec
from archspec.train.optim import build_optimizer, param_groups, set_lr
from tests.test_generation import assert_cached_pieces_match_full_forward
from tests.test_sparsity import PATTERNS, dense_masked_reference

ROOT = Path(__file__).resolve().parent.parent
MUP_WORDS = re.compile(r"ATTN_SCALE|WIDTH_MULT|OUTPUT_MULT|HIDDEN_LR_MULT|HIDDEN_INIT_SCALE|MUP_BASE_WIDTH|"
                       r"lr_multipliers|hidden_matrices|µP")
# A drawn spec may set model.attention.scale (Gemma 2's), which is an ATTN_SCALE too, not µP's (its comment says µP)
MUP_WORDS_BUT_SCALE = re.compile(MUP_WORDS.pattern.replace("ATTN_SCALE|", ""))


@pytest.fixture
def one_thread():
    """The short trainings here run on one thread: on a shared 2-core machine two threads contend (~10× slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _spec(d_model=64, base=None, parametrization="mup", name="mup", **model):
    m = {"vocab_size": 97, "context_length": 24, "d_model": d_model, "n_layers": 2,
         "attention": {"n_heads": 2, "n_kv_heads": 1}, "ffn": {"kind": "glu", "hidden_dim": 3 * d_model},
         "parametrization": parametrization, **model}
    if base is not None:
        m["mup_base_width"] = base
    return load_spec_dict({"name": name, "model": m})


def _model(spec, tmp_path, seed=0):
    torch.manual_seed(seed)
    return generate(spec, out_dir=tmp_path).Model()


# ── the standard parametrization is what it was ─────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("path", sorted((ROOT / "specs").glob("*.yaml")), ids=lambda p: p.stem)
def test_presets_render_as_generated_and_standard_written_out_changes_nothing(path):
    spec = load_spec(path)
    text = render(spec, f"specs/{path.name}")
    assert text == (ROOT / "generated" / f"{spec.name}.py").read_text(encoding="utf-8")
    assert not MUP_WORDS.search(text)
    explicit = load_spec(path, ["model.parametrization=standard", "model.mup_base_width=128"])
    assert model_hash(explicit) == model_hash(spec)
    assert render(explicit, f"specs/{path.name}") == text


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=T.spec_dicts(train=False))
def test_standard_specs_keep_hash_source_and_the_two_optimizer_groups(raw, gen_dir):
    raw["model"].pop("parametrization", None)
    raw["model"].pop("mup_base_width", None)
    spec = parse_spec(raw)
    assert not MUP_WORDS_BUT_SCALE.search(render(spec))
    written = parse_spec({**raw, "model": {**raw["model"], "parametrization": "standard"}})
    assert model_hash(written) == model_hash(spec)
    raw["model"].pop("embedding_scale", None)
    mup = parse_spec({**raw, "model": {**raw["model"], "parametrization": "mup"}})
    assert model_hash(mup) != model_hash(parse_spec(raw))
    model = generate(spec, out_dir=gen_dir).Model()
    groups = param_groups(model, 0.1)
    assert [g["name"] for g in groups] == ["decay", "no_decay"] and not any("lr_mult" in g for g in groups)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    opt = build_optimizer(model, spec.train, torch.device("cpu"))
    set_lr(opt, 1e-3)
    assert [g["lr"] for g in opt.param_groups] == [1e-3, 1e-3]


# ── µP's table ───────────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("d_model", [64, 256])
@pytest.mark.parametrize("tied", [True, False])
def test_init_stds_lr_multipliers_and_output_multiplier_follow_the_table(d_model, tied, tmp_path):
    base = 64
    m = d_model / base
    mup, std = (_model(_spec(d_model, base if p == "mup" else None, p, tie_embeddings=tied), tmp_path)
                for p in ("mup", "standard"))
    hidden = mup.hidden_matrices()
    std_params, mup_params = dict(std.named_parameters()), dict(mup.named_parameters())
    # hidden: every matrix of the blocks, nothing else
    assert set(hidden) == {n for n, p in mup_params.items() if n.startswith("blocks.") and p.ndim >= 2}
    assert {n.split(".")[-2] for n in hidden} >= {"qkv_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    for name, p in mup_params.items():  # the same draws (one seed), hidden ones scaled by 1/sqrt(m)
        assert torch.allclose(p, std_params[name] / (math.sqrt(m) if name in hidden else 1.0)), name
    # ∝ 1/sqrt(fan_in), equal to standard's 0.02 at the base width: std · sqrt(fan_in) = 0.02 · sqrt(base)
    qkv = mup_params["blocks.0.attn.qkv_proj.weight"]
    assert qkv.std().item() * math.sqrt(d_model) == pytest.approx(0.02 * math.sqrt(base), rel=0.05)
    assert mup_params["tok_emb.weight"].std().item() == pytest.approx(0.02, rel=0.05)
    if not tied:
        assert mup_params["lm_head.weight"].std().item() == pytest.approx(0.02, rel=0.05)
    mults = mup.lr_multipliers()
    assert set(mults) == set(mup_params)
    assert all(mults[n] == pytest.approx(1 / m) if n in hidden else mults[n] == 1.0 for n in mults)

    opt = build_optimizer(mup, _spec(d_model, base).train, torch.device("cpu"))
    set_lr(opt, 1e-3)
    by_param = {id(p): g for g in opt.param_groups for p in g["params"]}
    assert sum(len(g["params"]) for g in opt.param_groups) == len(mup_params)  # each once, the tied matrix too
    wd = opt.param_groups[0]["weight_decay"]
    for name, p in mup_params.items():
        g = by_param[id(p)]
        assert g["lr"] == pytest.approx(1e-3 * mults[name]), name
        if p.ndim >= 2:  # AdamW decays by lr · weight_decay: the base width's per-step decay at every width
            assert g["lr"] * g["weight_decay"] == pytest.approx(1e-3 * wd), name
    module = type(mup).__module__
    import sys

    constants = sys.modules[module]
    assert constants.WIDTH_MULT == m and constants.OUTPUT_MULT == pytest.approx(1 / m)
    assert constants.ATTN_SCALE == pytest.approx(1 / constants.HEAD_DIM)
    x = torch.randn(2, 5, d_model)
    with torch.no_grad():
        assert torch.allclose(mup.head(x), mup.lm_head(mup.final_norm(x)) / m, atol=1e-6)


def test_at_the_base_width_mup_starts_as_standard(tmp_path):
    mup, std = _model(_spec(64, 64), tmp_path), _model(_spec(64, None, "standard"), tmp_path)
    for (name, a), (_, b) in zip(mup.state_dict().items(), std.state_dict().items()):
        assert torch.equal(a, b), name
    assert set(mup.lr_multipliers().values()) == {1.0}


def test_the_generated_file_shows_the_choices(tmp_path):
    text = render(_spec(256, 64, tie_embeddings=True))
    for line in ("MUP_BASE_WIDTH = 64  #", "WIDTH_MULT = 4.0  # D_MODEL / MUP_BASE_WIDTH",
                 "HIDDEN_INIT_SCALE = 0.5  #", "HIDDEN_LR_MULT = 0.25  #", "OUTPUT_MULT = 0.25  #",
                 "ATTN_SCALE = 0.0078125  # µP: scores times 1/HEAD_DIM", "scale=ATTN_SCALE",
                 "logits = logits * OUTPUT_MULT", "weight.mul_(HIDDEN_INIT_SCALE)", "def lr_multipliers(self)"):
        assert line in text, line


# ── the attention scale, on every path ──────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("name", ["dense", *PATTERNS, "mla", "mla_window"])
def test_every_attention_path_scores_by_attn_scale_and_the_cache_agrees(name, tmp_path):
    attention = {"n_heads": 2, "n_kv_heads": 1}
    if name.startswith("mla"):
        attention = {"kind": "mla", "n_heads": 2, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                     "v_head_dim": 8}
        if name == "mla_window":
            attention["sparsity"] = {"kind": "sliding_window", "window": 5}
    elif name != "dense":
        attention["sparsity"] = PATTERNS[name][0]
    spec = _spec(32, 16, attention=attention, context_length=40)
    import sys

    model = _model(spec, tmp_path).eval()
    module = sys.modules[type(model).__module__]
    width = spec.model.attention.score_width
    assert module.ATTN_SCALE == pytest.approx(1 / width)
    assert_cached_pieces_match_full_forward(model, 97, 40)  # the decode paths score as the full forward does
    idx = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(idx)
        module.ATTN_SCALE = 2.0  # every path reads the constant: the logits move, and the cache still agrees
        try:
            assert not torch.allclose(model(idx), before, atol=1e-4)
            assert_cached_pieces_match_full_forward(model, 97, 40)
        finally:
            module.ATTN_SCALE = 1 / width


@pytest.mark.parametrize("name", PATTERNS)
def test_blockwise_and_rolling_cache_take_a_scale(name, tmp_path):
    fields, const = PATTERNS[name]
    pattern = getattr(generate(_spec(32, 16, attention={"n_heads": 2, "sparsity": fields}, context_length=64),
                               out_dir=tmp_path).module, const)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 37, 8, dtype=torch.float64, generator=g, requires_grad=True) for h in (4, 2, 2))
    i = torch.arange(37)
    mask = pattern.mask_mod(None, None, i[:, None], i[None, :])
    for scale in (0.05, 1 / 8, None):
        y = sparse.blockwise_attention(q, k, v, pattern, scale=scale)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        assert torch.allclose(y, ref, atol=1e-12)
        gy = torch.randn(y.shape, dtype=torch.float64, generator=g)
        for a, b in zip(torch.autograd.grad(y, (q, k, v), gy), torch.autograd.grad(ref, (q, k, v), gy)):
            assert torch.allclose(a, b, atol=1e-12)
    assert torch.allclose(sparse.blockwise_attention(q, k, v, pattern), dense_masked_reference(q, k, v, pattern))
    cache = sparse.RollingKVCache(pattern, 2, 2, 37, 8, dtype=torch.float64)
    with torch.no_grad():
        pieces = [cache.attend(q[:, :, :20], k[:, :, :20], v[:, :, :20], scale=0.05)]
        pieces += [cache.attend(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1], scale=0.05) for t in range(20, 37)]
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.05, enable_gqa=True)
    assert torch.allclose(torch.cat(pieces, dim=2), ref, atol=1e-12)


# ── drawn µP specs: accounting exact, causal, cache == full forward ──────────────────────────────────────────────


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=T.spec_dicts(train=False, max_layers=2, min_context=2, max_context=16), base=st.integers(1, 128))
def test_drawn_mup_specs_account_exactly_stay_causal_and_decode_as_the_full_forward(raw, base, gen_dir):
    from archspec.accounting import account

    raw["model"].update(parametrization="mup", mup_base_width=base)
    raw["model"].pop("embedding_scale", None)
    spec = parse_spec(raw)
    m = spec.model
    torch.manual_seed(0)
    model = generate(spec, out_dir=gen_dir).Model().eval()
    assert account(spec).total == sum(p.numel() for p in model.parameters())
    if all(b.ffn.causal for b in m.blocks()):
        T.assert_causal(model, m.vocab_size, m.context_length, m.context_length // 2)
    if all(getattr(b.ffn, "capacity_factor", None) is None for b in m.blocks()):
        assert_cached_pieces_match_full_forward(model, m.vocab_size, m.context_length)


# ── refused ─────────────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("model,path", [
    ({"parametrization": "MUP"}, "model.parametrization"),
    ({"parametrization": 1}, "model.parametrization"),
    ({"parametrization": ""}, "model.parametrization"),
    ({"parametrization": "mup", "mup_base_width": 0}, "model.mup_base_width"),
    ({"parametrization": "mup", "mup_base_width": -64}, "model.mup_base_width"),
    ({"parametrization": "mup", "mup_base_width": 10**400}, "model.mup_base_width"),
    ({"parametrization": "mup", "mup_base_width": 64.5}, "model.mup_base_width"),
    ({"parametrization": "mup", "mup_base_width": "nan"}, "model.mup_base_width"),
    ({"mup_base_width": 64}, "model.mup_base_width"),  # a base width means nothing under standard
    ({"parametrization": "mup", "embedding_scale": "sqrt_d_model"}, "model.embedding_scale"),
])
def test_bad_values_are_refused_by_field(model, path, tmp_path, capsys):
    data = {"name": "bad", "model": {"vocab_size": 97, "context_length": 8, "d_model": 16, "n_layers": 1,
                                     "attention": {"n_heads": 2}, **model}}
    with pytest.raises(SpecError) as info:
        load_spec_dict(data)
    assert any(p.startswith(path + ":") for p in info.value.problems), info.value.problems
    spec_file = tmp_path / "bad.yaml"
    spec_file.write_text(json.dumps(data))
    assert main(["build", str(spec_file), "--out", str(tmp_path / "out"), "--no-record"]) == 2
    err = capsys.readouterr().err
    assert path in err and "Traceback" not in err


def test_export_hf_refuses_mup():
    from archspec.hf.convert import HFUnsupported, config_from_spec

    with pytest.raises(HFUnsupported, match="model.parametrization: mup"):
        config_from_spec(_spec(64, 64))


# ── the coordinate check and the rate transfer ──────────────────────────────────────────────────────────────────


def test_widening_scales_every_inner_width_and_refuses_what_does_not_fit():
    spec = _spec(64, 32)
    wide = widened(spec, 128, "standard")
    a = wide.model.attention
    assert (wide.model.d_model, a.head_dim, a.n_heads, wide.model.ffn.hidden_dim) == (128, 64, 2, 384)
    assert wide.model.parametrization == "standard" and wide.model.n_layers == 2
    with pytest.raises(UserError, match=r"--widths: 33 .*head_dim .* multiples of 2"):
        widened(spec, 33)
    assert parse_widths("256,64,128") == [64, 128, 256]
    for bad in ("64", "64,64", "a,64", "64,0", "", "1.5,2"):
        with pytest.raises(ValueError):
            parse_widths(bad)
    assert slope([16, 32, 64], [1.0, 2.0, 4.0]) == pytest.approx(1.0)
    assert slope([16, 32, 64], [3.0, 3.0, 3.0]) == pytest.approx(0.0)


COORD_SPEC = {"vocab_size": 320, "context_length": 64, "d_model": 32, "n_layers": 2, "attention": {"n_heads": 2},
              "ffn": {"kind": "glu", "hidden_dim": 64}}


def test_coordinate_check_flat_under_mup_and_the_logits_grow_under_standard(one_thread):
    """Widths 32-128, 8 steps at lr 1e-2 on the shipped corpus: µP's slopes within SLOPE_BOUND; standard's logits
    (and blocks) grow with the width."""
    spec = load_spec_dict({"name": "coord", "model": {**COORD_SPEC, "parametrization": "mup", "mup_base_width": 32},
                           "train": {"lr": 1e-2}})
    checks = {p: coordinate_check(spec, [32, 64, 128], steps=8, parametrization=p) for p in ("mup", "standard")}
    mup, std = checks["mup"], checks["standard"]
    assert mup.coordinates == ["embedding", "block0", "block1", "logits"]
    assert all(len(per_width) == 8 for c in mup.coordinates for per_width in mup.rms[c])
    assert not mup.not_flat(), mup.slopes()
    assert std.slopes()["logits"] > SLOPE_BOUND and std.slopes()["logits"] > mup.slopes()["logits"] + 0.3
    assert "logits" in std.not_flat() and std.trend("logits") == "grows"


def test_the_best_rate_transfers_across_widths_under_mup(one_thread):
    """d_model 32/64/128 (base 32, untied head), five rates a factor 2 apart, 40 steps each (warmup, cosine) on the
    shipped corpus: the best rate (lowest validation loss) is the same within a factor 2 at every width. ~50 s on a
    loaded 2-core box."""
    spec = load_spec_dict({"name": "transfer", "model": {**COORD_SPEC, "parametrization": "mup",
                                                         "mup_base_width": 32, "tie_embeddings": False}})
    rates = [5e-3 * 2**i for i in range(5)]
    grid = rate_transfer(spec, [32, 64, 128], rates, steps=40)
    best = best_rates(grid)
    assert all(math.isfinite(v) for row in grid.values() for v in row.values())
    assert max(best.values()) / min(best.values()) <= 2.0, (best, grid)
    # the grid brackets the optimum somewhere: the best rate is not the grid's edge at every width
    assert any(rates[0] < b < rates[-1] for b in best.values()), (best, grid)



# ── the command ─────────────────────────────────────────────────────────────────────────────────────────────────


@pytest.fixture
def coord_file(tmp_path):
    path = tmp_path / "coord.yaml"
    path.write_text(json.dumps({"name": "coord", "model": {**COORD_SPEC, "parametrization": "mup",
                                                             "mup_base_width": 32}, "train": {"lr": 1e-2}}))
    return path


def test_mup_check_command_says_flat_writes_json_and_a_plot(coord_file, tmp_path, capsys, one_thread):
    png = tmp_path / "coord.png"
    code = main(["mup-check", str(coord_file), "--widths", "32,64,128", "--steps", "8", "--both", "--json",
                 "--plot", str(png)])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["flat"] and out["not_flat"] == [] and out["slope_bound"] == SLOPE_BOUND
    assert [c["parametrization"] for c in out["checks"]] == ["mup", "standard"]
    assert out["checks"][1]["slopes"]["logits"] > SLOPE_BOUND
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    standard = tmp_path / "standard.yaml"
    standard.write_text(json.dumps({"name": "coord", "model": COORD_SPEC, "train": {"lr": 1e-2}}))
    code = main(["mup-check", str(standard), "--widths", "32,64,128", "--steps", "8"])
    text = capsys.readouterr().out
    assert code == 1 and "not flat (standard)" in text and "logits grows" in text
    assert "at step 8 of 8" in text and "after 7" not in text  # the step count asked for, not one less


@pytest.mark.parametrize("argv,words", [
    (["--widths", "32"], "at least two"),
    (["--widths", "32,x"], "comma-separated integers"),
    (["--widths", "32,1.5"], "comma-separated integers"),
    (["--widths", "32,33"], "--widths: 33 does not fit coord"),
    (["--widths", "32,2"], "--widths: 2 does not fit coord"),  # head_dim 1: rope needs an even width
    (["--steps", "1"], "--steps"),
    (["--set", "model.mup_base_width=0"], "model.mup_base_width"),
])
def test_mup_check_bad_input_exits_2_in_one_line(argv, words, coord_file, capsys):
    assert main(["mup-check", str(coord_file), *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
