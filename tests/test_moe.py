"""The MoE FFN kind (archspec/kinds/ffn/moe.py): dispatch against a naive per-token reference, the dense limit, exact
drops, the auxiliary losses by hand, load balancing that works, FLOPs against FlopCounterMode, spec problems."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from archspec import testing as T
from archspec.ablate.sweep import load_sweep
from archspec.accounting import account
from archspec.codegen import generate
from archspec.errors import UserError
from archspec.spec import SpecError
from tests.tiny import tiny_spec

ACTS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


def _spec(ffn: dict, d_model: int = 16, n_layers: int = 1, **model):
    return tiny_spec("moe-t", vocab_size=50, d_model=d_model, n_layers=n_layers, ffn=ffn, **model)


def _ffn(spec, gen_dir, seed: int = 0):
    torch.manual_seed(seed)
    return generate(spec, out_dir=gen_dir).Model().blocks[0].ffn


def _randomise(module, seed: int = 1):
    """Non-zero biases too, so that a bias handled wrongly shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)


# ── the naive per-token reference: the documented semantics, one token and one expert at a time ──────────────────


def _expert(ffn, u, e: int, x: torch.Tensor) -> torch.Tensor:
    act, ex = ACTS[u.expert.activation], ffn.experts
    bias = u.expert.bias
    up = x @ ex.up_proj[e].T + (ex.up_bias[e] if bias else 0)
    if u.expert.kind == "glu":
        h = act(x @ ex.gate_proj[e].T + (ex.gate_bias[e] if bias else 0)) * up
    else:
        h = act(up)
    return h @ ex.down_proj[e].T + (ex.down_bias[e] if bias else 0)


def _shared(ffn, u, x: torch.Tensor) -> torch.Tensor:
    act, sh = ACTS[u.expert.activation], ffn.shared_expert
    h = act(sh.gate_proj(x)) * sh.up_proj(x) if u.expert.kind == "glu" else act(sh.up_proj(x))
    y = sh.down_proj(h)
    return torch.sigmoid(ffn.shared_expert_gate(x)) * y if u.shared_gate else y


def kept_assignments(u, probs: torch.Tensor, B: int, T_: int) -> tuple[list, set]:
    """[(token, choice, expert, gate)] and the set of (token, choice) an expert keeps, by plain Python."""
    N, E = probs.shape
    K = u.top_k
    chosen = []
    for n in range(N):
        p = probs[n].tolist()
        top = sorted(range(E), key=lambda e: -p[e])[:K]
        denom = sum(probs[n, e] for e in top) if u.renormalize else 1.0
        chosen += [(n, k, e, probs[n, e] / denom) for k, e in enumerate(top)]
    if u.capacity_factor is None:
        return chosen, {(n, k) for n, k, _, _ in chosen}
    cap = math.ceil(u.capacity_factor * N * K / E)
    kept = set()
    for e in range(E):
        mine = [(n, k) for n, k, ee, _ in chosen if ee == e]
        position = lambda nk: (nk[0] % T_, nk[0] // T_, nk[1])  # (t, b, choice)  # noqa: E731
        if u.drop_policy == "position":
            mine.sort(key=position)
        else:
            mine.sort(key=lambda nk: (-float(probs[nk[0], e].detach()), position(nk)))
        kept |= set(mine[:cap])
    return chosen, kept


def reference(ffn, u, x: torch.Tensor) -> torch.Tensor:
    B, T_, D = x.shape
    xf = x.reshape(B * T_, D)
    probs = (xf @ ffn.router.weight.T).softmax(-1)
    chosen, kept = kept_assignments(u, probs, B, T_)  # decisions on plain floats, gates keep the graph
    rows = [torch.zeros(D) for _ in range(B * T_)]
    for n, k, e, gate in chosen:
        if (n, k) in kept:
            rows[n] = rows[n] + gate * _expert(ffn, u, e, xf[n])
    out = torch.stack(rows)
    if u.n_shared_experts:
        out = out + _shared(ffn, u, xf)
    return out.view(B, T_, D)


CASES = {
    "dropless-glu-shared-gate": {"kind": "moe", "n_experts": 4, "top_k": 2, "expert": {"hidden_dim": 12},
                                 "n_shared_experts": 1, "shared_gate": True},
    "dropless-mlp-bias-raw": {"kind": "moe", "n_experts": 3, "top_k": 2, "renormalize": False,
                              "expert": {"kind": "mlp", "hidden_dim": 10, "bias": True}},
    # sizes that are multiples of 8: the grouped_mm path (the two above take the padded fallback)
    "grouped-glu-shared": {"kind": "moe", "n_experts": 4, "top_k": 2, "expert": {"hidden_dim": 16},
                           "n_shared_experts": 1},
    "grouped-mlp-bias-raw": {"kind": "moe", "n_experts": 5, "top_k": 3, "renormalize": False,
                             "expert": {"kind": "mlp", "hidden_dim": 8, "bias": True}},
    "position-forced-drops": {"kind": "moe", "n_experts": 4, "top_k": 2, "expert": {"hidden_dim": 12},
                              "capacity_factor": 0.5, "drop_policy": "position", "n_shared_experts": 2},
    "probs-forced-drops": {"kind": "moe", "n_experts": 4, "top_k": 2, "expert": {"kind": "mlp", "hidden_dim": 12,
                                                                                 "bias": True},
                           "capacity_factor": 0.5, "drop_policy": "probs"},
    "probs-top1": {"kind": "moe", "n_experts": 5, "top_k": 1, "expert": {"hidden_dim": 8}, "capacity_factor": 1.0,
                   "drop_policy": "probs"},
}


@pytest.mark.parametrize("name", CASES)
def test_dispatch_equals_the_naive_reference_forward_and_gradients(name, gen_dir):
    spec = _spec(CASES[name])
    u = spec.model.ffn
    ffn = _ffn(spec, gen_dir)
    _randomise(ffn)
    x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(2), requires_grad=True)
    w = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(3))

    got = ffn(x)
    dropped = float(ffn.router_stats[-3])
    params = [x, *ffn.parameters()]
    got_grads = torch.autograd.grad((got * w).sum(), params)
    want = reference(ffn, u, x)
    want_grads = torch.autograd.grad((want * w).sum(), params)

    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for (pname, _), g, h in zip([("x", x), *ffn.named_parameters()], got_grads, want_grads):
        torch.testing.assert_close(g, h, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: grad of {pname}: {m}")
    names = ["x"] + [n for n, _ in ffn.named_parameters()]
    assert got_grads[names.index("router.weight")].abs().sum() > 0  # the router learns through the gates
    if u.capacity_factor == 0.5:
        assert dropped >= 1 - 4 * math.ceil(0.5 * 21 * 2 / 4) / 42 - 1e-6  # 24 slots for 42 assignments
    elif u.capacity_factor is None:
        assert dropped == 0.0
    padding = float(ffn.router_stats[-1])  # rows the experts computed ÷ assignments
    if u.grouped(spec.model):
        assert padding == 1.0  # the grouped path computes exactly the assignments
    elif u.capacity_factor is None:
        assert padding > 1.0  # the dropless padded fallback: these routings fill no buffer evenly
    assert name.startswith("grouped") == u.grouped(spec.model)  # each path is covered


@pytest.mark.parametrize("policy, dropped_token", [("position", 2), ("probs", 0)])
def test_exactly_the_expected_assignments_are_dropped(policy, dropped_token, gen_dir):
    """4 tokens, 2 experts, top-1, capacity ceil(1.0 · 4 · 1 / 2) = 2. Tokens 0, 1, 2 choose expert 0 with router
    logits 1, 3, 2; token 3 chooses expert 1. `position` drops the third (token 2), `probs` the least sure (token 0)."""
    spec = _spec({"kind": "moe", "n_experts": 2, "top_k": 1, "expert": {"hidden_dim": 4}, "capacity_factor": 1.0,
                  "drop_policy": policy}, d_model=4)
    ffn = _ffn(spec, gen_dir)
    _randomise(ffn)
    with torch.no_grad():
        ffn.router.weight.copy_(torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0]]))
    x = torch.tensor([[[1.0, 0, 0.5, 0.5], [3.0, 0, 0.5, -0.5], [2.0, 0, -0.5, 0.5], [0, 2.0, 0.5, 0.5]]])
    out = ffn(x)[0]
    for t in range(4):
        if t == dropped_token:
            assert torch.equal(out[t], torch.zeros(4)), (policy, t)
        else:
            assert out[t].abs().sum() > 0, (policy, t)
    assert float(ffn.router_stats[-3]) == pytest.approx(0.25)  # one of four assignments dropped
    assert ffn.router_stats[:2].tolist() == [0.75, 0.25]  # loads are counted before drops


def test_top_k_equal_to_n_experts_with_identical_experts_is_the_dense_ffn(gen_dir):
    dense_spec = _spec({"kind": "glu", "hidden_dim": 12, "bias": True})
    dense = _ffn(dense_spec, gen_dir)
    _randomise(dense)
    moe_spec = _spec({"kind": "moe", "n_experts": 4, "top_k": 4, "expert": {"kind": "glu", "hidden_dim": 12,
                                                                             "bias": True}})
    moe = _ffn(moe_spec, gen_dir)
    _randomise(moe, seed=5)  # the router stays random: any gates summing to 1 must give the dense output
    with torch.no_grad():
        for name in ("gate", "up", "down"):
            getattr(moe.experts, f"{name}_proj").copy_(getattr(dense, f"{name}_proj").weight.expand_as(
                getattr(moe.experts, f"{name}_proj")))
            getattr(moe.experts, f"{name}_bias").copy_(getattr(dense, f"{name}_proj").bias.expand_as(
                getattr(moe.experts, f"{name}_bias")))
    x = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(moe(x), dense(x), rtol=1e-5, atol=1e-6)


def test_aux_and_z_losses_equal_the_formulas_on_a_hand_computed_example(gen_dir):
    """2 experts, top-1, 2 tokens with router logits (ln 3, 0) and (ln 1.5, 0): p = (3/4, 1/4) and (3/5, 2/5).
    Both pick expert 0: f = (1, 0), P = (27/40, 13/40), so L_aux = α · 2 · 27/40; z = mean(ln(4)², ln(2.5)²)."""
    alpha, beta = 0.3, 0.02
    spec = _spec({"kind": "moe", "n_experts": 2, "top_k": 1, "expert": {"hidden_dim": 4}, "aux_loss_coef": alpha,
                  "z_loss_coef": beta}, d_model=4, n_layers=2)
    torch.manual_seed(0)
    model = generate(spec, out_dir=gen_dir).Model()
    ffn = model.blocks[0].ffn
    with torch.no_grad():
        ffn.router.weight.copy_(torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 0]]))
    ffn(torch.tensor([[[math.log(3), 1.0, 2.0, 3.0], [math.log(1.5), -1.0, 0.0, 1.0]]]))
    aux, z = ffn.router_losses.tolist()
    assert aux == pytest.approx(alpha * 2 * 27 / 40, rel=1e-6)
    assert z == pytest.approx(beta * (math.log(4) ** 2 + math.log(2.5) ** 2) / 2, rel=1e-6)
    # the model averages over its MoE layers
    model.blocks[1].ffn(torch.randn(1, 5, 4))
    other = model.blocks[1].ffn.router_losses
    losses = model.auxiliary_losses()
    assert losses["moe_aux"].item() == pytest.approx((aux + other[0].item()) / 2, rel=1e-6)
    assert losses["moe_z"].item() == pytest.approx((z + other[1].item()) / 2, rel=1e-6)


def _train_from_biased_router(alpha: float, gen_dir) -> tuple[float, float]:
    """Top-1 of 4 experts, a router biased to expert 0 (every input carries a shared direction the router reads),
    trained 60 AdamW steps on a regression task plus the auxiliary loss. Returns max load before and after."""
    spec = _spec({"kind": "moe", "n_experts": 4, "top_k": 1, "renormalize": False, "expert": {"hidden_dim": 16},
                  "aux_loss_coef": alpha}, d_model=16)
    ffn = _ffn(spec, gen_dir)
    g = torch.Generator().manual_seed(0)
    bias_dir = torch.zeros(16)
    bias_dir[0] = 3.0
    with torch.no_grad():
        ffn.router.weight[0, 0] = 2.0  # expert 0's logit is 6 above the others' for every input
    target = torch.randn(16, 16, generator=g) * 0.1
    opt = torch.optim.AdamW(ffn.parameters(), lr=3e-2)
    loads = []
    for _ in range(60):
        x = torch.randn(4, 16, 16, generator=g) * 0.5 + bias_dir
        y = ffn(x)
        loss = F.mse_loss(y, x @ target) + ffn.router_losses.sum()
        loads.append(float(ffn.router_stats[:4].max()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loads[0], loads[-1]


def test_the_load_balancing_loss_spreads_a_collapsed_router(gen_dir):
    start, balanced = _train_from_biased_router(1.0, gen_dir)
    _, collapsed = _train_from_biased_router(0.0, gen_dir)
    assert start > 0.95  # it starts collapsed onto expert 0
    assert balanced < 0.5  # with α > 0 the busiest expert's share falls (1/4 is perfect balance)
    assert collapsed > 0.9  # without it, it stays collapsed


# ── FLOPs and parameters ─────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("name", ["dropless-glu-shared-gate", "dropless-mlp-bias-raw", "position-forced-drops",
                                  "grouped-glu-shared", "grouped-mlp-bias-raw"])
def test_flops_equal_the_counter_on_the_naive_reference(name, gen_dir):
    """FlopCounterMode counts the per-token reference's matmuls: the useful work, which `flops()` claims. On the
    padded batched path the experts' count is `padding` times that (what the docs say is not counted); the grouped
    path's ops carry their own FLOP formula (padding 1)."""
    spec = _spec({**CASES[name], "capacity_factor": None})
    u = spec.model.ffn
    ffn = _ffn(spec, gen_dir)
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(0))
    N = 12
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        reference(ffn, u, x)
    assert counter.get_total_flops() == N * u.flops(16)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        ffn(x)
    padding = float(ffn.router_stats[-1])
    expert_flops = u.top_k * u.expert.flops(16)
    assert counter.get_total_flops() == pytest.approx(N * (u.flops(16) - expert_flops + padding * expert_flops))


def test_active_params_count_top_k_of_the_routed_experts(gen_dir):
    spec = _spec({"kind": "moe", "n_experts": 6, "top_k": 2, "expert": {"kind": "mlp", "hidden_dim": 10},
                  "n_shared_experts": 2, "shared_gate": True}, n_layers=2)
    model = generate(spec, out_dir=gen_dir).Model()
    acc = account(spec)
    routed = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert acc.total == sum(p.numel() for p in model.parameters())
    assert acc.active == acc.total - routed * 4 // 6 == T.module_active_params(model)
    u = spec.model.ffn
    assert u.shared_hidden_dim == 20  # 2 shared experts of the expert's hidden size, as one FFN


def test_mixtral_like_preset_accounting():
    from archspec.spec import load_spec

    spec = load_spec("specs/mixtral-like.yaml")
    acc, d = account(spec), 512
    expert = 3 * d * 1376
    assert acc.total - acc.active == 8 * 6 * expert  # 6 of 8 experts idle per token, in each of 8 layers
    assert acc.flops_by_component["ffn"] == 8 * (2 * d * 8 + 2 * 2 * expert)


# ── causality ────────────────────────────────────────────────────────────────────────────────────────────────────


def test_position_drops_stay_causal_and_probability_drops_do_not(gen_dir):
    base = {"kind": "moe", "n_experts": 4, "top_k": 2, "expert": {"hidden_dim": 8}, "capacity_factor": 0.5}
    for policy in ("position", "probs"):
        spec = _spec({**base, "drop_policy": policy}, n_layers=2)
        assert spec.model.ffn.causal == (policy == "position")
        model = generate(spec, out_dir=gen_dir).Model()
        _randomise(model, seed=7)
        leaks = 0
        for t in range(0, 16, 3):
            try:
                T.assert_causal(model, 50, 16, t, batch=3)
            except AssertionError as e:
                assert "not causal" in str(e)
                leaks += 1
        assert (leaks == 0) if policy == "position" else (leaks > 0), policy


# ── spec problems ────────────────────────────────────────────────────────────────────────────────────────────────


def _problems(ffn: dict) -> list[str]:
    with pytest.raises(SpecError) as exc:
        _spec(ffn)
    return exc.value.problems


@pytest.mark.parametrize("ffn, path", [
    ({"n_experts": 4, "top_k": 5}, "model.ffn.top_k: must be at most n_experts (4), got 5"),
    ({"n_experts": 1, "top_k": 1}, "model.ffn.n_experts: "),
    ({"capacity_factor": 0}, "model.ffn.capacity_factor: "),
    ({"capacity_factor": -1.5}, "model.ffn.capacity_factor: "),
    ({"top_k": 0}, "model.ffn.top_k: "),
    ({"shared_gate": True}, "model.ffn.shared_gate: needs n_shared_experts >= 1"),
    ({"shared_hidden_dim": 8}, "model.ffn.shared_hidden_dim: needs n_shared_experts >= 1"),
    ({"drop_policy": "random"}, "model.ffn.drop_policy: "),
    ({"expert": {"kind": "moe"}}, "model.ffn.expert"),
    ({"expert": {"kind": "glu", "hidden_dim": 0}}, "model.ffn.expert.hidden_dim: "),
])
def test_bad_moe_fields_are_refused_at_their_path(ffn, path):
    problems = _problems({"kind": "moe", "expert": {"hidden_dim": 8}, **ffn})
    assert any(p.startswith(path) for p in problems), problems


def test_a_sweep_over_n_experts_validates_every_variant_before_training(tmp_path):
    with pytest.raises(UserError) as exc:
        load_sweep(data={"name": "s", "base": {"name": "b", "model": {"vocab_size": 50, "context_length": 16,
                                                                      "d_model": 16, "n_layers": 1,
                                                                      "attention": {"n_heads": 2},
                                                                      "ffn": {"kind": "moe", "top_k": 2}}},
                         "budget": {"steps": 2}, "grid": {"model.ffn.n_experts": [4, 1, 2]}})
    text = exc.value.render()
    assert "nothing was trained" in text and "variant 1" in text and "model.ffn.n_experts" in text
    assert "variant 0" not in text and "variant 2" not in text


# ── compile ──────────────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.slow
@pytest.mark.parametrize("case, capacity", [("grouped-glu-shared", None), ("dropless-glu-shared-gate", None),
                                            ("dropless-glu-shared-gate", 1.0)])
def test_the_moe_block_compiles_fullgraph(case, capacity, gen_dir):
    """Grouped (fp32 grouped_mm through archspec's op), padded dropless, and capacity: each one graph."""
    spec = _spec({**CASES[case], "capacity_factor": capacity})
    ffn = _ffn(spec, gen_dir)
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0), requires_grad=True)
    inputs = [x, *ffn.parameters()]
    want = ffn(x)
    want_grads = torch.autograd.grad(want.square().sum(), inputs)
    torch.compiler.reset()
    compiled = torch.compile(ffn, fullgraph=True)
    got = compiled(x)
    got_grads = torch.autograd.grad(got.square().sum(), inputs)
    if case.startswith("grouped"):
        assert float(ffn.router_stats[-1]) == 1.0  # the compiled block took the grouped path
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, h in zip(got_grads, want_grads):  # the input's and every weight's (the experts': grouped_mm_wgrad)
        torch.testing.assert_close(g, h, rtol=1e-5, atol=1e-5)


# ── no host sync in the dispatch ────────────────────────────────────────────────────────────────────────────────

# Beyond CASES: DeepSeek-V3's routing (sigmoid scores, selection bias and its balancing counts, groups, scaling) and
# gpt-oss's (router bias, clamped SwiGLU experts with biases), both on the grouped path.
SYNC_CASES = {
    **CASES,
    "grouped-deepseek-v3": {"kind": "moe", "n_experts": 8, "top_k": 2, "expert": {"hidden_dim": 8}, "score": "sigmoid",
                            "selection_bias": True, "bias_update_rate": 0.01, "n_group": 4, "topk_group": 2,
                            "routed_scaling_factor": 2.5, "n_shared_experts": 1},
    "grouped-gpt-oss": {"kind": "moe", "n_experts": 4, "top_k": 2, "router_bias": True, "clamped_swiglu": {},
                        "expert": {"kind": "glu", "hidden_dim": 8, "bias": True}},
}


def _data_dependent_nodes(module, x) -> list[str]:
    """Dynamo's one graph of module(x) (fullgraph, static shapes, traced only: nothing compiled) → its nodes whose
    size or value comes from tensor data: a `.item()` / `.tolist()`, or a tensor or integer the trace could only
    leave symbolic (torch.bincount's length, a buffer sized by a count). On a GPU each is a device→host copy that
    stalls the stream and that CUDA graphs cannot capture."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.compiler.reset()
    torch.compile(module, fullgraph=True, dynamic=False, backend=record)(x)
    assert len(graphs) == 1
    out = []
    for node in graphs[0].graph.nodes:
        value = node.meta.get("example_value")
        sizes = list(value.shape) if isinstance(value, torch.Tensor) else [value]
        if node.target in ("item", "tolist") or any(isinstance(s, torch.SymInt) for s in sizes):
            out.append(f"{node.target} → {value.shape if isinstance(value, torch.Tensor) else value}")
    return out


@pytest.mark.parametrize("name", [n for n in SYNC_CASES if n.startswith(("grouped", "position", "probs"))])
def test_grouped_and_capacity_dispatch_never_read_the_device(name, gen_dir):
    """The grouped (dropless) and capacity dispatches, forward in training mode: every size is known before the data
    (counts on the device, offsets on the device, capacity from the token count), so the traced graph is static."""
    spec = _spec(SYNC_CASES[name])
    u = spec.model.ffn
    assert u.grouped(spec.model) or u.capacity_factor is not None
    ffn = _ffn(spec, gen_dir)
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0))
    assert _data_dependent_nodes(ffn, x) == []
    if u.grouped(spec.model):
        assert float(ffn.router_stats[-1]) == 1.0  # the traced forward took the grouped path


def test_the_dropless_padded_fallback_sizes_its_buffer_on_the_host(gen_dir):
    """What the check above would catch (and the one host read left, documented in the generated docstring): the
    dropless padded fallback (sizes not multiples of 8) sizes its buffer by the busiest expert's count."""
    spec = _spec(CASES["dropless-glu-shared-gate"])
    assert not spec.model.ffn.grouped(spec.model)
    found = _data_dependent_nodes(_ffn(spec, gen_dir), torch.randn(2, 8, 16))
    assert any(entry.startswith("item") for entry in found), found


@pytest.mark.parametrize("name", ["grouped-glu-shared", "grouped-mlp-bias-raw", "grouped-deepseek-v3",
                                  "position-forced-drops", "probs-forced-drops", "dropless-glu-shared-gate"])
def test_device_counting_computes_what_the_bincount_dispatch_did_bit_for_bit(name, gen_dir):
    """The previous dispatch counted each expert's assignments with torch.bincount (a host read on a GPU); the same
    generated file with that line put back gives the same output, router losses and gradients, bit for bit."""
    from archspec.codegen import import_source

    spec = _spec(SYNC_CASES[name])
    gen = generate(spec, out_dir=gen_dir)
    line = next(ln for ln in gen.source.splitlines() if "scatter_add_(0, flat_e" in ln)
    before = gen.source.replace(line, "        counts = torch.bincount(flat_e, minlength=MOE_N_EXPERTS)")
    assert before != gen.source
    x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(2), requires_grad=True)
    results = []
    for module in (gen.module, import_source(gen_dir / "moe-t-bincount.py", before)):
        torch.manual_seed(0)
        ffn = module.Model().blocks[0].ffn
        _randomise(ffn)
        out = ffn(x)
        loss = (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum() + ffn.router_losses.sum()
        results.append((out, ffn.router_stats, torch.autograd.grad(loss, [x, *ffn.parameters()])))
    (out, stats, grads), (out_before, stats_before, grads_before) = results
    assert torch.equal(out, out_before) and torch.equal(stats, stats_before)
    assert all(torch.equal(g, h) for g, h in zip(grads, grads_before))


# ── the grouped GEMM ops and the fallback ───────────────────────────────────────────────────────────────────────


def test_grouped_mm_ops_pass_opcheck_and_give_empty_experts_zero_gradient(gen_dir):
    """The custom ops' schema, shape function and autograd (torch.library.opcheck), and an expert that receives no
    row: its weight gradient is exactly zero, every other slice equals its own matmul."""
    from archspec.runtime import grouped_mm

    generate(_spec(CASES["grouped-glu-shared"]), out_dir=gen_dir)
    op = torch.ops.archspec.grouped_mm_v1.default
    g = torch.Generator().manual_seed(0)
    counts = torch.tensor([3, 0, 5, 0])
    offs = counts.cumsum(0).to(torch.int32)
    a = torch.randn(8, 16, generator=g, requires_grad=True)
    w = torch.randn(4, 24, 16, generator=g, requires_grad=True)  # (E, out, in), as the experts store it
    torch.library.opcheck(op, (a, w.transpose(-2, -1), offs))
    torch.library.opcheck(torch.ops.archspec.grouped_mm_wgrad_v1.default, (a.detach().t(), torch.randn(8, 24), offs))
    y = grouped_mm(a, w.transpose(-2, -1), offs)
    gy = torch.randn(8, 24, generator=g)
    ga, gw = torch.autograd.grad(y, (a, w), gy)
    want = torch.cat([a[0:3] @ w[0].T, a[3:8] @ w[2].T])
    wa, ww = torch.autograd.grad(want, (a, w), gy)
    torch.testing.assert_close(y, want)
    torch.testing.assert_close(ga, wa)
    torch.testing.assert_close(gw, ww)
    assert gw[1].abs().sum() == 0 and gw[3].abs().sum() == 0


def test_without_grouped_gemm_the_padded_path_agrees(gen_dir, monkeypatch):
    """A torch whose _grouped_mm has no CPU kernel (archspec.runtime probes it at import) takes the padded path, with the
    same result; under bf16 autocast both paths run their matmuls in bf16 and agree to bf16 precision."""
    spec = _spec(CASES["grouped-glu-shared"])
    gen = generate(spec, out_dir=gen_dir)
    torch.manual_seed(0)
    ffn = gen.Model().blocks[0].ffn
    _randomise(ffn)
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(4))
    outs = {}
    for label in ("grouped", "fallback"):
        if label == "fallback":
            monkeypatch.setattr("archspec.runtime.grouped_gemm._GROUPED_MM_CPU", None)
        outs[label] = ffn(x), float(ffn.router_stats[-1])
        with torch.autocast("cpu", torch.bfloat16):
            outs[label + "-bf16"] = ffn(x), float(ffn.router_stats[-1])
    assert outs["grouped"][1] == outs["grouped-bf16"][1] == 1.0
    assert outs["fallback"][1] > 1.0 and outs["fallback-bf16"][1] > 1.0
    torch.testing.assert_close(outs["fallback"][0], outs["grouped"][0], rtol=1e-5, atol=1e-5)
    assert outs["grouped-bf16"][0].dtype == outs["fallback-bf16"][0].dtype
    torch.testing.assert_close(outs["fallback-bf16"][0].float(), outs["grouped-bf16"][0].float(), rtol=2e-2,
                               atol=2e-2)
    assert (outs["grouped-bf16"][0].float() - outs["grouped"][0]).abs().max() > 1e-4  # bf16 really ran
