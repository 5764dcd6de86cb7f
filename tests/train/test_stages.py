"""Pipeline stages by cost (archspec.train.stages) and the per-process memory plan under pp (archspec.memory)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archspec import memory
from archspec.memory import plan_memory
from archspec.spec import load_spec, load_spec_dict
from archspec.testing.strategies import spec_dicts
from archspec.spec import parse_spec
from archspec.train.stages import layer_costs, plan_stages

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "specs" / "llama-like.yaml"


def _brute_force_cost(spec, stages: int) -> float:
    """The least largest stage cost over every contiguous split, each stage non-empty, computed directly from the
    per-layer costs (every choice of stage boundaries; no dynamic programming)."""
    flops, params, ends = layer_costs(spec)
    n = len(flops)
    total_f = sum(flops) + ends["head_flops"]
    total_p = sum(params) + ends["embed_params"] + ends["head_params"]
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = (0, *cuts, n)
        worst = 0.0
        for k in range(stages):
            a, b = bounds[k], bounds[k + 1]
            f = sum(flops[a:b]) + (ends["head_flops"] if k == stages - 1 else 0)
            p = sum(params[a:b]) + (ends["embed_params"] if k == 0 else 0) + (ends["head_params"] if k == stages - 1
                                                                               else 0)
            worst = max(worst, 0.5 * f / total_f + 0.5 * p / total_p)
        best = min(best, worst)
    return best


def _largest_cost(plan) -> float:
    return max(0.5 * f + 0.5 * p for f, p in plan.shares())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_stages_cover_the_layers_contiguously_at_the_least_largest_cost(data):
    spec = parse_spec(data.draw(spec_dicts(max_layers=8)))
    n = spec.model.n_layers
    stages = data.draw(st.integers(1, min(4, n)))
    plan = plan_stages(spec, stages)
    assert plan.stages == stages
    assert plan.ranges[0][0] == 0 and plan.ranges[-1][1] == n
    assert all(a < b for a, b in plan.ranges)  # every stage non-empty
    assert all(plan.ranges[k][1] == plan.ranges[k + 1][0] for k in range(stages - 1))  # contiguous
    assert _largest_cost(plan) == pytest.approx(_brute_force_cost(spec, stages), rel=1e-12, abs=1e-15)


def test_moe_heavy_layers_do_not_split_by_layer_count():
    """Layers 0-1 dense, 2-3 MoE with many experts: the two stages take three and one layers, not two and two."""
    spec = load_spec_dict({"name": "moe-heavy", "model": {
        "vocab_size": 256, "context_length": 32, "d_model": 64, "n_layers": 4, "attention": {"n_heads": 4},
        "ffn": {"kind": "glu", "hidden_dim": 128},
        "layers": {"moe": {"select": [2, 3], "ffn": {"kind": "moe", "n_experts": 32, "top_k": 2,
                                                      "expert": {"kind": "glu", "hidden_dim": 128}}}}}})
    plan = plan_stages(spec, 2)
    assert plan.ranges == ((0, 3), (3, 4))
    assert _largest_cost(plan) == pytest.approx(_brute_force_cost(spec, 2))


# ── the memory plan per pipeline process ─────────────────────────────────────────────────────────────────────────


def test_a_four_stage_plan_peaks_below_one_process_and_lists_every_process():
    spec = load_spec(LLAMA, ["train.batch_size=8", "train.seq_len=256"])
    one = plan_memory(spec, device="cpu")
    four = plan_memory(spec, device="cpu", world_size=4, pp=4, microbatches=8)
    assert four.total < one.total
    assert [p.process for p in four.per_process] == [0, 1, 2, 3]
    assert four.total == max(p.total for p in four.per_process)
    # every parameter on some process: the processes' shares add up to the model, the tied matrix held twice
    held = sum(p.weights // 4 for p in four.per_process)
    assert held == one.params + spec.model.vocab_size * spec.model.d_model
    assert one.stage_plan is None and one.per_process == () and "stages" not in one.to_dict()


def test_gpipe_keeps_every_micro_batch_and_1f1b_at_most_pp_minus_stage():
    spec = load_spec(LLAMA, ["train.batch_size=8", "train.seq_len=256"])
    gpipe = plan_memory(spec, device="cpu", world_size=4, pp=4, schedule="gpipe", microbatches=8)
    f1b = plan_memory(spec, device="cpu", world_size=4, pp=4, schedule="1f1b", microbatches=8)
    for g, f in zip(gpipe.per_process, f1b.per_process):
        assert g.activations >= f.activations
    assert gpipe.per_process[0].activations > f1b.per_process[0].activations
    assert memory.in_flight("gpipe", 4, 8, 2) == [8]
    assert [memory.in_flight("1f1b", 4, 8, p) for p in range(4)] == [[4], [3], [2], [1]]
    assert memory.in_flight("1f1b", 4, 2, 0) == [2]  # never more than there are micro-batches


@pytest.mark.parametrize("pp,m", [(2, 2), (2, 4), (3, 3), (4, 4), (4, 8), (4, 6)])
def test_interleaved_order_is_torchs(pp, m):
    """schedule_ops' interleaved_1f1b against ScheduleInterleaved1F1B's own per-rank order (torch computes it from
    four attributes; no process group is needed)."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, _ComputationType

    rounds = max(1, m // pp)
    for rank in range(pp):
        schedule = object.__new__(ScheduleInterleaved1F1B)
        schedule.pp_group_size, schedule.n_local_stages, schedule._n_microbatches = pp, 2, m
        schedule.number_of_rounds, schedule.microbatches_per_round = rounds, m // rounds
        theirs = [(a.stage_index // pp, "F" if a.computation_type == _ComputationType.FORWARD else "B")
                  for a in schedule._calculate_single_rank_operations(rank) if a is not None]
        assert memory.schedule_ops("interleaved_1f1b", pp, m, rank) == theirs


def test_refusal_names_a_layout_that_fits():
    spec = load_spec(LLAMA, ["train.batch_size=8", "train.seq_len=1024"])
    asked = plan_memory(spec, device="cpu", world_size=4)
    budget = int(asked.total * 0.6)
    fix, plan = memory.cheapest_layout(spec, asked.setup, budget)
    assert plan.total <= budget and (plan.setup.pp, plan.setup.tp) != (1, 1)
    s = plan.setup
    assert s.batch_size * s.grad_accum * s.dp == 8 * 4  # the same global batch
    # the fix, applied as a user would, is a valid spec with that layout
    applied = load_spec(LLAMA, ["train.batch_size=8", "train.seq_len=1024", *fix.replace("--set ", "").split()])
    assert (applied.train.parallel.tp, applied.train.parallel.pp) == (s.tp, s.pp)
    from dataclasses import replace

    text = memory.refusal(spec, replace(asked, available=budget, available_source="test")).render()
    line = next(x for x in text.splitlines() if "cheapest layout on 4 processes that fits" in x)
    assert f"pp {s.pp}" in line and fix in line
    # cheaper layouts by the ordering's bytes come first: none of them fits
    cost = memory.communication_bytes(spec, s)
    assert cost <= memory.communication_bytes(spec, replace(asked.setup, parallel="fsdp"))


def test_train_dry_run_prints_the_stages_and_refuses_a_bad_pp(capsys):
    from archspec.cli import main

    args = ["train", str(LLAMA), "--dry-run", "--device", "cpu", "--world-size", "4", "--set", "train.parallel.pp=2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "stage 0: layers 0-3 + embedding" in out and "stage 1: layers 4-7 + head" in out
    assert "pipeline process 1 (stage 1): peak" in out
    assert main([*args, "--json"]) == 0
    stages = json.loads(capsys.readouterr().out)["stages"]
    assert [s["layers"] for s in stages] == [[0, 4], [4, 8]]
    assert sum(s["flops_share"] for s in stages) == pytest.approx(1.0)
    assert all(s["memory_bytes"] > 0 and 0 < s["params_share"] < 1 for s in stages)
    bad = ["train", str(LLAMA), "--dry-run", "--device", "cpu", "--world-size", "6", "--set", "train.parallel.pp=4",
           "--set", "train.batch_size=4"]
    assert main(bad) == 2
    err = capsys.readouterr().err
    assert "train.parallel.pp: must divide the number of processes (6), got 4" in err
    assert "Traceback" not in err
