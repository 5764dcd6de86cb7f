"""Expert parallelism (train.parallel.ep) on CPU: two gloo processes, each holding two of an MoE layer's four experts
and training on half of the global batch, give the single-process losses (main and auxiliary), router statistics,
gradients and weights over three AdamW steps; the rows really travel unevenly; a DCP checkpoint saved under ep=2
loads under ep=1 with the same weights and moments; the spec rules refuse what cannot be split, naming the field.

Gloo's limits: none met here. all_to_all_single (uneven splits), all_reduce and DCP run on gloo on CPU; the experts
go through the grouped GEMM (torch._grouped_mm, fp32 on CPU), the one expert path expert parallelism takes."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from archspec.testing.torchrun import torchrun_command
from archspec.errors import UserError
from archspec.spec import load_spec_dict

# Under torchrun: the model with ep=2 (DDP or FSDP2 of the non-expert weights over the 2 data-parallel processes)
# and, on every rank, a plain single-process copy trained on the whole global batch; rank 0 writes the comparison.
WORKER = textwrap.dedent("""
    import copy, json, sys
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from archspec.codegen import generate
    from archspec.spec import load_spec_dict
    from archspec.train.checkpoint import save_sharded
    from archspec.train.expert_parallel import last_splits, moe_layers, parallelize_moe, shard_experts
    from archspec.train.mesh import JobMesh, Layout
    from archspec.train.optim import param_groups, separate_dtensors
    from archspec.train.parallel import clip_gradients as clip_grad_norm_

    spec_json, kind, out = sys.argv[1:]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = load_spec_dict(json.load(open(spec_json)))
    gen = generate(spec, write=False)
    torch.manual_seed(0)
    model = gen.Model()
    ref = copy.deepcopy(model)  # one process, the whole batch
    mesh = JobMesh.build("cpu", Layout.of(spec.train.parallel, world))
    layers = parallelize_moe(model, mesh)
    ignored = shard_experts(model, mesh, fsdp=kind == "fsdp")
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block, mesh=mesh.dp, ignored_params=ignored)
        wrapped = fully_shard(model, mesh=mesh.dp, ignored_params=ignored)
    else:
        from torch.nn.parallel import DistributedDataParallel
        wrapped = DistributedDataParallel(model, process_group=mesh.dp.get_group())
    # the loop's groups (decay / no decay) and its fused AdamW; under ddp the experts get groups of their own
    opt = torch.optim.AdamW(separate_dtensors(param_groups(model, 0.1)), lr=1e-2, fused=True)
    ref_opt = torch.optim.AdamW(param_groups(ref, 0.1), lr=1e-2, fused=True)
    full = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t
    ref_params = dict(ref.named_parameters())
    g = torch.Generator().manual_seed(1)
    B, T = 8, 16
    steps = []
    for step in range(3):
        idx = torch.randint(0, spec.model.vocab_size, (B, T + 1), generator=g)
        x, y = idx[:, :-1], idx[:, 1:]
        mine = slice(rank * B // world, (rank + 1) * B // world)  # this rank's half of the global batch
        loss = wrapped(x[mine], y[mine])[1]
        aux = model.auxiliary_losses()
        (loss + sum(aux.values())).backward()
        ref_loss = ref(x, y)[1]
        ref_aux = ref.auxiliary_losses()
        (ref_loss + sum(ref_aux.values())).backward()
        if hasattr(model, "after_micro_batch"):  # bias balancing: the step's expert loads
            model.after_micro_batch()
            ref.after_micro_batch()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        row = {"loss": [mean.item() / world, ref_loss.item()],
               "aux": {k: [v.item(), ref_aux[k].item()] for k, v in aux.items()},
               "stats": {k: float((v - ref.router_stats()[k]).abs().max()) for k, v in model.router_stats().items()},
               "splits": [last_splits(ffn) for _, ffn in moe_layers(model)],
               "grads": {n: float((full(p.grad) - ref_params[n].grad).abs().max() / ref_params[n].grad.abs().max())
                         for n, p in model.named_parameters()}}
        row["norm"] = [clip_grad_norm_(list(model.parameters()), 0.5).item(),
                       torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5).item()]
        opt.step(); ref_opt.step(); opt.zero_grad(); ref_opt.zero_grad()
        if hasattr(model, "after_optimizer_step"):  # the loads summed over the data-parallel processes
            def all_sum(t):
                dist.all_reduce(t, group=mesh.dp.get_group())
                return t
            model.after_optimizer_step(all_sum)
            ref.after_optimizer_step()
        steps.append(row)
    params = {n: float((full(p.detach()) - ref_params[n].detach()).abs().max()) for n, p in model.named_parameters()}
    types = {n: type(p).__name__ for n, p in model.named_parameters()}
    ref_buffers = dict(ref.named_buffers())
    buffers = {n: float((full(b) - ref_buffers[n]).abs().max()) for n, b in model.named_buffers()
               if n.endswith("selection_bias")}
    moved = {n: float(b.abs().max()) for n, b in model.named_buffers() if n.endswith("selection_bias")}
    if kind == "ddp":
        save_sharded(Path(out) / "ep2.dcp", model, opt)
        state = {"params": {n: full(p.detach()) for n, p in model.named_parameters()},
                 "moments": {n: full(opt.state[p]["exp_avg"]) for n, p in model.named_parameters()}}
        if rank == 0:
            torch.save(state, f"{out}/full.pt")
    if rank == 0:
        json.dump({"steps": steps, "params": params, "types": types, "layers": layers, "buffers": buffers,
                   "moved": moved}, open(f"{out}/result.json", "w"))
    dist.barrier()
    del wrapped, model, opt
    dist.destroy_process_group()
""")


def tiny_moe(moe: dict | None = None, **parallel) -> dict:
    """Two layers, GQA attention; layer 0 a GLU FFN, layer 1 an MoE (top-2 of 4 GLU experts, z-loss on; `moe`
    merged into it)."""
    spec = {
        "name": "tiny-moe",
        "model": {"vocab_size": 96, "context_length": 16, "d_model": 32, "n_layers": 2,
                  "attention": {"n_heads": 4, "n_kv_heads": 2}, "ffn": {"kind": "glu", "hidden_dim": 64},
                  "layers": {"moe": {"select": [1], "ffn": {
                      "kind": "moe", "n_experts": 4, "top_k": 2, "expert": {"kind": "glu", "hidden_dim": 32},
                      "z_loss_coef": 0.001}}}},
        "train": {"parallel": {"kind": "ddp", **parallel}},
    }
    spec["model"]["layers"]["moe"]["ffn"].update(moe or {})
    return spec


# DeepSeek-V3's routing: sigmoid scores, a selection bias moved outside the gradient (bias balancing), a shared expert
DEEPSEEK_V3 = {"score": "sigmoid", "selection_bias": True, "bias_update_rate": 0.01, "n_shared_experts": 1}
# Qwen2-MoE's shared expert with its gate
QWEN2 = {"n_shared_experts": 1, "shared_hidden_dim": 32, "shared_gate": True}


def _torchrun(tmp_path: Path, kind: str, spec: dict, worker: str = WORKER) -> dict:
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "worker.py").write_text(worker)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        torchrun_command(2, tmp_path / "worker.py", tmp_path / "spec.json", kind, tmp_path),
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((tmp_path / "result.json").read_text())


def _assert_equal_to_one_process(result: dict, spec: dict) -> None:
    # fp32 throughout; what differs is only the order of sums (the all-reduces, the per-rank batches): 1e-5 relative
    from archspec.codegen import generate

    names = {n for n, _ in generate(load_spec_dict(spec), write=False).Model().named_parameters()}
    assert result["layers"] == [1]
    for row in result["steps"]:
        mine, ref = row["loss"]
        assert mine == pytest.approx(ref, rel=1e-5)
        assert set(row["aux"]) == {"moe_aux", "moe_z"}
        for name, (mine, ref) in row["aux"].items():
            assert mine == pytest.approx(ref, rel=1e-5), name  # the balancing and z-losses of the global batch
        assert set(row["stats"]) == {"layer1.load", "layer1.dropped", "layer1.entropy", "layer1.padding"}
        assert max(row["stats"].values()) < 1e-5, row["stats"]  # the loads the loop logs: global too
        assert set(row["grads"]) == names  # every parameter compared
        assert max(row["grads"].values()) < 1e-4, row["grads"]
        assert row["norm"][0] == pytest.approx(row["norm"][1], rel=1e-5)
        # the all-to-all moved different numbers of rows to the two processes (uneven splits)
        (sent, received), = row["splits"]
        assert len(sent) == 2 and sent[0] != sent[1] and sum(sent) == 8 // 2 * 16 * 2
    assert max(result["params"].values()) < 1e-5, result["params"]
    experts = {n: t for n, t in result["types"].items() if ".experts." in n}
    assert set(experts) == {f"blocks.1.ffn.experts.{p}_proj" for p in ("gate", "up", "down")}
    assert set(experts.values()) == {"DTensor"}  # really sharded by expert


@pytest.mark.slow
def test_ep2_under_ddp_trains_as_one_process_and_its_checkpoint_loads_under_ep1(tmp_path):
    result = _torchrun(tmp_path, "ddp", tiny_moe(ep=2))
    _assert_equal_to_one_process(result, tiny_moe())

    # The ep=2 DCP checkpoint (names and global shapes as one process has them) loads into a plain model.
    from archspec.codegen import generate
    from archspec.train.checkpoint import load_sharded
    from archspec.train.optim import param_groups

    full = torch.load(tmp_path / "full.pt", weights_only=True)
    gen = generate(load_spec_dict(tiny_moe()), write=False)
    one = gen.Model()
    opt = torch.optim.AdamW(param_groups(one, 0.1), lr=1e-2, fused=True)  # one process: the loop's two groups
    load_sharded(tmp_path / "checkpoint.pt", tmp_path / "ep2.dcp", one, opt)
    for name, p in one.named_parameters():
        assert torch.equal(p.detach(), full["params"][name]), name
        assert torch.equal(opt.state[p]["exp_avg"], full["moments"][name]), name
    assert one.blocks[1].ffn.experts.up_proj.shape == (4, 32, 32)


@pytest.mark.slow
def test_ep2_under_fsdp_with_shared_expert_and_bias_balancing_trains_as_one_process(tmp_path):
    result = _torchrun(tmp_path, "fsdp", tiny_moe(DEEPSEEK_V3, ep=2))
    _assert_equal_to_one_process(result, tiny_moe(DEEPSEEK_V3))
    # the selection bias moved (by multiples of the rate) and stayed in step with one process's
    assert result["moved"]["blocks.1.ffn.selection_bias"] == pytest.approx(0.03, abs=0.021)  # 1 to 3 steps of 0.01
    assert result["buffers"] == {"blocks.1.ffn.selection_bias": 0.0}
    assert {t for n, t in result["types"].items()} == {"DTensor"}  # the rest FSDP-sharded over the 2 processes


# Under torchrun, tp=2: one MoE layer split by hidden over the two processes, each given its sequence shard of the
# same batch (what the tensor-parallel blocks hand it), against a plain copy on the whole sequence.
TP_WORKER = textwrap.dedent("""
    import copy, json, sys
    import torch
    import torch.distributed as dist
    from archspec.codegen import generate
    from archspec.spec import load_spec_dict
    from archspec.train.expert_parallel import apply_moe_parallel
    from archspec.train.mesh import JobMesh, Layout

    spec_json, kind, out = sys.argv[1:]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, tp = dist.get_rank(), dist.get_world_size()
    spec = load_spec_dict(json.load(open(spec_json)))
    torch.manual_seed(0)
    ffn = generate(spec, write=False).Model().blocks[1].ffn
    ref = copy.deepcopy(ffn)
    mesh = JobMesh.build("cpu", Layout.of(spec.train.parallel, tp))
    apply_moe_parallel(ffn, mesh)
    g = torch.Generator().manual_seed(1)
    B, T, D = 4, 16, spec.model.d_model
    x = torch.randn(B, T, D, generator=g)
    upstream = torch.randn(B, T, D, generator=g)  # the gradient the rest of the model sends back
    mine = slice(rank * T // tp, (rank + 1) * T // tp)
    x_mine = x[:, mine].clone().requires_grad_()
    y = ffn(x_mine)
    ((y * upstream[:, mine]).sum() + ffn.router_losses.sum()).backward()
    x_ref = x.clone().requires_grad_()
    y_ref = ref(x_ref)
    ((y_ref * upstream).sum() + ref.router_losses.sum()).backward()
    full = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t
    ref_params = dict(ref.named_parameters())
    result = {
        "shape": list(y.shape),
        "out": float((y - y_ref[:, mine]).abs().max() / y_ref.abs().max()),
        "x_grad": float((x_mine.grad - x_ref.grad[:, mine]).abs().max() / x_ref.grad.abs().max()),
        "losses": float((ffn.router_losses - ref.router_losses).abs().max()),
        "stats": float((ffn.router_stats - ref.router_stats).abs().max()),
        "grads": {n: float((full(p.grad) - ref_params[n].grad).abs().max() / ref_params[n].grad.abs().max())
                  for n, p in ffn.named_parameters()},
        "types": {n: type(p).__name__ for n, p in ffn.named_parameters()},
    }
    if rank == 0:
        json.dump(result, open(f"{out}/result.json", "w"))
    dist.barrier()
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_tp2_splits_an_moe_layer_by_hidden_and_gives_the_single_process_output_and_gradients(tmp_path):
    result = _torchrun(tmp_path, "tp", tiny_moe(QWEN2, tp=2), TP_WORKER)
    assert result["shape"] == [4, 8, 32]  # this process's sequence shard in, the same shard out
    assert result["out"] < 1e-5 and result["x_grad"] < 1e-5
    assert result["losses"] < 1e-7 and result["stats"] < 1e-6
    assert set(result["grads"]) == {"router.weight", "experts.gate_proj", "experts.up_proj", "experts.down_proj",
                                    "shared_expert.gate_proj.weight", "shared_expert.up_proj.weight",
                                    "shared_expert.down_proj.weight", "shared_expert_gate.weight"}
    assert max(result["grads"].values()) < 1e-5, result["grads"]
    split = {n for n, t in result["types"].items() if t == "DTensor"}
    assert split == set(result["grads"]) - {"router.weight", "shared_expert_gate.weight"}  # router, gate: whole


# ── the spec rules: refused at load, before any process-group work, naming the field and the smallest change ─────


def _problems(data: dict) -> list[str]:
    with pytest.raises(UserError) as e:
        load_spec_dict(data)
    return e.value.problems or [str(e.value)]


def test_the_rules_refuse_what_expert_or_tensor_parallelism_cannot_split():
    load_spec_dict(tiny_moe(ep=2))
    load_spec_dict(tiny_moe(QWEN2, tp=2))
    assert _problems(tiny_moe(ep=3)) == [
        "train.parallel.ep: must divide model.layers.moe.ffn.n_experts (4), got 3: each process holds n_experts / ep "
        "experts; e.g. ep 2, or n_experts 6"]
    no_moe = tiny_moe(ep=2)
    del no_moe["model"]["layers"]
    assert _problems(no_moe) == ["train.parallel.ep: the spec has no MoE layer: expert parallelism spreads an MoE "
                                 "layer's experts over processes; set ep: 1, got 2"]
    (capacity,) = _problems(tiny_moe({"capacity_factor": 1.5}, ep=2))
    assert capacity.startswith("model.layers.moe.ffn.capacity_factor: expert parallelism (train.parallel.ep 2) "
                               "needs dropless routing") and "capacity_factor: null, or ep: 1" in capacity
    (unaligned,) = _problems(tiny_moe({"expert": {"kind": "glu", "hidden_dim": 36}}, ep=2))
    assert unaligned.startswith("train.parallel.ep: expert parallelism runs model.layers.moe.ffn's experts through "
                                "the grouped GEMM") and "(36) to be multiples of 8" in unaligned
    (both,) = _problems(tiny_moe(ep=2, tp=2))
    assert both.startswith("train.parallel.ep: expert parallelism together with tensor parallelism (tp 2) is not "
                           "built yet")
    (hidden,) = _problems(tiny_moe({"expert": {"kind": "glu", "hidden_dim": 40}}, tp=2))
    assert hidden.startswith("train.parallel.tp: must divide model.layers.moe.ffn.expert.hidden_dim (40) into "
                             "slices of a multiple of 8") and hidden.endswith("got 2; e.g. "
                                                                              "model.layers.moe.ffn.expert.hidden_dim 48")
    (shared,) = _problems(tiny_moe({"n_shared_experts": 1, "shared_hidden_dim": 33}, tp=2))
    assert shared.startswith("train.parallel.tp: must divide model.layers.moe.ffn.shared_hidden_dim (33)")
    (bias,) = _problems(tiny_moe({"expert": {"kind": "glu", "hidden_dim": 32, "bias": True}}, tp=2))
    assert bias.startswith("model.layers.moe.ffn.expert.bias: tensor parallelism (train.parallel.tp 2) splits")


def test_one_process_is_the_generated_code_alone():
    """The generated MoE layer is single-device code: no parallel attribute or hook until apply_moe_parallel puts
    them on from outside, and its text names no parallel machinery."""
    from archspec.codegen import generate

    gen = generate(load_spec_dict(tiny_moe(QWEN2)), write=False)
    ffn = gen.Model().blocks[1].ffn
    assert not hasattr(ffn, "parallel") and not hasattr(ffn, "_archspec_moe")
    hooked = [name for name, m in ffn.named_modules() if m._forward_hooks or m._forward_pre_hooks]
    assert hooked == []
    for word in ("parallel", "local_tensor", "dispatch(", "batch_sum", "all_reduce", "process", " tp", "DTensor"):
        assert word not in gen.source, word
