"""Weight quantization (archspec.quant): the schemes' arithmetic, which weights the units pick, exact byte counts, the
stored form round trip, over drawn specs; the Int4Linear kernel against its own unpacked arithmetic."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from archspec import codegen
from archspec.errors import UserError
from archspec.quant.model import apply_plan, load_quantized_state, quant_plan, quantized_state, weight_bytes
from archspec.quant.weights import (
    Int4Linear,
    QuantizedEmbedding,
    QuantizedParameters,
    pack_int4,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)
from archspec.testing import valid_specs
from tests.tiny import tiny_spec

pytest.importorskip("torchao")


@given(st.integers(1, 4), st.integers(1, 16), st.randoms(use_true_random=False))
def test_int4_packing_is_two_values_per_byte_and_unpacks_exactly(rows, half, rnd):
    q = torch.tensor([[rnd.randrange(16) for _ in range(2 * half)] for _ in range(rows)], dtype=torch.uint8)
    packed = pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.shape == (rows, half)
    assert torch.equal(unpack_int4(packed), q)
    assert torch.equal(packed & 0x0F, q[:, 0::2])  # the even column in the low nibble


@settings(deadline=None, max_examples=40)
@given(st.sampled_from([(2, 64, 32), (3, 2, 96, 32), (16, 64, 16), (5, 128, 128), (4, 8, 2)]),
       st.floats(1e-3, 1e3), st.integers(0, 2**31 - 1))
def test_int4_min_max_error_is_at_most_half_a_step_of_its_group(shape, spread, seed):
    *lead, k, g = shape
    w = torch.randn(*lead, k, generator=torch.Generator().manual_seed(seed)) * spread
    q = quantize_int4(w, g)
    assert q.parts["packed"].shape == (*lead, k // 2)
    step = q.parts["scale"].repeat_interleave(g, dim=-1)
    err = (q.dequantize() - w).abs()
    assert bool((err <= step / 2 * (1 + 1e-5) + 1e-6 * spread).all())
    groups = w.reshape(*lead, k // g, g)  # each group's extremes are represented (min exactly, max to rounding)
    assert torch.allclose(q.parts["minimum"], groups.amin(-1))


@pytest.mark.parametrize("shape", [(32, 64), (4, 16, 32)])
def test_int8_parts_are_torchaos_and_dequantize_as_torchao_does(shape):
    from torchao.quantization import Int8Tensor
    from torchao.quantization.granularity import PerRow

    w = torch.randn(*shape)
    q = quantize_int8(w)
    ref = Int8Tensor.from_hp(w, granularity=PerRow())
    assert torch.equal(q.parts["qdata"], ref.qdata) and q.parts["qdata"].dtype == torch.int8
    assert torch.allclose(q.dequantize(), ref.dequantize(), atol=1e-6)
    assert q.nbytes == w.numel() + 5 * math.prod(shape[:-1])  # int8 values, fp32 scale and int8 zero point per row


@pytest.mark.parametrize("out_features,group", [(32, 32), (48, 64), (20, 16)])  # 20: not the kernel's (N % 16)
def test_int4_linear_kernel_matches_its_unpacked_arithmetic(out_features, group):
    linear = nn.Linear(128, out_features)
    q = quantize_int4(linear.weight, group)
    module = Int4Linear(q, linear.bias)
    for x in (torch.randn(1, 1, 128), torch.randn(3, 5, 128)):  # one token (the kernel's case) and a batch
        reference = x @ q.dequantize().T + linear.bias
        assert torch.allclose(module(x), reference, atol=1e-4, rtol=1e-4)
    one = torch.randn(1, 1, 128)
    assert module.kernel_usable(one) == (out_features % 16 == 0 and group in (32, 64, 128))
    assert not module.kernel_usable(torch.randn(2, 1, 128))
    assert "_kernel" not in dict(module.state_dict())  # the kernel's layout is made on use, never stored


@settings(deadline=None, max_examples=12, suppress_health_check=list(HealthCheck))
@given(spec=valid_specs(), scheme=st.sampled_from(["int8", "int4"]), embeddings=st.booleans())
def test_units_choose_the_weights_bytes_are_exact_and_the_stored_form_round_trips(spec, scheme, embeddings):
    generated = codegen.generate(spec, write=False)
    torch.manual_seed(0)
    model = generated.Model().eval()
    params = dict(model.named_parameters(remove_duplicate=False))
    widths = [params[n].shape[-1] for n in quant_plan(model, spec, "int8", None, embeddings).weights]
    group = None
    if scheme == "int4":  # the default group when one divides every width; else the largest even one that does
        if any(w % 32 for w in widths):
            with pytest.raises(UserError, match="none of the group sizes"):
                quant_plan(model, spec, "int4", None, embeddings)
            group = next((g for g in (16, 8, 4, 2) if all(w % g == 0 for w in widths)), None)
            if group is None:  # an odd width: no int4 layout exists, and the refusal names the weight
                with pytest.raises(UserError, match="does not divide the input width of"):
                    quant_plan(model, spec, "int4", 2, embeddings)
                return
    plan = quant_plan(model, spec, scheme, group, embeddings)
    # never a norm, a router or a bias; the embedding and the head only when asked
    for name in plan.weights:
        assert params[name].ndim >= 2 and "norm" not in name and ".router." not in name and "bias" not in name
    assert all(n.startswith("blocks.") for n in plan.weights) or embeddings
    assert ("lm_head.weight" in plan.weights) == embeddings
    for i, block in enumerate(model.blocks):  # every attention/FFN matrix but a router is quantized
        for attr in ("attn", "ffn"):
            for n, p in getattr(block, attr).named_parameters():
                full = f"blocks.{i}.{attr}.{n}"
                if p.ndim >= 2 and "bias" not in n.rsplit(".", 1)[-1] and not n.startswith(("router", "shared_expert_gate")):
                    assert (full in plan.weights) == (p.shape[-1] > 1), full  # width 1: kept, with the reason
                    assert full in plan.weights or "input width 1" in plan.kept[full]
    before_tensors = {n: p.detach().clone() for n, p in params.items() if n in plan.weights}
    idx = torch.randint(0, spec.model.vocab_size, (1, min(8, spec.model.context_length)))
    counts = apply_plan(model, plan)
    state = quantized_state(model)
    assert all(type(t) is torch.Tensor for t in state.values())  # plain tensors: a safe load reads them
    assert counts["quantized_bytes_before"] == sum(t.numel() * t.element_size() for t in before_tensors.values())
    assert counts["weight_bytes_after"] == weight_bytes(model)
    # exact: int8 one byte a weight plus an fp32 scale and an int8 zero per row; int4 half a byte plus an fp32 scale
    # and minimum per group (so tiny groups cost more than they save: the figures say so, nothing hides it)
    per_weight = {n: t.numel() for n, t in before_tensors.items()}
    expected = sum(k + 5 * k // before_tensors[n].shape[-1] for n, k in per_weight.items()) if scheme == "int8" \
        else sum(k // 2 + 8 * k // plan.group_size for k in per_weight.values())
    assert counts["quantized_bytes_after"] == expected
    assert counts["weight_bytes_before"] - counts["weight_bytes_after"] == \
        counts["quantized_bytes_before"] - counts["quantized_bytes_after"]
    with torch.no_grad():
        logits = model(idx)
    assert bool(torch.isfinite(logits).all())
    fresh = generated.Model().eval()
    apply_plan(fresh, quant_plan(fresh, spec, scheme, plan.group_size, embeddings))
    load_quantized_state(fresh, state, "test")
    with torch.no_grad():
        assert torch.equal(fresh(idx), logits)


def test_a_moe_keeps_its_router_and_quantizes_its_stacked_experts():
    spec = tiny_spec(ffn={"kind": "moe", "n_experts": 4, "top_k": 2, "expert": {"kind": "glu", "hidden_dim": 64}})
    model = codegen.generate(spec, write=False).Model().eval()
    plan = quant_plan(model, spec, "int4")
    assert plan.group_size == 32
    assert any(n.endswith("ffn.router.weight") for n in plan.kept) and not any("router" in n for n in plan.weights)
    idx = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        before = model(idx)
        apply_plan(model, plan)
        after = model(idx)
    experts = model.blocks[0].ffn.experts
    assert isinstance(experts, QuantizedParameters) and experts.up_proj.shape == (4, 64, 32)
    router = model.blocks[0].ffn.router  # the generated Router (an nn.Linear), as trained: not swapped for a quantized one
    assert router.weight.dtype == torch.float32 and type(router).__name__ == "Router" and isinstance(router, nn.Linear)
    assert (after - before).abs().max() < 0.1 * before.abs().max()


def test_tied_embedding_and_head_are_one_quantized_matrix_with_embeddings():
    spec = tiny_spec(tie_embeddings=True)
    model = codegen.generate(spec, write=False).Model().eval()
    plan = quant_plan(model, spec, "int8", embeddings=True)
    assert "lm_head.weight" in plan.weights and "tok_emb.weight" not in plan.weights
    apply_plan(model, plan)
    assert isinstance(model.tok_emb, QuantizedEmbedding)
    assert model.tok_emb.qdata.data_ptr() == model.lm_head.weight.qdata.data_ptr()  # shared, counted once
    idx = torch.tensor([[1, 5, 9]])
    assert torch.allclose(model.tok_emb(idx), model.lm_head.weight.dequantize()[idx], atol=1e-6)


def test_group_size_refusals_name_the_layer_and_what_would_be_valid():
    spec = tiny_spec(ffn={"kind": "mlp", "hidden_dim": 48})  # down_proj's input width 48: 32 does not divide it
    model = codegen.generate(spec, write=False).Model()
    with pytest.raises(UserError, match=r"blocks\.0\.ffn\.down_proj\.weight has input width 48"):
        quant_plan(model, spec, "int4")
    assert quant_plan(model, spec, "int4", 16).group_size == 16
    with pytest.raises(UserError, match=r"--group-size 32: does not divide the input width of blocks\.0\.ffn"):
        quant_plan(model, spec, "int4", 32)
    with pytest.raises(UserError, match="applies to int4"):
        quant_plan(model, spec, "int8", 32)
    with pytest.raises(UserError, match="even number"):
        quant_plan(model, spec, "int4", 3)
    with pytest.raises(UserError, match="expected one of int8, int4"):
        quant_plan(model, spec, "int3")
