"""train.compile modes (issue 32): the spelling, the fallbacks and their reasons, the run id, and equal training.

Three tests compile (per_block, whole, whole under FSDP: tens of seconds each on CPU) and are marked slow; the rest
decide without compiling (archspec.train.compile.resolve_compile) or train eager.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo.utils

from archspec.testing.torchrun import torchrun_command
from archspec.cli import main
from archspec.spec import load_spec_dict
from archspec.spec.legacy import SpecNote
from archspec.train.build import prepare
from archspec.train.compile import CPU_MEASURED, resolve_compile
from archspec.train.data import build_data
from archspec.train.loop import Trainer, train

from .conftest import tiny_spec_dict

CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # a device object only: nothing runs on CUDA here

MOE = {"ffn": {"kind": "moe", "n_experts": 4, "top_k": 2, "expert": {"kind": "glu", "hidden_dim": 32}}}
WINDOW = {"attention": {"n_heads": 2, "n_kv_heads": 1, "sparsity": {"kind": "sliding_window", "window": 8}}}


def test_old_booleans_load_with_a_note_naming_the_new_spelling(make_spec):
    for old, new in ((True, "per_block"), (False, "none")):
        with pytest.warns(SpecNote, match=rf"train.compile: {str(old).lower()} is now train.compile: {new}"):
            assert make_spec(compile=old).train.compile == new
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new spellings load without a note
        assert [make_spec(compile=m).train.compile for m in ("auto", "none", "whole")] == ["auto", "none", "whole"]


def test_the_old_boolean_on_the_command_line_says_the_note(tmp_path, corpus_dir, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nmodel: {vocab_size: 320, context_length: 32, d_model: 32, n_layers: 1, attention: "
                    "{n_heads: 2}}\n")
    assert main(["build", str(spec), "--set", "train.compile=true", "--out", str(tmp_path / "gen"),
                 "--registry", f"sqlite:///{tmp_path}/r.db"]) == 0
    assert "note: train.compile: true is now train.compile: per_block" in capsys.readouterr().err


def test_a_bad_mode_exits_2_naming_train_compile(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nmodel: {vocab_size: 320, context_length: 32, d_model: 32, n_layers: 1, attention: "
                    "{n_heads: 2}}\ntrain: {compile: fast}\n")
    assert main(["train", str(spec), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "train.compile" in err and "'fast'" in err and "Traceback" not in err


def test_the_compile_argument_is_checked_too(make_spec, cache, tmp_path):
    from archspec.errors import UserError

    with pytest.raises(UserError, match="train.compile: expected one of auto"):
        Trainer(make_spec(steps=2), device="cpu", cache=cache, compile="fastest", run_dir=tmp_path / "r")


def test_the_run_id_does_not_depend_on_the_compile_mode(corpus_dir, cache):
    ids = set()
    for mode in ("auto", "none", "per_block", "whole", "cudagraphs"):
        spec = load_spec_dict(tiny_spec_dict(corpus_dir, compile=mode))
        ids.add(prepare(spec, build_data(spec, cache)).experiment_id)
    assert len(ids) == 1


def test_cudagraphs_on_cpu_falls_back_to_whole_with_the_reason(make_spec):
    mode, reason = resolve_compile("cudagraphs", make_spec(), CPU)
    assert mode == "whole" and "CUDA graphs need a CUDA device (this run is on cpu)" in reason
    assert resolve_compile("cudagraphs", make_spec(), CUDA) == ("cudagraphs", "train.compile: cudagraphs")


def test_moe_refuses_cudagraphs_with_the_reason(make_spec):
    for device in (CPU, CUDA):
        mode, reason = resolve_compile("cudagraphs", make_spec(model=MOE), device)
        assert mode == "whole" and "MoE routing has data-dependent shapes" in reason
    mode, reason = resolve_compile("auto", make_spec(model=MOE), CUDA)  # auto on CUDA: the next best
    assert mode == "whole" and "MoE" in reason


def test_the_sparse_cpu_path_refuses_cudagraphs_with_the_reason(make_spec):
    mode, reason = resolve_compile("cudagraphs", make_spec(model=WINDOW), CPU)
    assert mode == "whole" and "sliding_window attention takes its blockwise path" in reason
    # on CUDA without dropout the pattern is FlexAttention, inside the graph
    assert resolve_compile("cudagraphs", make_spec(model=WINDOW), CUDA)[0] == "cudagraphs"
    assert "blockwise" in resolve_compile("cudagraphs", make_spec(model={**WINDOW, "dropout": 0.1}), CUDA)[1]


def test_several_processes_refuse_cudagraphs_and_fsdp_keeps_whole(make_spec):
    mode, reason = resolve_compile("cudagraphs", make_spec(), CUDA, processes=2)
    assert mode == "whole" and "2 processes" in reason
    mode, reason = resolve_compile("whole", make_spec(), CUDA, fsdp=True, processes=2)
    assert mode == "whole" and "after fully_shard" in reason
    assert resolve_compile("auto", make_spec(), CUDA, fsdp=True, processes=2)[0] == "per_block"


def test_auto_on_cuda_uses_the_h200_figures(make_spec):
    mode, reason = resolve_compile("auto", make_spec(), CUDA)
    assert mode == "cudagraphs" and "1,234k" in reason


def test_auto_on_cpu_weighs_compile_seconds_against_the_run(make_spec):
    """A few steps never pay for a compile; a long run of a model that compiling speeds up does."""
    short = resolve_compile("auto", make_spec(steps=5), CPU)
    assert short[0] == "none" and "predicted compile + 5 steps" in short[1]
    faster = [m for m in ("per_block", "whole") if any(r["step_ratio"][m] < 1 for r in CPU_MEASURED.values())]
    if faster:  # the measurements say compiling speeds a step up: over enough steps auto compiles
        assert resolve_compile("auto", make_spec(steps=1_000_000), CPU)[0] in faster


def test_no_compile_is_none_in_the_run_tags(make_spec, cache, tmp_path):
    trainer = Trainer(make_spec(steps=2, compile="whole"), device="cpu", cache=cache, compile=False,
                      run_dir=tmp_path / "r")
    assert (trainer.compile_mode, trainer.compile_s) == ("none", 0.0)
    assert trainer.run_info().tags["compile"] == "none"


def _compiled_run(spec, mode, tmp_path, cache):
    """A run compiled as `mode` asks; the graphs it compiled after its warm-up (evaluations included) beside it."""
    trainer = Trainer(spec, device="cpu", cache=cache, compile=mode, run_dir=tmp_path / mode, progress=True)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    result = trainer.run()
    return trainer, result, torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs


@pytest.mark.slow
def test_each_mode_trains_to_the_same_losses_and_evaluates_without_compiling_again(make_spec, tmp_path, cache,
                                                                                     capsys):
    """none vs per_block vs whole (asked as cudagraphs: on CPU it falls back to whole, saying why), three fp32 steps,
    an evaluation after each: equal within rel 1e-4 (fused kernels reorder float sums; measured differences ~1e-6).
    The compiled runs evaluate through their training graphs: nothing compiles after the warm-up."""
    spec = make_spec(steps=3, warmup_steps=1, eval_interval=1, precision="fp32")
    eager = train(spec, run_dir=tmp_path / "none", cache=cache)
    per_block_trainer, per_block, per_block_new = _compiled_run(spec, "per_block", tmp_path, cache)
    capsys.readouterr()
    whole_trainer, whole, whole_new = _compiled_run(spec, "cudagraphs", tmp_path, cache)
    err = capsys.readouterr().err
    assert "compile: whole (train.compile: cudagraphs refused: CUDA graphs need a CUDA device" in err
    assert whole_trainer.compile_mode == "whole" and whole_trainer.run_info().tags["compile"] == "whole"
    assert per_block_trainer.run_info().tags["compile"] == "per_block"
    assert (per_block_new, whole_new) == (0, 0)  # three evaluations each, no second compile

    for run in (per_block, whole):
        assert run.losses == pytest.approx(eager.losses, rel=1e-4)
        assert [v for _, v in run.evals] == pytest.approx([v for _, v in eager.evals], rel=1e-4)
        assert len(run.evals) == 3 and run.metrics["compile_s"] > 0


FSDP_WORKER = """
import gc, json, os, sys
import torch
from archspec.spec import load_spec_dict
from archspec.train.loop import Trainer

spec_json, cache, out = sys.argv[1:]
torch.set_num_threads(1)
trainer = Trainer(load_spec_dict(json.load(open(spec_json))), device="cpu", cache=cache, run_dir=f"{out}/run")
losses = [trainer.train_step().loss for _ in range(3)]
info = {"losses": losses, "mode": trainer.compile_mode, "reason": trainer.compile_reason, "fsdp": trainer.fsdp,
        "tag": trainer.run_info().tags["compile"]}
world = trainer.world
del trainer
gc.collect()  # FSDP's DTensors hold the process group: release them before destroying it
world.close()
if int(os.environ["RANK"]) == 0:
    json.dump(info, open(f"{out}/fsdp.json", "w"))
"""


@pytest.mark.slow
def test_whole_under_fsdp_compiles_after_sharding_and_trains_like_one_process(corpus_dir, tmp_path, cache, make_spec):
    """Two gloo processes, fully_shard per block and root, then the whole-model compile: the losses of one eager
    process on the same global batch (fp32; the gradient sums differ in order only)."""
    import json
    import os
    import subprocess

    steps = {"steps": 3, "warmup_steps": 1, "eval_interval": 3}
    single = train(make_spec(batch_size=8, **steps), run_dir=tmp_path / "single", cache=cache)
    spec = tiny_spec_dict(corpus_dir, batch_size=4, parallel={"kind": "fsdp"}, compile="whole", **steps)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "worker.py").write_text(FSDP_WORKER)
    proc = subprocess.run(
        torchrun_command(2, tmp_path / "worker.py", tmp_path / "spec.json", cache, tmp_path),
        capture_output=True, text=True, timeout=400, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads((tmp_path / "fsdp.json").read_text())
    assert got["fsdp"] and got["mode"] == got["tag"] == "whole" and "after fully_shard" in got["reason"]
    assert got["losses"] == pytest.approx(single.losses, rel=1e-4)
