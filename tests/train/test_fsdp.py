"""FSDP2 and activation checkpointing on CPU: two gloo processes sharding the model train like one process on the same
global batch, resume from a sharded checkpoint (in the same or another world size), and checkpointed blocks give the
same losses and gradients as plain ones while keeping fewer activations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from archspec.testing.torchrun import torchrun_command
from archspec.codegen import generate
from archspec.train.logger import run_key
from archspec.train.loop import Trainer, train
from archspec.train.parallel import apply_activation_checkpointing

from .conftest import tiny_spec_dict

ROOT = Path(__file__).resolve().parents[2]

# Under torchrun: "first" trains 3 steps and saves a sharded checkpoint (as a run interrupted after a checkpoint would
# leave it), recording the losses and the full weights and AdamW moments; "resume" continues that run to the end.
WORKER = textwrap.dedent("""
    import gc, json, os, sys
    import torch
    from archspec.spec import load_spec_dict
    from archspec.train.loop import Trainer, train

    mode, spec_json, cache, out = sys.argv[1:]
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    spec = load_spec_dict(json.load(open(spec_json)))
    if mode == "first":
        trainer = Trainer(spec, device="cpu", cache=cache, run_dir=f"{out}/run")
        losses = [trainer.train_step().loss for _ in range(3)]
        trainer.save()
        params = {k: v.full_tensor() for k, v in trainer.model.state_dict().items()}
        moments = {n: trainer.optimizer.state[p]["exp_avg"].full_tensor() for n, p in trainer.model.named_parameters()}
        kinds = sorted({type(p).__name__ for p in trainer.model.parameters()})
        world = trainer.world
        del trainer
        gc.collect()  # FSDP's DTensors hold the process group: release them before destroying it
        world.close()
        if rank == 0:
            torch.save({"params": params, "moments": moments}, f"{out}/full.pt")
            json.dump({"losses": losses, "param_types": kinds}, open(f"{out}/first.json", "w"))
    else:
        result = train(spec, device="cpu", cache=cache, run_dir=f"{out}/run", resume=f"{out}/run")
        json.dump({"losses": result.losses, "status": result.status, "step": result.step},
                  open(f"{out}/resume{rank}.json", "w"))
""")


def _torchrun(tmp_path: Path, mode: str, spec_json: Path, cache: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        torchrun_command(2, tmp_path / "worker.py", mode, spec_json, cache, tmp_path),
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


# A layer of Gated DeltaNet, one of Mamba-2, one of attention: the linear mixers' parameters (A_log, dt_bias, D, the
# depthwise convs, the gated norms) sharded and checkpointed beside attention's.
LINEAR_MIXERS = {"n_layers": 3, "layers": {
    "gdn": {"select": [0], "mixer": {"kind": "gated_deltanet", "n_heads": 2, "chunk_size": 8}},
    "ssm": {"select": [1], "mixer": {"kind": "mamba2", "head_dim": 16, "d_state": 8, "chunk_size": 8}}}}


@pytest.mark.slow
@pytest.mark.parametrize("model", [{}, LINEAR_MIXERS], ids=["attention", "gdn-mamba2-attention"])
def test_fsdp_two_processes_match_one_process_and_resume_from_sharded_checkpoint(corpus_dir, tmp_path, cache,
                                                                                 make_spec, model):
    steps = {"steps": 6, "eval_interval": 6, "warmup_steps": 2}
    single = train(make_spec(model, batch_size=8, **steps), run_dir=tmp_path / "single", cache=cache)

    fsdp = tiny_spec_dict(corpus_dir, batch_size=4, parallel={"kind": "fsdp"}, **steps)  # per process
    fsdp["model"].update(model)
    (tmp_path / "spec.json").write_text(json.dumps(fsdp))
    (tmp_path / "worker.py").write_text(WORKER)
    _torchrun(tmp_path, "first", tmp_path / "spec.json", cache)
    first = json.loads((tmp_path / "first.json").read_text())
    assert first["param_types"] == ["DTensor"]  # really sharded
    # fp32 throughout; the only difference is the order of the gradient sums (reduce-scatter vs one batch mean)
    assert first["losses"] == pytest.approx(single.losses[:3], rel=1e-4)
    if model:
        return  # resharding and resume below are the checkpoint's, not the mixer's: checked once, with attention
    run = tmp_path / "run"
    assert sorted(p.name for p in run.glob("*.dcp")) == ["checkpoint-step00000003.dcp"]
    assert torch.load(run / "checkpoint.pt", weights_only=True)["sharded"] == "checkpoint-step00000003.dcp"

    # The sharded checkpoint loads in another world size: one process gets the same weights and AdamW moments.
    full = torch.load(tmp_path / "full.pt", weights_only=True)
    one = Trainer(load_spec_dict_(fsdp), device="cpu", cache=cache, run_dir=tmp_path / "one", resume=run)
    assert one.step == 3 and not one.fsdp
    for name, value in one.model.state_dict().items():
        assert torch.equal(value, full["params"][name]), name
    for name, p in one.model.named_parameters():
        assert torch.equal(one.optimizer.state[p]["exp_avg"], full["moments"][name]), name

    # And two processes continue the curve from it.
    _torchrun(tmp_path, "resume", tmp_path / "spec.json", cache)
    resumed = json.loads((tmp_path / "resume0.json").read_text())
    assert resumed["status"] == "FINISHED" and resumed["step"] == 6
    assert resumed["losses"] == pytest.approx(single.losses[3:], rel=1e-4)
    assert sorted(p.name for p in run.glob("*.dcp")) == ["checkpoint-step00000006.dcp"]  # the old one superseded


def load_spec_dict_(data: dict):
    from archspec.spec import load_spec_dict

    return load_spec_dict(data)


@pytest.mark.parametrize("layers", [{"n_layers": 3}, LINEAR_MIXERS], ids=["attention", "gdn-mamba2-attention"])
@pytest.mark.parametrize("ac", [{"kind": "full"}, {"kind": "every_k", "k": 2}])
def test_activation_checkpointing_gives_identical_loss_and_gradients(make_spec, ac, layers):
    spec = make_spec(model={**layers, "dropout": 0.1}, activation_checkpointing=ac)
    gen = generate(spec, write=False)
    torch.manual_seed(0)
    plain = gen.Model()
    checkpointed = gen.Model()
    checkpointed.load_state_dict(plain.state_dict())
    chosen = apply_activation_checkpointing(checkpointed, spec.train.activation_checkpointing)
    assert chosen == ([0, 1, 2] if ac["kind"] == "full" else [0, 2])
    idx = torch.randint(0, spec.model.vocab_size, (4, 32), generator=torch.Generator().manual_seed(1))
    results = []
    for model in (plain, checkpointed):
        torch.manual_seed(7)  # the same dropout masks: checkpointing replays the RNG state in its recomputation
        loss = model(idx, idx)[1]
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert torch.equal(loss_a, loss_b)
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name


def test_activation_checkpointing_trains_the_same_curve_and_is_not_identity(make_spec, tmp_path, cache):
    plain = train(make_spec(steps=3, eval_interval=3), run_dir=tmp_path / "a", cache=cache)
    ac = train(make_spec(steps=3, eval_interval=3, activation_checkpointing={"kind": "full"}), run_dir=tmp_path / "b",
               cache=cache)
    assert ac.losses == plain.losses and ac.evals == plain.evals
    # How activations are kept (and how the work is spread) is stored with a run, not part of what it is. (The spec
    # hash still covers the recipe until the model-only hash lands; the recipe part is checked here.)
    recipe = make_spec(activation_checkpointing={"kind": "full"}, parallel={"kind": "fsdp"}).train.model_dump(mode="json")
    assert recipe["activation_checkpointing"] == {"kind": "full"}
    plain_recipe = make_spec().train.model_dump(mode="json")
    assert run_key("h", recipe, "d", 0) == run_key("h", plain_recipe, "d", 0)


@pytest.mark.slow
def test_activation_checkpointing_lowers_measured_peak_memory():
    """Fresh processes (bench/bench_memory.py's worker): peak RSS of building the Trainer and two steps, for a model
    whose activations outweigh its weights, without and with checkpointing; the plan predicts both within 20%."""
    config = ["model.d_model=256", "model.n_layers=6", "model.attention.n_heads=4", "model.attention.n_kv_heads=2",
              "model.ffn.hidden_dim=704", "model.vocab_size=2048", "train.batch_size=8", "train.seq_len=128"]
    bench = str(ROOT / "bench" / "bench_memory.py")
    procs = [subprocess.Popen([sys.executable, bench, "--worker", json.dumps({"overrides": config + extra, "steps": 2})],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for extra in ([], ["train.activation_checkpointing.kind=full"])]
    none, full = [], []
    for proc, into in zip(procs, (none, full)):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        into.append(json.loads(out.strip().splitlines()[-1]))
    none, full = none[0], full[0]
    assert full["measured_bytes"] < 0.8 * none["measured_bytes"]
    for r in (none, full):
        assert 0.8 <= r["planned_bytes"] / r["measured_bytes"] <= 1.2, r
