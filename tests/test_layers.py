"""Per-layer variation (issue 9): named layer groups over the model-wide components."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import assume, given, settings
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from archspec import testing as T
from archspec.accounting import account
from archspec.codegen import generate, render
from archspec.errors import UserError
from archspec.registry.query import compile_filter, resolve_field
from archspec.spec import canonical_dict, load_spec_dict, parse_spec, model_hash

BASE = {"name": "pl", "model": {"vocab_size": 67, "context_length": 24, "d_model": 32, "n_layers": 4,
                                "attention": {"n_heads": 4, "n_kv_heads": 2}, "ffn": {"kind": "glu", "hidden_dim": 64}}}


def with_layers(layers: dict, **model) -> dict:
    raw = copy.deepcopy(BASE)
    raw["model"].update(model)
    raw["model"]["layers"] = layers
    return raw


MIXED = with_layers({
    "wide": {"select": {"start": 1, "step": 2}, "ffn": {"hidden_dim": 128}},
    "first": {"select": [0], "ffn": {"kind": "mlp", "activation": "gelu_tanh", "bias": True},
              "attention": {"n_kv_heads": 1, "qkv_bias": True}},
    "ln": {"select": {"start": 2, "stop": 4}, "norm": {"kind": "layernorm"}},
})


def _flops(model, vocab: int, T_: int) -> int:
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), counter:
        model(torch.randint(0, vocab, (1, T_)))
    return counter.get_total_flops()


def _check_exact(spec, tmp_path):
    torch.manual_seed(0)
    model = generate(spec, out_dir=tmp_path).Model().eval()
    acc = account(spec)
    assert acc.total == sum(p.numel() for p in model.parameters())
    named = dict(model.named_parameters())
    assert acc.by_component["ffn"] == sum(p.numel() for n, p in named.items() if ".ffn." in n)
    assert acc.by_component["attention"] == sum(p.numel() for n, p in named.items() if ".attn." in n)
    T_ = spec.model.context_length
    full = account(spec, full_attention=True).flops_forward * T_
    assert abs(_flops(model, spec.model.vocab_size, T_) - full) <= 0.01 * full
    return model


def test_groups_resolve_per_layer():
    m = load_spec_dict(MIXED).model
    blocks = m.blocks()
    assert [b.ffn.kind for b in blocks] == ["mlp", "glu", "glu", "glu"]
    assert [b.ffn.hidden_dim for b in blocks] == [128, 128, 64, 128]  # mlp defaults to 4·d_model; wide: 1, 3
    assert [b.norm.kind for b in blocks] == ["rmsnorm", "rmsnorm", "layernorm", "layernorm"]
    assert [b.attention.n_kv_heads for b in blocks] == [1, 2, 2, 2]
    assert blocks[0].attention.qkv_bias and not blocks[0].attention.out_bias
    assert m.norm.kind == "rmsnorm"  # the final norm stays the model-wide one


def test_mixed_spec_accounting_is_exact_and_causal(tmp_path):
    spec = load_spec_dict(MIXED)
    model = _check_exact(spec, tmp_path)
    T.assert_causal(model, 67, 24, position=9)
    assert len(account(spec).by_block) == len({id(b) for b in spec.model.blocks()}) == 4
    per_layer = {tuple(b["layers"]): b for b in account(spec).by_block}
    assert sum(b["params"] * len(b["layers"]) for b in per_layer.values()) == sum(
        account(spec).by_component[c] for c in ("attention", "ffn")) + account(spec).by_component["norm"] - (
        spec.model.norm.params(32))


def test_one_block_class_per_distinct_configuration(tmp_path):
    spec = load_spec_dict(with_layers({"odd": {"select": {"start": 1, "step": 2}, "ffn": {"hidden_dim": 96}}},
                                      n_layers=6))
    gen = generate(spec, out_dir=tmp_path)
    # Configurations that differ in a constant share one class, which takes it as an argument.
    assert [type(b).__name__ for b in gen.Model().blocks] == ["Block"] * 6
    assert gen.source.count("class Block(") == 1 and gen.source.count("class FeedForward(") == 1
    assert "FFN_HIDDEN = 64" in gen.source and "FFN_HIDDEN_LAYERS_1_3_5 = 96" in gen.source
    assert [b.ffn.ffn_hidden for b in gen.Model().blocks] == [64, 96] * 3


def test_configurations_with_other_code_get_a_class_each_named_by_kind(tmp_path):
    spec = load_spec_dict(with_layers({"moe": {"select": {"start": 1}, "ffn": {
        "kind": "moe", "n_experts": 4, "top_k": 2, "expert": {"kind": "glu", "hidden_dim": 16}}}}, n_layers=4))
    gen = generate(spec, out_dir=tmp_path)
    # one block class for the one block shape: it takes its parts as constructor arguments, so no class is copied
    assert [type(b).__name__ for b in gen.Model().blocks] == ["Block"] * 4 and gen.source.count("Block(nn.Module)") == 1
    assert [type(b.ffn).__name__ for b in gen.Model().blocks] == ["GLUFeedForward"] + ["MoEFeedForward"] * 3
    assert "class GLUFeedForward(" in gen.source and "class MoEFeedForward(" in gen.source
    assert "*(Block(Attention(), MoEFeedForward()) for _ in range(3)),  # layers 1-3" in gen.source


@settings(max_examples=12, deadline=None)
@given(T.valid_specs(max_layers=4))
def test_drawn_per_layer_mixes_are_exact(spec):
    assume(spec.model.layers)  # a per-layer mix is drawn for some specs only
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        model = generate(spec, out_dir=d).Model()
        assert account(spec).total == sum(p.numel() for p in model.parameters())
        if all(b.ffn.causal for b in spec.model.blocks()):  # MoE dropping by probability is not (test_properties)
            T.assert_causal(model, spec.model.vocab_size, spec.model.context_length,
                            position=spec.model.context_length // 2)


# ── the hash sees the layers, not how they were written ─────────────────────────────────────────────────────────


def test_uniform_setting_written_once_or_per_layer_hashes_alike():
    once = load_spec_dict(copy.deepcopy(BASE))
    every = load_spec_dict(with_layers({f"l{i}": {"select": [i], "ffn": {"hidden_dim": 64}} for i in range(4)}))
    all_at_once = load_spec_dict(with_layers({"all": {"select": {}, "ffn": {"kind": "glu", "hidden_dim": 64}}}))
    assert model_hash(once) == model_hash(every) == model_hash(all_at_once)
    assert render(once) == render(every)


def test_group_names_and_spellings_are_labels():
    a = with_layers({"wide": {"select": {"start": 1, "step": 2}, "ffn": {"hidden_dim": 128}}})
    b = with_layers({"x": {"select": [3, 1], "ffn": {"hidden_dim": 128}}})
    c = with_layers({"p": {"select": [1], "ffn": {"hidden_dim": 128}}, "q": {"select": {"start": 3}, "ffn": {"hidden_dim": 128}}})
    hashes = {model_hash(load_spec_dict(r)) for r in (a, b, c)}
    assert len(hashes) == 1
    # a model-wide glu with every layer overridden to mlp is the model-wide mlp
    d = with_layers({"all": {"select": {}, "ffn": {"kind": "mlp"}}})
    e = copy.deepcopy(BASE)
    e["model"]["ffn"] = {"kind": "mlp"}
    assert model_hash(load_spec_dict(d)) == model_hash(load_spec_dict(e))
    assert model_hash(load_spec_dict(a)) != model_hash(load_spec_dict(BASE))


def test_canonical_form_round_trips():
    spec = load_spec_dict(MIXED)
    canon = canonical_dict(spec)
    assert set(canon["model"]["layers"]) == {"ffn_1", "ffn_2", "norm_1", "attention_1"}
    again = parse_spec(canon)
    assert model_hash(again) == model_hash(spec)
    assert [b.key() for b in again.model.blocks()] == [b.key() for b in spec.model.blocks()]


# ── bad selections at their own paths ───────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("layers,path,words", [
    ({"g": {"select": [0, 4], "ffn": {"hidden_dim": 8}}}, "model.layers.g.select.1", "0..3, got 4"),
    ({"g": {"select": [], "ffn": {"hidden_dim": 8}}}, "model.layers.g.select", "selects no layer"),
    ({"g": {"select": [1, 1], "ffn": {"hidden_dim": 8}}}, "model.layers.g.select", "more than once"),
    ({"g": {"select": {"start": 4}, "ffn": {"hidden_dim": 8}}}, "model.layers.g.select.start", "below n_layers"),
    ({"g": {"select": {"stop": 9}, "ffn": {"hidden_dim": 8}}}, "model.layers.g.select.stop", "at most n_layers"),
    ({"g": {"select": {"step": 0}, "ffn": {"hidden_dim": 8}}}, "model.layers.g.select.step", "greater than or equal"),
    ({"g": {"select": [0]}}, "model.layers.g", "sets nothing"),
    ({"g": {"select": [0], "ffn": {"activation": "bogus"}}}, "model.layers.g.ffn.activation", "'silu'"),
    ({"g": {"select": [0], "ffn": {"kind": "mlp", "activation": "sigmoid"}}}, "model.layers.g.ffn.activation", "gelu"),
    # positions may be switched off per layer (tests/test_layer_positions.py), not changed
    ({"g": {"select": [0], "attention": {"positional": {"kind": "rope", "theta": 500.0}}}},
     "model.layers.g.attention.positional", "shared by every layer"),
    ({"g": {"select": [0], "attention": {"n_kv_heads": 3}}}, "model.layers.g.attention.n_kv_heads", "must divide"),
    ({"a": {"select": [0, 1], "ffn": {"hidden_dim": 8}}, "b": {"select": {"start": 1}, "ffn": {"hidden_dim": 16}}},
     "model.layers.a.ffn.hidden_dim", "also selected by group 'b'"),
    ({"Bad Name": {"select": [0], "ffn": {"hidden_dim": 8}}}, "model.layers", "pattern"),
    # a union inside a group's union (an MoE's expert): its tag is dropped too (found by a Hypothesis draw)
    ({"g": {"select": [1], "ffn": {"kind": "moe", "n_experts": 2, "top_k": 1,
                                   "expert": {"kind": "glu", "hidden_dim": 8, "x-0": 1}}}},
     "model.layers.g.ffn.expert.x-0:", "unknown field"),
    ({"g": {"select": [1], "ffn": {"kind": "moe", "n_experts": 2, "top_k": 1, "expert": {"hidden_dim": "q"}}}},
     "model.layers.g.ffn.expert.hidden_dim:", "valid integer"),
    # the model-wide heads do not divide d_model (no head width) and a group sets another attention: the rope rule
    # comparing the layers' widths met None (a TypeError; found by a Hypothesis draw)
    ({"g": {"select": [0], "attention": {"kind": "mla", "n_heads": 1, "kv_lora_rank": 1, "qk_nope_head_dim": 1,
                                         "qk_rope_head_dim": 2, "v_head_dim": 1}}, "__attention__": {"n_heads": 3}},
     "model.attention.n_heads:", "must divide d_model"),
], ids=lambda v: v if isinstance(v, str) and v.startswith("model") else None)
def test_bad_groups_are_reported_at_their_paths(layers, path, words):
    layers = dict(layers)
    attention = layers.pop("__attention__", None)  # a model-wide attention to merge in
    data = with_layers(layers)
    if attention:
        data["model"]["attention"] = {**data["model"]["attention"], **attention}
    with pytest.raises(UserError) as info:
        load_spec_dict(data)
    lines = [ln for ln in str(info.value).splitlines() + list(getattr(info.value, "problems", []))]
    assert any(ln.startswith(path) and words in ln for ln in lines), lines


def test_overlapping_groups_that_agree_are_fine():
    spec = load_spec_dict(with_layers({"a": {"select": [0, 1], "ffn": {"hidden_dim": 96}},
                                       "b": {"select": [1, 2], "ffn": {"hidden_dim": 96}, "norm": {"eps": 1e-6}}}))
    assert [b.ffn.hidden_dim for b in spec.model.blocks()] == [96, 96, 96, 64]
    assert [b.norm.eps for b in spec.model.blocks()] == [1e-5, 1e-6, 1e-6, 1e-5]


# ── everywhere a spec key works ─────────────────────────────────────────────────────────────────────────────────


def test_set_reaches_a_group_and_adds_one():
    spec = load_spec_dict(copy.deepcopy(MIXED), ["model.layers.wide.ffn.hidden_dim=96",
                                                 "model.layers.last={select: [3], ffn: {kind: mlp}}"])
    assert [b.ffn.hidden_dim for b in spec.model.blocks()][:3] == [128, 96, 64]
    assert spec.model.blocks()[3].ffn.kind == "mlp"
    kind_change = load_spec_dict(copy.deepcopy(MIXED), ["model.layers.first.ffn.kind=glu"])
    assert kind_change.model.blocks()[0].ffn.kind == "glu"  # a new kind starts from its defaults


def test_sweep_grid_varies_a_layer_group(tmp_path):
    from archspec.ablate.sweep import load_sweep

    sweep = load_sweep(data={"name": "pl-sweep", "base": copy.deepcopy(MIXED), "seeds": [0],
                             "budget": {"steps": 2}, "grid": {"model.layers.wide.ffn.hidden_dim": [32, 96]},
                             "zip": {"model.layers.first.select": [[0], [2]],
                                     "model.layers.ln.select": [[3], [1]]}})
    got = [[b.ffn.hidden_dim for b in v.spec.model.blocks()] for v in sweep.variants]
    assert sorted(got) == sorted([[128, 32, 64, 32], [128, 96, 64, 96], [64, 32, 128, 32], [64, 96, 128, 96]])


def test_filters_name_the_canonical_groups():
    compile_filter("params.model.layers.ffn_1.ffn.kind = 'mlp' and params.model.layers.attention_1.select.step = 2")
    assert resolve_field("params.model.layers.norm_2.norm.eps", "runs").kind == "param"
    for typo in ("params.model.layers.wide.ffn.hidden_dim", "params.model.layers.ffn_1.ffn.hiden_dim",
                 "params.model.layers.ffn_1.norm.eps"):
        with pytest.raises(ValueError, match="unknown spec key"):
            resolve_field(typo, "runs")


def test_hf_per_layer_fields_are_expressible():
    """Qwen2-MoE's mlp_only_layers and decoder_sparse_step, and a per-layer setting (the FFN here; windows with
    sparse attention), map onto groups."""
    n, step, mlp_only = 6, 2, [0, 5]
    sparse = [i for i in range(n) if (i + 1) % step == 0 and i not in mlp_only]
    spec = load_spec_dict(with_layers({
        "sparse_step": {"select": sparse, "ffn": {"hidden_dim": 16}},  # stands in for the MoE FFN
    }, n_layers=n))
    assert [b.ffn.hidden_dim for b in spec.model.blocks()] == [64, 16, 64, 16, 64, 64]
    via_range = load_spec_dict(with_layers({"s": {"select": {"start": step - 1, "stop": 5, "step": step},
                                                  "ffn": {"hidden_dim": 16}}}, n_layers=n))
    assert model_hash(via_range) == model_hash(spec)
    # "sparse every 2nd layer, except the mlp_only ones" is not a precedence rule here: overlapping groups that
    # disagree are refused, so the exception is written as the selection itself (what import-hf computes).
    with pytest.raises(UserError, match="2 problems"):
        load_spec_dict(with_layers({"s": {"select": {"start": 1, "step": 2}, "ffn": {"hidden_dim": 16}},
                                    "dense": {"select": mlp_only, "ffn": {"hidden_dim": 64}}}, n_layers=n))


def test_memory_plan_counts_each_layer_with_its_own_components():
    from archspec import memory

    spec = load_spec_dict(MIXED)
    m = spec.model
    per_layer = [memory.block_saved_per_token(m, 24, "cpu", False, b) for b in m.blocks()]
    assert len(set(per_layer)) > 1  # the layers differ, and so do their activations
    uniform = load_spec_dict(copy.deepcopy(BASE))
    assert memory.block_saved_per_token(uniform.model, 24, "cpu", False) == memory.block_saved_per_token(
        uniform.model, 24, "cpu", False, uniform.model.blocks()[0])
    assert memory.plan_memory(spec).total > 0


# ── found in review ─────────────────────────────────────────────────────────────────────────────────────────────


def test_rope_needs_one_head_width_across_layers():
    with pytest.raises(UserError) as info:
        load_spec_dict(with_layers({"g": {"select": [1], "attention": {"n_heads": 2}}}))
    assert any(ln.startswith("model.layers: every layer must have one head_dim under rope") for ln in info.value.problems)
    learned = with_layers({"g": {"select": [1], "attention": {"n_heads": 2}}})
    learned["model"]["attention"]["positional"] = {"kind": "learned"}
    load_spec_dict(learned)  # a learned table does not care


def test_a_groups_own_kind_rules_run_at_its_path():
    raw = with_layers({"g": {"select": [1], "ffn": {"kind": "moe", "n_experts": 4, "top_k": 8}}})
    with pytest.raises(UserError) as info:
        load_spec_dict(raw)
    assert any(ln.startswith("model.layers.g.ffn.top_k:") for ln in info.value.problems), info.value.problems


def test_group_merges_onto_what_was_written_not_onto_derived_values():
    a = with_layers({"g": {"select": [1], "attention": {"n_kv_heads": 4}}})
    a["model"]["attention"].update(bias=True, out_bias=False)
    b = with_layers({"g": {"select": [1], "attention": {"n_kv_heads": 4}}})
    b["model"]["attention"].update(qkv_bias=True, out_bias=False)
    sa, sb = load_spec_dict(a), load_spec_dict(b)
    assert [blk.attention.qkv_bias for blk in sa.model.blocks()] == [True] * 4
    assert model_hash(sa) == model_hash(sb)


def test_select_refuses_booleans():
    with pytest.raises(UserError):
        load_spec_dict(with_layers({"g": {"select": [True], "ffn": {"hidden_dim": 8}}}))


def test_rope_buffers_follow_the_layers_head_width(tmp_path):
    raw = with_layers({"all": {"select": {}, "attention": {"n_heads": 2}}})
    spec = load_spec_dict(raw)
    model = generate(spec, out_dir=tmp_path).Model()
    assert account(spec).buffer_elements == sum(b.numel() for b in model.buffers())


def test_layers_with_windows_of_two_sizes_share_one_attention_class_taking_the_pattern(tmp_path):
    """A window that differs by layer is a pattern object per size; the one Attention class takes it (and n_kv_heads)
    as constructor arguments, the module-level patterns named by their layers."""
    spec = load_spec_dict(with_layers({"wide": {"select": [1, 3], "attention": {
        "n_kv_heads": 1, "sparsity": {"kind": "sliding_window", "window": 16}}}},
        n_layers=4, attention={"n_heads": 2, "n_kv_heads": 2, "sparsity": {"kind": "sliding_window", "window": 8}}))
    gen = generate(spec, out_dir=tmp_path)
    assert gen.source.count("class Attention(") == 1 and gen.source.count("class Block(") == 1
    assert "SLIDING_WINDOW_LAYERS_1_3 = SparsePattern(" in gen.source and "WINDOW_LAYERS_1_3 = 16" in gen.source
    model = gen.Model()
    assert [b.attn.sliding_window.reach for b in model.blocks] == [8, 16, 8, 16]
    assert account(spec).total == sum(p.numel() for p in model.parameters())
    T.assert_causal(model, spec.model.vocab_size, 40, position=20)
