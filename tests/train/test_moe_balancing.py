"""Bias balancing in the loop (issue 25): the selection bias moves after each optimizer step by the loads of every
micro-batch and data-parallel rank of the step (2 gloo processes update exactly as 1), never by evaluation
forwards; it is in the checkpoint, so a resumed run equals an uninterrupted one."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest
import torch

from archspec.testing.torchrun import torchrun_command
from archspec.train.checkpoint import load_checkpoint
from archspec.train.loop import Trainer, train

from .conftest import tiny_spec_dict

RATE = 0.01
BALANCED = {"ffn": {"kind": "moe", "n_experts": 4, "top_k": 1, "expert": {"hidden_dim": 32}, "score": "sigmoid",
                    "selection_bias": True, "bias_update_rate": RATE, "aux_loss_coef": 0.0}}
BIAS = [f"blocks.{i}.ffn.selection_bias" for i in range(2)]


def _biases(checkpoint) -> list[torch.Tensor]:
    state = load_checkpoint(checkpoint)["model"]
    return [state[k] for k in BIAS]


def test_the_bias_moves_every_step_by_multiples_of_the_rate_and_evaluation_does_not_count(make_spec, tmp_path, cache):
    often = train(make_spec(BALANCED, steps=6, eval_interval=1), run_dir=tmp_path / "often", cache=cache)
    rarely = train(make_spec(BALANCED, steps=6, eval_interval=6), run_dir=tmp_path / "rarely", cache=cache)
    assert often.losses == rarely.losses  # evaluation forwards change nothing that is learned
    for a, b in zip(_biases(often.checkpoint), _biases(rarely.checkpoint)):
        assert torch.equal(a, b)
        steps = a / RATE  # six steps of ±rate (or 0) each: an integer in -6..6, summing to ~0 over the experts
        assert torch.allclose(steps, steps.round(), atol=1e-4) and steps.abs().max() <= 6 and a.abs().sum() > 0
    assert often.metrics["moe.bias_spread"] > 0  # the summary reports it


def test_a_resumed_run_updates_the_bias_as_an_uninterrupted_one(make_spec, tmp_path, cache):
    spec = make_spec(BALANCED, steps=6, eval_interval=3)
    whole = train(spec, run_dir=tmp_path / "whole", cache=cache)
    first = Trainer(spec, run_dir=tmp_path / "cut", cache=cache)
    for _ in range(3):
        first.train_step()
    first.save()
    cut_bias = _biases(tmp_path / "cut" / "checkpoint.pt")
    assert any(b.abs().sum() > 0 for b in cut_bias)  # the bias at step 3 is in the checkpoint
    del first
    resumed = train(spec, resume=tmp_path / "cut" / "checkpoint.pt", cache=cache)
    assert resumed.losses == pytest.approx(whole.losses[3:], rel=1e-6)
    for a, b in zip(_biases(resumed.checkpoint), _biases(whole.checkpoint)):
        assert torch.equal(a, b)


WORKER = textwrap.dedent("""
    import json, os, sys
    import torch
    from archspec.spec import load_spec_dict
    from archspec.train import loop

    spec_json, cache, out = sys.argv[1:]
    torch.set_num_threads(1)
    biases = []
    run = loop.Trainer.run
    def run_and_keep_the_bias(self):  # every rank's own bias at the end (only rank 0 writes the checkpoint)
        result = run(self)
        biases.extend(block.ffn.selection_bias.tolist() for block in self.model.blocks)
        return result
    loop.Trainer.run = run_and_keep_the_bias
    result = loop.train(load_spec_dict(json.load(open(spec_json))), device="cpu", cache=cache, run_dir=f"{out}/run")
    json.dump({"losses": result.losses, "biases": biases}, open(f"{out}/result{os.environ['RANK']}.json", "w"))
""")


def test_two_gloo_processes_with_two_micro_batches_update_the_bias_as_one_process(corpus_dir, tmp_path, cache,
                                                                                  make_spec):
    """One process, batch 8 in one micro-batch; two processes, each batch 2 in two micro-batches: the same global
    batch, so the same summed loads, so the same bias after every step."""
    single = train(make_spec(BALANCED, steps=4, batch_size=8), run_dir=tmp_path / "single", cache=cache)
    data = tiny_spec_dict(corpus_dir, steps=4, batch_size=2, grad_accum=2)
    data["model"].update(BALANCED)
    (tmp_path / "spec.json").write_text(json.dumps(data))
    (tmp_path / "worker.py").write_text(WORKER)
    proc = subprocess.run(
        torchrun_command(2, tmp_path / "worker.py", tmp_path / "spec.json", cache, tmp_path),
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"result{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["losses"] == pytest.approx(single.losses, rel=1e-4)  # the same global batch
    one = _biases(single.checkpoint)
    assert any(b.abs().sum() > 0 for b in one)
    for rank in ranks:  # each rank's bias, not only the checkpointed one: every rank moved by the global loads
        for a, b in zip(rank["biases"], one):
            assert a == b.tolist()
    assert [b.tolist() for b in _biases(tmp_path / "run" / "checkpoint.pt")] == ranks[0]["biases"]
