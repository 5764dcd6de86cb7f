"""Tensor and expert parallelism through the shared loop (issue 29): the layout on a device mesh, the run key that
counts data-parallel replicas (not processes), and CPU gloo jobs whose losses equal one process's on the same global
batch — tp=2, ep=2, dp×tp=2×2 — plus a checkpoint saved under tp=2 that resumes under tp=1 on the same curve.

Tolerance: fp32 throughout; a split matmul sums its partial products in another order (row-parallel projections are
reduce-scattered, the vocabulary-parallel cross-entropy reduces its max and sum over shards), so losses agree to
rel 1e-4 over several AdamW steps, not bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from archspec.testing.torchrun import torchrun_command
from archspec.errors import UserError
from archspec.spec import load_spec_dict
from archspec.train.build import run_recipe
from archspec.train.logger import learning_recipe, run_key
from archspec.train.mesh import Layout
from archspec.train.loop import train

from .conftest import tiny_spec_dict

MODEL = {"d_model": 32, "n_layers": 2, "attention": {"n_heads": 4, "n_kv_heads": 2},
         "ffn": {"kind": "glu", "hidden_dim": 64},
         # layer 1: a small MoE (top-2 of 4 experts), so every kind of split is exercised in one model
         "layers": {"moe": {"select": [1], "ffn": {"kind": "moe", "n_experts": 4, "top_k": 2,
                                                  "expert": {"kind": "glu", "hidden_dim": 32}}}}}
STEPS = {"steps": 5, "eval_interval": 5, "warmup_steps": 1, "checkpoint_interval": 3}


class P:
    def __init__(self, tp=1, ep=1, pp=1):
        self.tp, self.ep, self.pp = tp, ep, pp


# ── the layout (torch-free) ──────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("world,tp,ep", [(1, 1, 1), (2, 2, 1), (2, 1, 2), (4, 2, 1), (4, 2, 2), (8, 2, 2), (8, 4, 2),
                                         (6, 3, 2)])
def test_layout_places_every_rank_once(world, tp, ep):
    layout = Layout.of(P(tp, ep), world)
    assert layout.dp * layout.tp == world and layout.dp % layout.ep == 0
    seen = {tuple(layout.coordinates(r)[k] for k in ("pp", "dp", "tp")) for r in range(world)}
    assert len(seen) == world  # every (dp, tp) place is one process
    for r in range(world):
        c = layout.coordinates(r)
        assert c["dp"] == c["dp_out"] * layout.ep + c["ep"] and 0 <= c["tp"] < tp
        # the processes of one tensor-parallel group are neighbours and read the same data
        assert layout.coordinates(r - c["tp"])["dp"] == c["dp"]


@pytest.mark.parametrize("world,tp,ep,field", [(2, 4, 1, "tp"), (3, 2, 1, "tp"), (4, 2, 4, "ep"), (6, 2, 2, "ep"),
                                               (1, 2, 1, "tp"), (2, 1, 1, None)])
def test_layout_refuses_what_the_processes_cannot_make(world, tp, ep, field):
    if field is None:
        assert Layout.of(P(tp, ep), world).dp == 2
        return
    with pytest.raises(UserError, match=rf"^train\.parallel\.{field}: "):
        Layout.of(P(tp, ep), world)


@pytest.mark.parametrize("world,tp,pp,field", [(4, 2, 2, None), (8, 2, 2, None), (2, 1, 2, None), (6, 2, 3, None),
                                               (3, 1, 2, "pp"), (4, 4, 2, "tp")])
def test_pipeline_stages_take_their_share_of_the_processes(world, tp, pp, field):
    if field is not None:
        with pytest.raises(UserError, match=rf"^train\.parallel\.{field}: "):
            Layout.of(P(tp, pp=pp), world)
        return
    layout = Layout.of(P(tp, pp=pp), world)
    assert layout.dp * layout.tp * layout.pp == world
    # pp outermost: each stage's processes are a contiguous block of ranks, every (pp, dp, tp) place once
    assert {tuple(layout.coordinates(r)[k] for k in ("pp", "dp", "tp")) for r in range(world)} == {
        (s, d, t) for s in range(pp) for d in range(layout.dp) for t in range(tp)}
    assert [layout.coordinates(r)["pp"] for r in range(world)] == sorted(r // (world // pp) for r in range(world))


# ── identity: data-parallel replicas, not processes ─────────────────────────────────────────────────────────────


def test_run_key_counts_data_parallel_replicas_not_processes(corpus_dir):
    one = load_spec_dict(_spec(corpus_dir, batch_size=8))
    tp2 = load_spec_dict(_spec(corpus_dir, batch_size=8, parallel={"kind": "ddp", "tp": 2}))
    dp2 = load_spec_dict(_spec(corpus_dir, batch_size=8))
    r_one, r_tp2, r_dp2 = run_recipe(one), run_recipe(tp2, world_size=2), run_recipe(dp2, world_size=2)
    assert "data_parallel" not in r_tp2 and r_dp2["data_parallel"] == 2
    key = lambda r: run_key("m" * 64, r, "d" * 64, 0)  # noqa: E731
    assert key(r_one) == key(r_tp2)  # tp=2 on 2 processes is one process's experiment
    assert key(r_dp2) != key(r_one)  # two replicas see twice the sequences per step
    # Runs recorded before tensor parallelism stored the replica count as world_size: their keys are unchanged.
    assert key({**r_one, "world_size": 2}) == key(r_dp2)
    # The global batch is what counts: two replicas of 8 are one process's batch of 16 (archspec.train.sampling)
    assert learning_recipe(r_dp2)["batch_size"] == 16 and learning_recipe(r_dp2)["world_size"] == 1
    assert "data_parallel" not in learning_recipe(r_dp2)
    r_16 = run_recipe(load_spec_dict(_spec(corpus_dir, batch_size=16)))
    assert key(r_16) == key(r_dp2)


def test_a_layout_the_spec_cannot_make_is_refused_before_any_process_group(corpus_dir, cache, tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    data = tiny_spec_dict(corpus_dir, parallel={"kind": "ddp", "tp": 2})
    data["model"].update(MODEL)
    spec = load_spec_dict(data)
    with pytest.raises(UserError, match=r"^train\.parallel\.tp: .*\(1\)"):
        train(spec, device="cpu", cache=cache, run_dir=tmp_path / "r")
    import torch.distributed as dist

    assert not dist.is_initialized()


# ── CPU gloo jobs through the shared loop ────────────────────────────────────────────────────────────────────────

# Under torchrun: train the spec to the end and write (rank 0) the losses, evaluations, run id and tokens; or, with a
# step count, stop after that many steps with a checkpoint, as a run interrupted after a checkpoint would leave it.
WORKER = textwrap.dedent("""
    import gc, json, os, sys
    import torch
    from archspec.spec import load_spec_dict
    from archspec.train.loop import Trainer, train

    spec_json, cache, out, stop_after = sys.argv[1:]
    torch.set_num_threads(1)
    spec = load_spec_dict(json.load(open(spec_json)))
    if stop_after != "-":
        trainer = Trainer(spec, device="cpu", cache=cache, run_dir=f"{out}/run")
        losses = [trainer.train_step().loss for _ in range(int(stop_after))]
        trainer.save()
        world = trainer.world
        del trainer
        gc.collect()  # the DTensors hold the process group: release them before destroying it
        world.close()
        result = {"losses": losses}
    else:
        r = train(spec, device="cpu", cache=cache, run_dir=f"{out}/run")
        result = {"losses": r.losses, "evals": r.evals, "run_id": r.run_id, "status": r.status,
                  "tokens": r.metrics.get("tokens")}
    if int(os.environ["RANK"]) == 0:
        json.dump(result, open(f"{out}/result.json", "w"))
""")


def _torchrun(out: Path, spec: dict, cache: Path, n: int, stop_after: str = "-") -> dict:
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(spec))
    (out / "worker.py").write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        torchrun_command(n, out / "worker.py", out / "spec.json", cache, out, stop_after),
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "result.json").read_text())


def _spec(corpus_dir, **train_fields) -> dict:
    data = tiny_spec_dict(corpus_dir, **{**STEPS, **train_fields})
    data["model"].update(MODEL)
    return data


@pytest.fixture(scope="module")
def single(corpus_dir, cache, tmp_path_factory):
    """One process, global batch 8: the curve every layout must reproduce."""
    out = tmp_path_factory.mktemp("single")
    return train(load_spec_dict(_spec(corpus_dir, batch_size=8)), device="cpu", cache=cache, run_dir=out / "run")


@pytest.mark.slow
@pytest.mark.parametrize("name,parallel,procs,batch", [
    ("tp2", {"kind": "ddp", "tp": 2}, 2, 8),  # one replica split in two: the same batch of 8
    ("ep2", {"kind": "ddp", "ep": 2}, 2, 4),  # two replicas of 4 sequences, the experts spread over them
    ("dp2xtp2", {"kind": "fsdp", "tp": 2}, 4, 4),  # two FSDP replicas of 4, each split in two, checkpointed blocks
    ("tp2-compiled", {"kind": "ddp", "tp": 2}, 2, 8),  # per-block compile inside the blocks' checkpoints
])
def test_layouts_train_the_single_process_curve(single, corpus_dir, cache, tmp_path, name, parallel, procs, batch):
    how = {"dp2xtp2": {"activation_checkpointing": {"kind": "full"}},
           "tp2-compiled": {"activation_checkpointing": {"kind": "every_k", "k": 2}, "compile": "per_block"}}
    got = _torchrun(tmp_path / name, _spec(corpus_dir, batch_size=batch, parallel=parallel, **how.get(name, {})),
                    cache, procs)
    assert got["status"] == "FINISHED"
    assert got["losses"] == pytest.approx(single.losses, rel=1e-4)
    assert [v for _, v in got["evals"]] == pytest.approx([v for _, v in single.evals], rel=1e-4)
    assert got["tokens"] == single.metrics["tokens"]  # the same global batch
    if name.startswith("tp2"):  # one replica: one process's experiment, one process's run id (compile and
        # checkpointing are how it is computed, not what)
        assert got["run_id"] == single.run_id


@pytest.mark.slow
def test_a_tp2_checkpoint_resumes_on_one_process_with_the_same_curve(single, corpus_dir, cache, tmp_path):
    first = _torchrun(tmp_path / "tp2", _spec(corpus_dir, batch_size=8, parallel={"kind": "ddp", "tp": 2}), cache, 2,
                      stop_after="3")
    assert first["losses"] == pytest.approx(single.losses[:3], rel=1e-4)
    # The same run continued on one process (tp=1): only how it is computed changes, so it resumes the same run.
    one = load_spec_dict(_spec(corpus_dir, batch_size=8))
    resumed = train(one, device="cpu", cache=cache, run_dir=tmp_path / "tp2" / "run", resume=tmp_path / "tp2" / "run")
    assert resumed.status == "FINISHED" and resumed.step == 5
    assert resumed.losses == pytest.approx(single.losses[3:], rel=1e-4)
