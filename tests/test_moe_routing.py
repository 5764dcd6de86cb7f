"""MoE routing variants (issue 25): sigmoid scores, the selection bias (choice only), group-limited top-k and the
routed scaling factor, against transformers' DeepseekV3MoE and a naive per-token reference; bias balancing by hand;
the routing rules; the HF mapping a type uses (DeepSeek-V3's keys)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archspec.codegen import generate
from archspec.kinds.ffn.moe import MoESpec
from archspec.kinds.hf import HFConfig, HFType, HFUnsupported
from archspec.spec import SpecError, model_hash
from tests.tiny import tiny_spec

D = 16


def _spec(ffn: dict, n_layers: int = 1):
    return tiny_spec("moe-r", vocab_size=50, d_model=D, n_layers=n_layers, ffn=ffn)


def _ffn(spec, gen_dir, seed: int = 1):
    ffn = generate(spec, out_dir=gen_dir).Model().blocks[0].ffn
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ffn.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        if hasattr(ffn, "selection_bias"):  # non-zero, and large enough to change choices
            ffn.selection_bias.copy_(torch.randn(ffn.selection_bias.shape, generator=g) * 0.2)
    return ffn


@st.composite
def variants(draw, sigmoid_only: bool = False):
    n_experts = draw(st.sampled_from([4, 6, 8]))
    groups = draw(st.sampled_from([g for g in (1, 2, 4) if n_experts % g == 0 and n_experts // g >= 2]))
    kept = draw(st.integers(1, groups))
    ffn = {"kind": "moe", "n_experts": n_experts, "expert": {"hidden_dim": 8}, "n_shared_experts": 1,
           "score": "sigmoid" if sigmoid_only else draw(st.sampled_from(["softmax", "sigmoid"])),
           "selection_bias": True, "renormalize": draw(st.booleans()),
           "routed_scaling_factor": draw(st.sampled_from([1.0, 2.5, 0.5])),
           "n_group": groups, "topk_group": kept if kept < groups else None,
           "top_k": draw(st.integers(1, kept * (n_experts // groups)))}
    return ffn


# ── against transformers' DeepseekV3MoE ──────────────────────────────────────────────────────────────────────────


def _hf_moe(ffn, u):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    cfg = DeepseekV3Config(hidden_size=D, moe_intermediate_size=u.expert.hidden_dim, n_routed_experts=u.n_experts,
                           num_experts_per_tok=u.top_k, n_group=u.n_group,
                           topk_group=u.n_group if u.topk_group is None else u.topk_group,
                           norm_topk_prob=u.renormalize, routed_scaling_factor=u.routed_scaling_factor,
                           n_shared_experts=u.n_shared_experts, hidden_act=u.expert.activation)
    hf = DeepseekV3MoE(cfg).eval()
    ex = ffn.experts
    with torch.no_grad():
        hf.gate.weight.copy_(ffn.router.weight)
        hf.gate.e_score_correction_bias.copy_(ffn.selection_bias)
        hf.experts.gate_up_proj.copy_(torch.cat([ex.gate_proj, ex.up_proj], dim=1))
        hf.experts.down_proj.copy_(ex.down_proj)
        for p in ("gate", "up", "down"):
            getattr(hf.shared_experts, f"{p}_proj").weight.copy_(getattr(ffn.shared_expert, f"{p}_proj").weight)
    return hf


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ffn=variants(sigmoid_only=True))
def test_sigmoid_bias_group_routing_equals_transformers_deepseek_v3_moe(ffn, gen_dir):
    spec = _spec(ffn)
    u = spec.model.ffn
    ours = _ffn(spec, gen_dir)
    hf = _hf_moe(ours, u)
    x = torch.randn(2, 9, D, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x), rtol=1e-5, atol=1e-5)
        _, hf_gates, hf_experts = hf.gate(x)
        _, _, top_e, gates = ours.route(x.reshape(-1, D))
    # the same experts with the same gates (transformers' top-k is unsorted: compare as sets)
    for n in range(top_e.shape[0]):
        assert dict(zip(top_e[n].tolist(), gates[n].tolist())) == pytest.approx(
            dict(zip(hf_experts[n].tolist(), hf_gates[n].tolist())), rel=1e-5)


# ── against a naive per-token reference (softmax too, which DeepseekV3MoE does not have) ─────────────────────────


def _reference(ffn, u, x):
    """The documented routing, one token at a time in plain Python decisions; gates keep the graph."""
    B, T, _ = x.shape
    xf = x.reshape(-1, D)
    logits = xf @ ffn.router.weight.T
    scores = logits.sigmoid() if u.score == "sigmoid" else logits.softmax(-1)
    bias = ffn.selection_bias.tolist() if u.selection_bias else [0.0] * u.n_experts
    size = u.n_experts // u.n_group
    rows = []
    for n in range(xf.shape[0]):
        c = [float(s) + b for s, b in zip(scores[n].tolist(), bias)]
        allowed = list(range(u.n_experts))
        if u.group_limited:
            group_score = [sum(sorted(c[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(u.n_group)]
            kept = sorted(range(u.n_group), key=lambda g: -group_score[g])[:u.topk_group]
            allowed = [e for e in allowed if e // size in kept]
        top = sorted(allowed, key=lambda e: -c[e])[:u.top_k]
        g = torch.stack([scores[n, e] for e in top])
        if u.renormalize:
            g = g / (g.sum() + (1e-20 if u.score == "sigmoid" else 0.0))
        g = g * u.routed_scaling_factor
        row = torch.zeros(D)
        for gate, e in zip(g, top):
            ex = ffn.experts
            h = F.silu(xf[n] @ ex.gate_proj[e].T) * (xf[n] @ ex.up_proj[e].T)
            row = row + gate * (h @ ex.down_proj[e].T)
        rows.append(row)
    sh = ffn.shared_expert
    shared = sh.down_proj(F.silu(sh.gate_proj(xf)) * sh.up_proj(xf))
    return (torch.stack(rows) + shared).view(B, T, D)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ffn=variants(), bias=st.booleans())
def test_every_routing_variant_equals_the_naive_reference_forward_and_gradients(ffn, bias, gen_dir):
    spec = _spec({**ffn, "selection_bias": bias})
    u = spec.model.ffn
    ours = _ffn(spec, gen_dir)
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(4), requires_grad=True)
    w = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(5))
    params = [x, *ours.parameters()]
    got = ours(x)
    want = _reference(ours, u, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, h in zip(torch.autograd.grad((got * w).sum(), params), torch.autograd.grad((want * w).sum(), params)):
        torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-5)


def test_the_selection_bias_changes_the_choice_not_the_gates(gen_dir):
    """A bias that makes expert 3 win every choice: every token routes to it, with its unbiased sigmoid score as the
    gate (top-1, no renormalisation)."""
    spec = _spec({"kind": "moe", "n_experts": 4, "top_k": 1, "expert": {"hidden_dim": 8}, "score": "sigmoid",
                  "selection_bias": True, "renormalize": False})
    ffn = _ffn(spec, gen_dir)
    with torch.no_grad():
        ffn.selection_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 5.0]))
    x = torch.randn(1, 6, D, generator=torch.Generator().manual_seed(0))
    logits, _, top_e, gates = ffn.route(x.reshape(-1, D))
    assert top_e.flatten().tolist() == [3] * 6
    torch.testing.assert_close(gates.flatten(), logits[:, 3].sigmoid())
    ffn(x)
    assert ffn.router_stats[:4].tolist() == [0.0, 0.0, 0.0, 1.0]


# ── bias balancing by hand ───────────────────────────────────────────────────────────────────────────────────────


def test_bias_update_sums_a_steps_micro_batches_and_moves_by_the_sign(gen_dir):
    rate = 0.125
    spec = _spec({"kind": "moe", "n_experts": 4, "top_k": 1, "expert": {"hidden_dim": 8}, "score": "sigmoid",
                  "selection_bias": True, "bias_update_rate": rate}, n_layers=2)
    model = generate(spec, out_dir=gen_dir).Model()
    ffns = [b.ffn for b in model.blocks]
    g = torch.Generator().manual_seed(0)
    counts = [torch.zeros(4, dtype=torch.long) for _ in ffns]
    for _ in range(3):  # three micro-batches
        model(torch.randint(0, 50, (2, 7), generator=g))
        model.after_micro_batch()
        for c, f in zip(counts, ffns):
            c += f.last_counts
    model.eval()
    model(torch.randint(0, 50, (2, 7), generator=g))  # an eval forward: not counted (no after_micro_batch)
    reduced = []
    model.after_optimizer_step(lambda t: reduced.append(t.clone()) or t * 2)  # as if a second rank had the same
    assert torch.equal(reduced[0], torch.cat(counts))  # one reduction for both layers, int64
    for c, f in zip(counts, ffns):
        total = (2 * c).float()
        assert total.sum() == 2 * 3 * 14
        torch.testing.assert_close(f.selection_bias, rate * torch.sign(total.mean() - total), rtol=0, atol=0)
        assert f.load_counts is None  # the next step starts from zero
    model.after_optimizer_step()  # nothing counted since: nothing moves
    torch.testing.assert_close(ffns[0].selection_bias, rate * torch.sign((2 * counts[0]).float().mean()
                                                                         - 2 * counts[0].float()))


def test_bias_balancing_spreads_a_collapsed_sigmoid_router_without_any_loss(gen_dir):
    """Top-1 of 4, inputs that carry a shared direction giving expert 0 a logit 6 above the others, aux loss 0 and no
    gradient step at all: bias balancing alone (rate 0.02) brings the busiest expert's share down; without it (rate
    0) the router stays collapsed."""
    def busiest(rate: float) -> tuple[float, float]:
        spec = _spec({"kind": "moe", "n_experts": 4, "top_k": 1, "expert": {"hidden_dim": 8}, "score": "sigmoid",
                      "selection_bias": True, "bias_update_rate": rate, "aux_loss_coef": 0.0})
        model = generate(spec, out_dir=gen_dir).Model()
        ffn = model.blocks[0].ffn
        g = torch.Generator().manual_seed(0)
        shared_dir = torch.zeros(D)
        shared_dir[0] = 3.0
        with torch.no_grad():
            ffn.router.weight.copy_(torch.randn(4, D, generator=g) * 0.3)
            ffn.router.weight[:, 0] = torch.tensor([2.0, 0.0, 0.0, 0.0])
        loads = []
        for _ in range(60):
            ffn(torch.randn(4, 16, D, generator=g) * 0.5 + shared_dir)
            loads.append(float(ffn.router_stats[:4].max()))
            if rate:  # rate 0: the model has no balancing hooks
                model.after_micro_batch()
                model.after_optimizer_step()
        return loads[0], max(loads[-10:])

    start, balanced = busiest(0.02)
    _, collapsed = busiest(0.0)
    assert start > 0.95 and collapsed > 0.95
    assert balanced < 0.6


# ── spec rules ───────────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("ffn, message", [
    ({"n_experts": 6, "n_group": 4}, "model.ffn.n_group: must divide n_experts (6), got 4"),
    ({"n_experts": 8, "n_group": 4, "topk_group": 5}, "model.ffn.topk_group: must be at most n_group (4), got 5"),
    ({"n_experts": 8, "n_group": 4, "topk_group": 1, "top_k": 3},
     "model.ffn.top_k: must be at most topk_group · n_experts / n_group (2"),
    ({"bias_update_rate": 0.001}, "model.ffn.bias_update_rate: needs selection_bias: true"),
    ({"bias_update_rate": -0.1, "selection_bias": True}, "model.ffn.bias_update_rate: "),
    ({"score": "tanh"}, "model.ffn.score: "),
    ({"routed_scaling_factor": 0}, "model.ffn.routed_scaling_factor: "),
    ({"n_group": 0}, "model.ffn.n_group: "),
])
def test_bad_routing_fields_are_refused_at_their_path(ffn, message):
    with pytest.raises(SpecError) as exc:
        _spec({"kind": "moe", "expert": {"hidden_dim": 8}, **ffn})
    assert any(p.startswith(message) for p in exc.value.problems), exc.value.problems


def test_routing_fields_at_their_defaults_keep_the_model_hash_and_the_generated_router():
    plain = _spec({"kind": "moe", "expert": {"hidden_dim": 8}})
    written = _spec({"kind": "moe", "expert": {"hidden_dim": 8}, "score": "softmax", "selection_bias": False,
                     "bias_update_rate": 0.0, "n_group": 1, "topk_group": None, "routed_scaling_factor": 1.0})
    assert model_hash(plain) == model_hash(written)
    assert model_hash(_spec({"kind": "moe", "expert": {"hidden_dim": 8}, "score": "sigmoid"})) != model_hash(plain)
    # every group kept is no limit: the plain router's code
    assert _spec({"kind": "moe", "expert": {"hidden_dim": 8}, "n_group": 2, "topk_group": 2}).model.ffn.plain_router


# ── metrics ──────────────────────────────────────────────────────────────────────────────────────────────────────


def test_the_bias_spread_reaches_the_metrics(gen_dir):
    spec = _spec({"kind": "moe", "n_experts": 4, "top_k": 2, "expert": {"hidden_dim": 8}, "selection_bias": True})
    model = generate(spec, out_dir=gen_dir).Model()
    with torch.no_grad():
        model.blocks[0].ffn.selection_bias.copy_(torch.tensor([0.1, -0.2, 0.0, 0.05]))
        model(torch.randint(0, 50, (1, 5)))
    m = MoESpec.eval_metrics(MoESpec.eval_stats(model))
    assert m["moe.layer0.bias_spread"] == pytest.approx(0.3) and m["moe.bias_spread"] == pytest.approx(0.3)
    assert MoESpec.in_summary("moe.bias_spread") and not MoESpec.in_summary("moe.layer0.bias_spread")


# ── the HF mapping a type uses (DeepSeek-V3's keys, as archspec.hf.types writes them) ────────────────────────────

DEEPSEEK_LIKE = HFType(
    model_type="deepseek_v3_test", architecture="DeepseekV3ForCausalLM", blocks={"ffn": "sparse_moe"},
    keys={"n_experts": "n_routed_experts", "top_k": "num_experts_per_tok", "expert_hidden": "moe_intermediate_size",
          "activation": "hidden_act", "n_shared_experts": "n_shared_experts", "scoring_func": "scoring_func",
          "topk_method": "topk_method", "n_group": "n_group", "topk_group": "topk_group",
          "routed_scaling_factor": "routed_scaling_factor"},
    defaults={"hidden_act": "silu", "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
              "norm_topk_prob": True, "n_shared_experts": 1},
    names={"router": "gate", "shared_expert": "shared_experts"},
    facts={"renormalize": "norm_topk_prob", "sigmoid_scores": True, "selection_bias": True},
)
V3_CONFIG = {"n_routed_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 8, "n_shared_experts": 2,
             "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 4, "topk_group": 2,
             "routed_scaling_factor": 2.5, "norm_topk_prob": True, "hidden_act": "silu"}


def test_a_deepseek_v3_config_maps_to_the_routing_fields_and_back():
    cfg = HFConfig(V3_CONFIG, DEEPSEEK_LIKE, "config.json")
    fields = MoESpec.from_hf(cfg)
    assert cfg.taken >= set(V3_CONFIG)  # every key read
    assert fields == {"kind": "moe", "n_experts": 16, "top_k": 4, "expert": {"kind": "glu", "hidden_dim": 8,
                      "activation": "silu", "bias": False}, "renormalize": True, "aux_loss_coef": 0.0,
                      "n_shared_experts": 2, "score": "sigmoid", "selection_bias": True, "n_group": 4,
                      "topk_group": 2, "routed_scaling_factor": 2.5}
    spec = _spec(fields)
    u = spec.model.ffn
    assert u.shared_hidden_dim == 16  # n_shared_experts · moe_intermediate_size, as DeepseekV3MoE
    out: dict = {}
    u.to_hf(spec.model, out, DEEPSEEK_LIKE, ("model", "ffn"))
    assert out == V3_CONFIG
    names = {w.our_names[0]: w.hf for w in u.hf_weights(spec.model, DEEPSEEK_LIKE)}
    assert names["selection_bias"] == ("gate.e_score_correction_bias",)
    assert names["shared_expert.gate_proj.weight"] == ("shared_experts.gate_proj.weight",)
    assert names["experts.gate_proj"][3] == "experts.3.gate_proj.weight"


@pytest.mark.parametrize("change, key", [({"scoring_func": "softmax"}, "scoring_func"),
                                         ({"topk_method": "greedy"}, "topk_method"),
                                         ({"n_group": 3}, "n_group"), ({"topk_group": 5}, "topk_group")])
def test_deepseek_v3_configs_it_cannot_compute_are_refused_by_key(change, key):
    with pytest.raises(HFUnsupported, match=f"config.json: {key}: "):
        MoESpec.from_hf(HFConfig({**V3_CONFIG, **change}, DEEPSEEK_LIKE, "config.json"))


@pytest.mark.parametrize("ffn, field", [({"score": "softmax"}, "score"), ({"selection_bias": False}, "selection_bias"),
                                        ({"shared_hidden_dim": 24}, "shared_hidden_dim")])
def test_what_deepseek_v3_cannot_say_is_refused_on_export_by_field(ffn, field):
    cfg = HFConfig(V3_CONFIG, DEEPSEEK_LIKE, "config.json")
    spec = _spec({**MoESpec.from_hf(cfg), **ffn})
    with pytest.raises(HFUnsupported, match=f"model.ffn.{field}: "):
        spec.model.ffn.to_hf(spec.model, {}, DEEPSEEK_LIKE, ("model", "ffn"))


@pytest.mark.parametrize("ffn, field", [({"aux_loss_coef": 0.01}, "aux_loss_coef"),
                                        ({"bias_update_rate": 0.001}, "bias_update_rate")])
def test_training_settings_deepseek_v3_has_no_key_for_are_left_out_with_a_note(ffn, field):
    """They change how the model is trained, not what it computes: exported without them, and said."""
    from archspec.errors import Caution

    cfg = HFConfig(V3_CONFIG, DEEPSEEK_LIKE, "config.json")
    spec = _spec({**MoESpec.from_hf(cfg), **ffn})
    with pytest.warns(Caution, match=f"model.ffn.{field}: .* left out"):
        spec.model.ffn.to_hf(spec.model, {}, DEEPSEEK_LIKE, ("model", "ffn"))


@pytest.mark.parametrize("ffn, field", [({"score": "sigmoid"}, "score"), ({"selection_bias": True}, "selection_bias"),
                                        ({"n_experts": 8, "n_group": 4, "topk_group": 2}, "topk_group"),
                                        ({"routed_scaling_factor": 2.0}, "routed_scaling_factor")])
def test_mixtral_refuses_the_routing_variants_on_export(ffn, field):
    from archspec.hf.types import MIXTRAL

    spec = _spec({"kind": "moe", "expert": {"hidden_dim": 8}, "aux_loss_coef": 0.02, **ffn})
    with pytest.raises(HFUnsupported, match=f"model.ffn.{field}: "):
        spec.model.ffn.to_hf(spec.model, {}, MIXTRAL, ("model", "ffn"))


# ── per-layer groups: fields added later survive the canonical form ──────────────────────────────────────────────


@pytest.mark.parametrize("wide_score, group_score", [("softmax", "sigmoid"), ("sigmoid", "softmax")])
@pytest.mark.parametrize("select", [[0], [0, 1]])
def test_a_layer_groups_routing_fields_survive_the_canonical_form(wide_score, group_score, select):
    """The canonical form leaves a field added later (Since) out at its default, but a group is laid over the
    model-wide component: where that one holds another value, the group keeps its own written out. With the group
    on most layers, the canonical model-wide FFN is the group's (not the spec's `ffn`), and keeps its fields too."""
    from archspec.spec import canonical_dict, load_spec_dict

    raw = {"name": "g", "model": {"vocab_size": 50, "d_model": 16, "n_layers": 3, "attention": {"n_heads": 2},
                                  "ffn": {"kind": "moe", "n_experts": 4, "expert": {"hidden_dim": 8},
                                          "score": wide_score},
                                  "layers": {"a": {"select": select, "ffn": {"kind": "moe", "n_experts": 2,
                                                                             "top_k": 1, "score": group_score}}}}}
    spec = load_spec_dict(raw)
    again = load_spec_dict(canonical_dict(spec))
    want = [group_score if i in select else wide_score for i in range(3)]
    assert [b.ffn.score for b in spec.model.blocks()] == [b.ffn.score for b in again.model.blocks()] == want
    assert model_hash(again) == model_hash(spec)


@pytest.mark.slow
def test_the_deepseek_v3_router_compiles_fullgraph(gen_dir):
    """Sigmoid scores, the selection bias, group-limited top-k, scaling, and the bias balancing's count: one graph,
    the eager result and gradients."""
    spec = _spec({"kind": "moe", "n_experts": 8, "top_k": 2, "expert": {"hidden_dim": 16}, "n_shared_experts": 1,
                  "score": "sigmoid", "selection_bias": True, "bias_update_rate": 0.01, "n_group": 4,
                  "topk_group": 2, "routed_scaling_factor": 2.5})
    ffn = _ffn(spec, gen_dir)
    x = torch.randn(2, 8, D, generator=torch.Generator().manual_seed(0), requires_grad=True)
    inputs = [x, *ffn.parameters()]
    want = ffn(x)
    want_counts = ffn.last_counts.clone()
    want_grads = torch.autograd.grad(want.square().sum(), inputs)
    torch.compiler.reset()
    got = torch.compile(ffn, fullgraph=True)(x)
    got_grads = torch.autograd.grad(got.square().sum(), inputs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(ffn.last_counts, want_counts)
    for g, h in zip(got_grads, want_grads):
        torch.testing.assert_close(g, h, rtol=1e-5, atol=1e-5)


def test_with_a_capacity_the_bias_counts_the_routers_choices_before_drops(gen_dir):
    """Bias balancing beside a capacity factor: the loads it moves by are the assignments chosen (what the bias
    steers), dropped ones included, so they do not depend on how the step is cut into micro-batches."""
    spec = _spec({"kind": "moe", "n_experts": 4, "top_k": 2, "expert": {"hidden_dim": 8}, "capacity_factor": 0.5,
                  "selection_bias": True, "bias_update_rate": 0.01})
    ffn = _ffn(spec, gen_dir)
    x = torch.randn(2, 7, D, generator=torch.Generator().manual_seed(0))
    ffn(x)
    assert float(ffn.router_stats[-3]) > 0  # some assignments dropped
    assert int(ffn.last_counts.sum()) == 2 * 7 * 2  # every choice counted
    torch.testing.assert_close(ffn.last_counts.float() / 28, ffn.router_stats[:4])
