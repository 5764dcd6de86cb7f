"""Tensor parallelism on CPU: two gloo processes holding half the heads, hidden units and vocabulary each train like
one process holding the whole model (losses, gradients, weights), a compiled block runs split, the tp=2 checkpoint
loads into a tp=1 model, and the rules refuse what cannot be split, naming train.parallel.tp.

Fp32 throughout. Tolerance: losses rtol 1e-5; gradients rtol 1e-4, atol 1e-6 at each of 3 AdamW steps (the sharded
matmuls sum in another order: reduce-scatters of partial products instead of one matmul); weights after the 3 steps
atol 1e-4 (measured 3e-5 at most: AdamW divides by sqrt(exp_avg_sq), so a weight whose gradient is ~1e-8 moves by
up to lr either way on rounding noise alone).

Gloo on CPU runs every collective these styles need (all-gather, reduce-scatter, all-reduce): nothing is skipped."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archspec.testing.torchrun import torchrun_command
from archspec import testing as T
from archspec.codegen import generate
from archspec.errors import UserError
from archspec.spec import load_spec_dict
from archspec.spec.parallel_plan import model_plan
from archspec.train.checkpoint import load_sharded

ROOT = Path(__file__).resolve().parents[2]

# GQA (4 query heads, 2 K/V heads, with q/k/v biases and a per-head q/k norm) + GLU, and layer 1 an MLP (per-layer
# variation); tied embeddings.
SPEC = {
    "name": "tp-tiny",
    "model": {"vocab_size": 64, "context_length": 16, "d_model": 32, "n_layers": 2,
              "attention": {"n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "qkv_bias": True,
                            "qk_norm": {"eps": 1e-6}},
              "ffn": {"kind": "glu", "hidden_dim": 48},
              "layers": {"mlp": {"select": [1], "ffn": {"kind": "mlp", "activation": "gelu", "hidden_dim": 64}}},
              "tie_embeddings": True},
    "train": {"seq_len": 16, "parallel": {"tp": 2}},
}


def _variant(name: str, **model) -> dict:
    base = {k: v for k, v in SPEC["model"].items() if k not in ("layers", "attention", "ffn")}
    return {"name": name, "model": {**base, **model}, "train": SPEC["train"]}


# The other positional kinds and block wirings, each checked the same way in the same launch: learned positions
# (gathered around, the table split by features) with LayerNorm, sandwich blocks, an embedding norm, biases and an
# untied head; ALiBi (each rank its heads' slopes) in sliding-window layers (the blockwise kernel on CPU) with a
# shared-norm parallel block; sinusoidal positions with output-norm blocks.
VARIANTS = [
    _variant("tp-learned", norm={"kind": "layernorm"}, block={"norm_placement": "sandwich"}, embedding_norm=True,
             attention={"n_heads": 4, "head_dim": 8, "bias": True, "positional": {"kind": "learned"}},
             ffn={"kind": "mlp", "activation": "gelu", "hidden_dim": 64, "bias": True},
             tie_embeddings=False, lm_head_bias=True),
    _variant("tp-alibi", block={"parallel": True, "shared_norm": True},
             attention={"n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "positional": {"kind": "alibi"},
                        "sparsity": {"kind": "sliding_window", "window": 6}},
             ffn={"kind": "glu", "hidden_dim": 48}),
    _variant("tp-sinusoidal", block={"norm_placement": "output"},
             attention={"n_heads": 2, "head_dim": 16, "positional": {"kind": "sinusoidal"}},
             ffn={"kind": "glu", "activation": "gelu", "hidden_dim": 32}),
]

WORKER = textwrap.dedent("""
    import copy, json, sys
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from archspec.codegen import generate
    from archspec.spec import load_spec_dict
    from archspec.train.checkpoint import load_sharded, save_sharded
    from archspec.train.parallel import full_value as local_value
    from archspec.train.tensor_parallel import apply_tensor_parallel, loss_context, natural_state_dict

    mode, specs_json, out = sys.argv[1:]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    results = {}

    def natural(model, name, t):
        permuted = model._archspec_tp.permuted
        t = t.full_tensor()
        return t[torch.argsort(permuted[name])] if name in permuted else t

    for i, data in enumerate(json.load(open(specs_json))):
        spec = load_spec_dict(data)
        torch.manual_seed(0)
        Model = generate(spec, write=False).module.Model
        model = Model()  # the same weights on every rank (same seed)
        single = copy.deepcopy(model)  # one process's model, run here alongside
        apply_tensor_parallel(model, spec, mesh)
        g = torch.Generator().manual_seed(1)
        idx = torch.randint(0, 64, (4, 16), generator=g)
        targets = torch.randint(0, 64, (4, 16), generator=g)
        if mode == "compile":
            model.blocks[0].compile()  # one block compiled: the others stay eager
        res = {"tied": model.lm_head.weight is model.tok_emb.weight, "losses": [], "single": []}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        ref = torch.optim.AdamW(single.parameters(), lr=1e-2, weight_decay=0.1)
        for step in range(3 if mode == "train" else 1):
            with loss_context(model):
                logits, loss = model(idx, targets)
                loss.backward()
            _, ref_loss = single(idx, targets)
            ref_loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the loop's clipping, on DTensors
            torch.testing.assert_close(local_value(norm), torch.nn.utils.clip_grad_norm_(single.parameters(), 1.0),
                                       rtol=1e-5, atol=0)
            res["losses"].append(local_value(loss).item())
            res["single"].append(ref_loss.item())
            grads = {n: natural(model, n, p.grad) for n, p in model.named_parameters()}
            for n, p in single.named_parameters():
                torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-6,
                                           msg=lambda m: f"{spec.name} step {step}: grad of {n}: {m}")
            opt.step(); ref.step(); opt.zero_grad(); ref.zero_grad()
        weights = natural_state_dict(model)
        for n, p in single.state_dict().items():
            torch.testing.assert_close(weights[n], p, rtol=1e-4, atol=1e-4, msg=lambda m: f"{spec.name}: {n}: {m}")
        res["logits_placements"] = [str(p) for p in logits.placements]
        # this rank's heads, as the generated attention reads them off its weights' shapes
        attn = model.blocks[0].attn
        q_rows = attn.o_proj.weight.to_local().shape[1]
        kv_rows = (attn.qkv_proj.weight.to_local().shape[0] - q_rows) // 2
        res["local_heads"] = [q_rows // spec.model.attention.head_dim, kv_rows // spec.model.attention.head_dim]
        heads = [None, None]
        first = getattr(attn, "heads", None)  # the slice of heads whose ALiBi slopes it takes
        dist.all_gather_object(heads, None if first is None else first.start)
        res["first_head"] = heads  # each rank's
        res["local_qkv_rows"] = model.blocks[0].attn.qkv_proj.weight.to_local().shape[0]
        if mode == "train" and i == 0:
            save_sharded(Path(out) / "ckpt.dcp", model, opt)
            moments = {n: natural(model, n, opt.state[p]["exp_avg"]) for n, p in model.named_parameters()}
            if rank == 0:
                torch.save({"weights": weights, "moments": moments}, Path(out) / "full.pt")
            # and back into a fresh tp=2 model: the files' natural order permuted again on load
            torch.manual_seed(5)
            again = apply_tensor_parallel(Model(), spec, mesh)
            again_opt = torch.optim.AdamW(again.parameters(), lr=1e-2, weight_decay=0.1)
            load_sharded(Path(out) / "checkpoint.pt", Path(out) / "ckpt.dcp", again, again_opt)
            for n, p in again.state_dict().items():
                torch.testing.assert_close(p.full_tensor(), model.state_dict()[n].full_tensor(), rtol=0, atol=0)
            for n, p in again.named_parameters():
                mine = dict(model.named_parameters())[n]
                for key in ("exp_avg", "exp_avg_sq"):
                    torch.testing.assert_close(again_opt.state[p][key].full_tensor(),
                                               opt.state[mine][key].full_tensor(), rtol=0, atol=0)
            res["reloaded_at_tp2"] = True
        results[spec.name] = res
    if rank == 0:
        json.dump(results, open(Path(out) / f"{mode}.json", "w"))
    # the models' DTensors and the optimizers' states hold the process group: released before it is destroyed (else
    # gloo's threads may be torn down under them at exit: "terminate called without an active exception")
    model = opt = again = again_opt = logits = loss = norm = grads = weights = moments = None
    import gc
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
""")


def _torchrun(tmp_path: Path, mode: str, specs: list[dict]) -> dict:
    (tmp_path / "specs.json").write_text(json.dumps(specs))
    (tmp_path / "worker.py").write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        torchrun_command(2, tmp_path / "worker.py", mode, tmp_path / "specs.json", tmp_path),
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads((tmp_path / f"{mode}.json").read_text())


@pytest.mark.slow
def test_tp2_trains_like_one_process_and_its_checkpoint_loads_at_tp1(tmp_path):
    results = _torchrun(tmp_path, "train", [SPEC, *VARIANTS])  # grads and weights are compared inside, every step
    for name, result in results.items():
        torch.testing.assert_close(torch.tensor(result["losses"]), torch.tensor(result["single"]), rtol=1e-5,
                                   atol=0, msg=name)
        assert result["losses"][0] > result["losses"][-1], name  # it trains
        assert result["logits_placements"] == ["S(2)"], name  # vocabulary-sharded logits, never gathered
    result = results["tp-tiny"]
    assert result["tied"]  # still one matrix after distribution
    assert not results["tp-learned"]["tied"]
    assert result["local_heads"] == [2, 1]  # each rank: half the query heads, half the K/V heads
    assert result["local_qkv_rows"] == (2 + 2 * 1) * 8
    assert results["tp-alibi"]["first_head"] == [0, 2] and result["first_head"] == [None, None]  # ALiBi's slopes
    assert result["reloaded_at_tp2"]

    # The tp=2 DCP checkpoint, loaded by one process into a plain model: natural row order, today's names.
    spec = load_spec_dict({**SPEC, "train": {"seq_len": 16}})
    model = generate(spec, write=False).module.Model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    load_sharded(tmp_path / "checkpoint.pt", tmp_path / "ckpt.dcp", model, opt)
    full = torch.load(tmp_path / "full.pt")
    for name, p in model.state_dict().items():
        torch.testing.assert_close(p, full["weights"][name], rtol=0, atol=0, msg=name)
    for name, p in model.named_parameters():
        torch.testing.assert_close(opt.state[p]["exp_avg"], full["moments"][name], rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_compiled_tp_block_runs_and_matches_one_process(tmp_path):
    result = _torchrun(tmp_path, "compile", [SPEC])["tp-tiny"]  # grads compared inside
    torch.testing.assert_close(torch.tensor(result["losses"]), torch.tensor(result["single"]), rtol=1e-5, atol=0)


# ── the rules: refused at load, naming train.parallel.tp and the smallest change ───────────────────────────


def _refusal(**changes) -> list[str]:
    data = json.loads(json.dumps(SPEC))
    for dotted, value in changes.items():
        *head, last = dotted.split("__")
        node = data
        for key in head:
            node = node.setdefault(key, {})
        node[last] = value
    with pytest.raises(UserError) as e:
        load_spec_dict(data)
    return [p for p in e.value.problems if "train.parallel.tp" in p]


def test_rules_refuse_unsplittable_specs_with_the_path():
    assert _refusal(train__parallel={"tp": 4}) == [
        "train.parallel.tp: model.attention.n_kv_heads (2) is not divisible by tp 4: use tp in {1, 2} or n_kv_heads 4"]
    problems = _refusal(train__parallel={"tp": 3})
    assert any("model.vocab_size (64) is not divisible by tp 3 (the vocabulary is not padded)" in p for p in problems)
    assert any("model.layers.mlp.ffn.hidden_dim (64) is not divisible by tp 3" in p for p in problems)
    assert any("train.seq_len (16) is not divisible by tp 3" in p for p in problems)
    scope = _refusal(model__attention__qk_norm={"scope": "projection"})
    assert scope and "model.attention.qk_norm.scope: projection normalises q and k over all heads" in scope[0]
    mqa = _refusal(model__attention__n_kv_heads=1)  # one K/V head cannot be split
    assert mqa == ["train.parallel.tp: model.attention.n_kv_heads (1) is not divisible by tp 2: use tp in {1} or "
                   "n_kv_heads 2"]


# ── every accepted spec's plan fits its module ─────────────────────────────────────────────────────────────────────


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=T.spec_dicts(train=False), data=st.data())
def test_every_accepted_spec_has_a_plan_that_fits_its_module(raw, data):
    """Accepted under tp: each split's widths divide by tp and add up to the module's (local × tp = global), the
    fused parts tile the fused weight, the per-rank counts are the module's own attributes, and every parameter is
    covered by a style (else apply_tensor_parallel would refuse). Refused: every problem names train.parallel.tp.
    tp is drawn among the values that divide the plan's counts when there are any (else 2: a refusal)."""
    plain = load_spec_dict(raw)
    counts = [d.value for p in model_plan(plain.model) if p.plan for d in p.plan.divides]
    every = math.gcd(plain.model.context_length, *counts)
    tp = data.draw(st.sampled_from([d for d in range(2, min(every, 8) + 1) if every % d == 0] or [2]), label="tp")
    raw = {**raw, "train": {"parallel": {"tp": tp}, "seq_len": raw["model"]["context_length"]}}
    try:
        spec = load_spec_dict(raw)
    except UserError as e:
        problems = getattr(e, "problems", None) or [str(e)]
        # at train.parallel.tp, or at the unit's own field naming it (an MoE expert's bias: "... train.parallel.tp 2")
        assert any(p.startswith("train.parallel.tp: ") or "train.parallel.tp" in p for p in problems) or not any(
            "parallel" in p for p in problems), problems
        return
    with torch.device("meta"):
        model = generate(spec, write=False).module.Model()
    covered: set[str] = set()
    for placed in model_plan(spec.model):
        assert placed.plan is not None and placed.plan.refused is None, placed.path
        for name, split in placed.plan.splits.items():
            fqn = ".".join(p for p in (placed.module, name) if p)
            module = model.get_submodule(fqn)
            if split.style in ("colwise", "rowwise", "sequence", "vocab", "delegate"):  # (a delegate: its own)
                covered |= {f"{fqn}.{n}" for n, _ in module.named_parameters()}
            if split.style == "colwise" or (split.style == "vocab" and isinstance(module, torch.nn.Linear)):
                width = module.out_features if isinstance(module, torch.nn.Linear) else module.embedding_dim
                assert width % tp == 0 or split.replicated_output and module.embedding_dim % tp == 0, fqn
                if split.parts:
                    assert sum(split.parts) == width and all(part % tp == 0 for part in split.parts), fqn
            if split.style == "rowwise":
                assert module.in_features % tp == 0, fqn
            if split.style == "vocab" and isinstance(module, torch.nn.Embedding):
                assert module.num_embeddings % tp == 0, fqn
        module = model.get_submodule(placed.module)
        for attr, count in placed.plan.sliced.items():
            assert count % tp == 0, (placed.path, attr)
            assert getattr(module, attr) == slice(0, count), (placed.module, attr)  # every head, until split
    assert spec.train.seq_len % tp == 0
    names = {n for n, _ in model.named_parameters()}  # tied weights once, by their first name
    assert names <= covered | ({"lm_head.weight"} if spec.model.tie_embeddings else set()), names - covered


def test_kinds_without_a_plan_are_refused_by_name():
    from archspec.kinds.base import KindUnit
    from archspec.spec import load_spec

    with pytest.raises(UserError) as e:  # MLA: no plan (its latent projections are shared by all heads)
        load_spec(ROOT / "specs" / "deepseek-v3-like-tiny.yaml", ["train.parallel.tp=2"])
    assert "train.parallel.tp: model.attention: kind 'mla' has no tensor-parallel plan; use tp 1, or a kind that " \
           "has one" in e.value.problems
    from archspec.kinds.ffn.moe import MoESpec

    spec = load_spec(ROOT / "specs" / "mixtral-like-tiny.yaml")
    if MoESpec.tensor_parallel is KindUnit.tensor_parallel:  # MoE's own plan (experts by hidden) not there yet
        with pytest.raises(UserError) as e:
            load_spec(ROOT / "specs" / "mixtral-like-tiny.yaml", ["train.parallel.tp=2"])
        assert any("model.ffn: kind 'moe' has no tensor-parallel plan" in p for p in e.value.problems)
    else:  # the MoE unit hands its module to expert parallelism's function, which takes the sequence shard
        splits = MoESpec.tensor_parallel(spec.model.ffn, spec.model).splits
        assert splits[""].style == "delegate" and splits[""].fn.startswith("archspec.train.expert_parallel:")


class _Mesh:
    """Enough of a 2-process DeviceMesh for apply_tensor_parallel to reach its delegates (nothing collective yet)."""

    def size(self):
        return 2

    def get_local_rank(self):
        return 0


def test_a_delegated_module_is_handed_to_its_function_or_refused_when_it_is_missing(monkeypatch):
    from archspec.kinds.base import Split, TPPlan
    from archspec.kinds.ffn.glu import GLUSpec
    from archspec.train.tensor_parallel import apply_tensor_parallel

    spec = load_spec_dict(SPEC)
    model = generate(spec, write=False).module.Model()
    handed = []

    class Handed(Exception):
        pass

    def take(module, mesh):
        handed.append((type(module).__name__, mesh))
        raise Handed  # stop before parallelize_module, which needs a real mesh

    monkeypatch.setattr(sys.modules[__name__], "take", take, raising=False)
    monkeypatch.setattr(GLUSpec, "tensor_parallel",
                        lambda self, m: TPPlan({"": Split("delegate", fn=f"{__name__}:take")}))
    mesh = _Mesh()
    with pytest.raises(Handed):
        apply_tensor_parallel(model, spec, mesh)
    assert handed == [("GLUFeedForward", mesh)]  # layer 0's (layer 1 is an MLP)
    monkeypatch.setattr(GLUSpec, "tensor_parallel",
                        lambda self, m: TPPlan({"": Split("delegate", fn="archspec.train.no_such_module:apply")}))
    with pytest.raises(UserError, match=r"train.parallel.tp: blocks.0.ffn is handed to archspec.train.no_such_module"):
        apply_tensor_parallel(generate(spec, write=False).module.Model(), spec, mesh)
