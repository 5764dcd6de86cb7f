"""The Trainer in parts (issue 44): `parallelize` applies the layout in one order and says so in the start lines, the
training step asks the layout's step and never the layout, the generated model's hooks are called through their
declared protocol, and the loop stays a size a person can hold."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from archspec import codegen
from archspec.runtime.protocol import HOOKS, TrainingHooks, hooks_of
from archspec.train import pipeline as pipeline_module
from archspec.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[2]
MOE = {"n_layers": 3, "layers": {"moe": {"select": [0, 2], "ffn": {"kind": "moe", "n_experts": 4, "top_k": 2,
                                                                  "expert": {"hidden_dim": 32}}}}}


def test_parallelize_says_what_it_applied_in_its_order(make_spec, tmp_path, cache, capsys):
    spec = make_spec(steps=2, eval_interval=2, activation_checkpointing={"kind": "full"})
    trainer = Trainer(spec, device="cpu", cache=cache, compile=False, run_dir=tmp_path / "r", progress=True)
    assert trainer.par.steps == [f"activation checkpointing {len(trainer.model.blocks)}/{len(trainer.model.blocks)} "
                                 "blocks"]
    trainer.run()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("parallelize:")]
    assert lines == [f"parallelize: activation checkpointing {len(trainer.model.blocks)}/"
                     f"{len(trainer.model.blocks)} blocks"]


def test_an_eager_run_on_one_process_prints_no_parallelize_line(make_spec, tmp_path, cache, capsys):
    trainer = Trainer(make_spec(steps=2, eval_interval=2), device="cpu", cache=cache, compile=False,
                      run_dir=tmp_path / "r", progress=True)
    assert trainer.par.steps == [] and trainer.par.describe() == "parallelize: nothing (one process, eager)"
    trainer.run()
    assert "parallelize:" not in capsys.readouterr().err


def test_the_training_step_does_not_ask_for_the_layout():
    names = set()
    for method in (Trainer.train_step, Trainer._forward_backward):
        tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(method)))
        names |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for word in ("pipeline", "mesh", "fsdp", "layout", "scaler", "hasattr", "getattr"):
        assert word not in names, f"Trainer.train_step asks for {word!r}: that is the step's or the precision's"
    assert {"stepper", "precision", "hooks"} <= names  # (what it asks instead: the guard reads the right code)


def test_the_loop_stays_small_and_no_function_of_the_trainer_is_long():
    loop = ROOT / "archspec" / "train" / "loop.py"
    assert len(loop.read_text().splitlines()) <= 400
    for path in sorted((ROOT / "archspec" / "train").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno + 1 <= 80, f"{path.name}:{node.name} is over 80 lines"


def test_hooks_default_to_nothing_and_call_what_a_model_defines():
    dense = torch.nn.Linear(2, 2)
    hooks = hooks_of(dense)
    assert hooks.auxiliary_losses() == {} and hooks.router_stats() == {}
    hooks.after_micro_batch()
    hooks.after_optimizer_step(lambda t: t)
    calls = []
    dense.after_optimizer_step = lambda all_sum=None: calls.append(all_sum)
    dense.auxiliary_losses = lambda: {"x": torch.ones(())}
    total = (lambda t: t)
    hooks.after_optimizer_step(total)  # looked up at the call: a hook set later counts
    assert calls == [total] and set(hooks.auxiliary_losses()) == {"x"}
    assert set(HOOKS) == {n for n in TrainingHooks.__dict__ if not n.startswith("_")} - {"__init__"}


def test_pipeline_stage_shares_of_the_auxiliary_losses_sum_to_the_models(make_spec):
    """The pipeline learns which layers have auxiliary losses through the model's hooks (no attribute names), and
    each stage's share (its layers' losses / the model's count of such layers) sums to the model's mean."""
    spec = make_spec(MOE)
    torch.manual_seed(0)
    model = codegen.generate(spec, write=False).Model()
    layers, names = pipeline_module._auxiliary_layers(model, torch.device("cpu"))
    assert layers == [0, 2] and names == ["moe_aux", "moe_z"]
    model(torch.randint(0, spec.model.vocab_size, (2, 8)), torch.randint(0, spec.model.vocab_size, (2, 8)))
    whole = model.auxiliary_losses()
    stage = SimpleNamespace(model=model, hooks=hooks_of(model), aux_layers=layers, aux_names=names,
                            n_aux=len(layers), state=pipeline_module._StageState())
    shares = [pipeline_module.Pipeline._auxiliary_losses(stage, a, b, False) for a, b in ((0, 2), (2, 3))]
    for name in names:
        assert sum(share[name] for share in shares).item() == pytest.approx(whole[name].item(), rel=1e-6)
