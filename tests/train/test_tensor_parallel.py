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
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

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

WORKER = textwrap.dedent("""
    import copy, json, sys
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from archspec.codegen import generate
    from archspec.spec import load_spec_dict
    from archspec.train.checkpoint import save_sharded
    from archspec.train.tensor_parallel import apply_tensor_parallel, local_value, loss_context

    mode, spec_json, out = sys.argv[1:]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    spec = load_spec_dict(json.load(open(spec_json)))
    torch.manual_seed(0)
    Model = generate(spec, write=False).module.Model
    model = Model()  # the same weights on every rank (same seed)
    single = copy.deepcopy(model)  # one process's model, run here alongside
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    apply_tensor_parallel(model, spec, mesh)
    tied = model.lm_head.weight is model.tok_emb.weight
    permuted = model._archspec_tp.permuted
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 64, (4, 16), generator=g)
    targets = torch.randint(0, 64, (4, 16), generator=g)

    def natural(name, t):
        t = t.full_tensor()
        return t[torch.argsort(permuted[name])] if name in permuted else t

    if mode == "compile":
        model.blocks[0].compile()  # one block compiled: the others stay eager
        single.blocks[0].compile()
    out_json = {"tied": tied, "losses": [], "single": [], "grads": {}}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ref = torch.optim.AdamW(single.parameters(), lr=1e-2, weight_decay=0.1)
    steps = 3 if mode == "train" else 1
    for step in range(steps):
        with loss_context(model):
            logits, loss = model(idx, targets)
            loss.backward()
        _, ref_loss = single(idx, targets)
        ref_loss.backward()
        out_json["losses"].append(local_value(loss).item())
        out_json["single"].append(ref_loss.item())
        grads = {n: natural(n, p.grad) for n, p in model.named_parameters()}
        ref_grads = {n: p.grad for n, p in single.named_parameters()}
        for n in ref_grads:
            torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-4, atol=1e-6, msg=f"step {step}: grad of {n}")
        opt.step(); ref.step(); opt.zero_grad(); ref.zero_grad()
    out_json["logits_placements"] = [str(p) for p in logits.placements]
    weights = {n: natural(n, p) for n, p in model.state_dict().items()}
    for n, p in single.state_dict().items():
        torch.testing.assert_close(weights[n], p, rtol=1e-4, atol=1e-4, msg=f"weight {n}")
    out_json["grads"] = sorted(grads)
    out_json["local_heads"] = [model.blocks[0].attn.n_heads, model.blocks[0].attn.n_kv_heads]
    out_json["local_qkv_rows"] = model.blocks[0].attn.qkv_proj.weight.to_local().shape[0]
    if mode == "train":
        save_sharded(Path(out) / "ckpt.dcp", model, opt)
        moments = {n: natural(n, opt.state[p]["exp_avg"]) for n, p in model.named_parameters()}
        if rank == 0:
            torch.save({"weights": weights, "moments": moments}, Path(out) / "full.pt")
    if rank == 0:
        json.dump(out_json, open(Path(out) / f"{mode}.json", "w"))
    dist.destroy_process_group()
""")


def _torchrun(tmp_path: Path, mode: str) -> dict:
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    (tmp_path / "worker.py").write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(tmp_path / "worker.py"), mode, str(tmp_path / "spec.json"), str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads((tmp_path / f"{mode}.json").read_text())


@pytest.mark.slow
def test_tp2_trains_like_one_process_and_its_checkpoint_loads_at_tp1(tmp_path):
    result = _torchrun(tmp_path, "train")  # grads and weights are compared inside, at every step
    torch.testing.assert_close(torch.tensor(result["losses"]), torch.tensor(result["single"]), rtol=1e-5, atol=0)
    assert result["losses"][0] > result["losses"][-1]  # it trains
    assert result["tied"]  # still one matrix after distribution
    assert result["local_heads"] == [2, 1]  # each rank: half the query heads, half the K/V heads
    assert result["local_qkv_rows"] == (2 + 2 * 1) * 8
    assert result["logits_placements"] == ["S(2)"]  # vocabulary-sharded logits, never gathered

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
    result = _torchrun(tmp_path, "compile")
    torch.testing.assert_close(torch.tensor(result["losses"]), torch.tensor(result["single"]), rtol=1e-5, atol=0)


# ── the rules: refused at load, naming train.parallel.tp and the smallest change ───────────────────────────────────


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
    alibi = _refusal(model__attention__positional={"kind": "alibi"})
    assert alibi == ["train.parallel.tp: model.attention.positional: kind 'alibi' has no tensor-parallel plan; use "
                     "tp 1, or a kind that has one"]
