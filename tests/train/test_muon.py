"""`train.optimizer: muon` (issue 47): torch.optim.Muon for the blocks' 2-D hidden matrices, AdamW for the rest.

The split is checked over every preset and over drawn specs; a few steps lower the loss; a resumed run equals the
uninterrupted one, Muon's momentum included; the settings are identity (adamw, the default, is not); what is not
built is refused at load with one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings

from archspec.testing.torchrun import torchrun_command
from archspec import codegen
from archspec.cli import main
from archspec.spec import canonical_dict, load_spec, load_spec_dict
from archspec.testing import valid_specs
from archspec.train.build import run_recipe
from archspec.train.checkpoint import load_checkpoint
from archspec.train.logger import run_key
from archspec.train.loop import Trainer, train
from archspec.train.optim import MuonWithAdamW, build_optimizer, muon_matrices

SPECS = Path(__file__).resolve().parents[2] / "specs"
PRESETS = sorted(SPECS.glob("*.yaml"))

# Independent of the units' hooks: what a hidden matrix is called in the generated files, and what is never one.
HIDDEN = re.compile(r"^blocks\.\d+\.(attn|ffn)\.(.*\.)?(q|k|v|qkv|o|q_a|q_b|kv_a|kv_b|gate|up|down)_proj\.weight$")
NEVER = re.compile(r"(^tok_emb\.|^lm_head\.|^positions\.|norm|\.bias$|router|_gate\.)")


def _with_muon(spec, **muon):
    data = canonical_dict(spec)
    data["train"]["optimizer"] = {"kind": "muon", **muon}
    return load_spec_dict(data)


def _check_split(spec, model) -> None:
    opt = build_optimizer(model, spec.train, torch.device("meta"), spec.model)
    assert isinstance(opt, MuonWithAdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = [names[id(p)] for g in opt.muon.param_groups for p in g["params"]]
    adamw = [names[id(p)] for g in opt.adamw.param_groups for p in g["params"]]
    # every parameter in exactly one group (a tied embedding/head once)
    assert sorted(muon + adamw) == sorted(names.values()), (set(muon) & set(adamw))
    params = dict(model.named_parameters())
    for name in muon:  # only the blocks' 2-D hidden matrices
        assert params[name].ndim == 2 and name.startswith("blocks.") and not NEVER.search(name), name
    for name in adamw:  # every 2-D projection of attention and FFN is Muon's, nothing else is
        assert not (HIDDEN.match(name) and params[name].ndim == 2), name
    assert muon == muon_matrices(model, spec.model)
    return muon


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_every_preset_splits_into_muon_matrices_and_adamw_for_the_rest(path):
    spec = load_spec(path)
    if spec.model.parametrization == "mup":
        pytest.skip("muon is refused with µP")
    spec = _with_muon(spec)
    with torch.device("meta"):
        model = codegen.generate(spec, write=False).Model()
    assert _check_split(spec, model)  # there was something for Muon to take (a mixer's own projections count)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=valid_specs())
def test_the_split_holds_for_drawn_specs(spec):
    if spec.model.parametrization == "mup" or spec.train.parallel.kind == "fsdp":
        return  # refused with muon (test_what_is_not_built_is_refused_at_load)
    spec = _with_muon(spec)
    with torch.device("meta"):
        model = codegen.generate(spec, write=False).Model()
    _check_split(spec, model)


def test_adamw_is_the_default_and_leaves_every_run_key_as_it_was(make_spec):
    spec = make_spec()
    explicit = load_spec_dict({**canonical_dict(spec), "train": {**canonical_dict(spec)["train"],
                                                                 "optimizer": {"kind": "adamw"}}})
    assert "optimizer" not in run_recipe(spec) and run_recipe(explicit) == run_recipe(spec)
    key = lambda s: run_key("m", run_recipe(s), "d", 0)  # noqa: E731
    keys = {key(spec), key(_with_muon(spec))}
    for change in ({"lr": 0.02}, {"weight_decay": 0.0}, {"momentum": 0.9}, {"nesterov": False}, {"ns_steps": 3},
                   {"adjust_lr_fn": "original"}):
        keys.add(key(_with_muon(spec, **change)))
    assert len(keys) == 8  # each setting is part of what is learned


def test_the_optimizer_uses_muons_settings(make_spec, tmp_path):
    spec = _with_muon(make_spec(lr=1e-2, warmup_steps=0, weight_decay=0.05), lr=0.04, momentum=0.9, nesterov=False,
                      ns_steps=3, adjust_lr_fn="original")
    model = codegen.generate(spec, out_dir=tmp_path).Model()
    opt = build_optimizer(model, spec.train, torch.device("cpu"), spec.model)
    (group,) = opt.muon.param_groups
    assert group["lr"] == pytest.approx(0.04) and group["momentum"] == 0.9 and group["nesterov"] is False
    assert group["ns_steps"] == 3 and group["adjust_lr_fn"] == "original" and group["weight_decay"] == 0.05
    assert all(g["lr"] == pytest.approx(1e-2) for g in opt.adamw.param_groups)
    # defaults: train.lr and train.weight_decay
    opt = build_optimizer(model, _with_muon(make_spec(lr=1e-2, warmup_steps=0)).train, torch.device("cpu"),
                          spec.model)
    assert opt.muon.param_groups[0]["lr"] == pytest.approx(1e-2)
    assert opt.muon.param_groups[0]["weight_decay"] == 0.1


def test_a_few_muon_steps_lower_the_loss(make_spec, tmp_path):
    spec = _with_muon(make_spec(lr=1e-2, warmup_steps=0, weight_decay=0.0))
    torch.manual_seed(0)
    model = codegen.generate(spec, out_dir=tmp_path).Model()
    opt = build_optimizer(model, spec.train, torch.device("cpu"), spec.model)
    x = torch.randint(0, spec.model.vocab_size, (4, 32), generator=torch.Generator().manual_seed(0))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses = []
    for _ in range(10):
        _, loss = model(x[:, :-1], x[:, 1:])
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert losses[-1] < losses[0] - 0.5, losses
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert set(muon_matrices(model, spec.model)) <= moved  # Muon moved its matrices (and AdamW the rest)
    assert "tok_emb.weight" in moved


def test_resume_equals_the_uninterrupted_run(make_spec, tmp_path, cache):
    spec = _with_muon(make_spec(steps=4, warmup_steps=1, eval_interval=4))
    whole = train(spec, run_dir=tmp_path / "whole", cache=cache, device="cpu")
    assert whole.status == "FINISHED"
    first = Trainer(spec, run_dir=tmp_path / "cut", cache=cache, device="cpu")
    first.train_step()
    first.train_step()
    first.save()
    saved = load_checkpoint(tmp_path / "cut")
    assert saved["step"] == 2
    assert any("momentum_buffer" in s for s in saved["optimizer"]["state"].values())  # Muon's state is saved
    resumed = train(spec, resume=tmp_path / "cut", cache=cache, device="cpu")
    assert resumed.status == "FINISHED" and resumed.step == 4
    a, b = load_checkpoint(tmp_path / "whole"), load_checkpoint(tmp_path / "cut")
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    for index, state in a["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, b["optimizer"]["state"][index][key]), (index, key)


def test_an_adamw_checkpoint_does_not_load_into_muon(make_spec, tmp_path):
    spec = make_spec()
    model = codegen.generate(spec, out_dir=tmp_path).Model()
    adamw = build_optimizer(model, spec.train, torch.device("cpu"), spec.model)
    muon = build_optimizer(model, _with_muon(spec).train, torch.device("cpu"), spec.model)
    with pytest.raises(ValueError, match="parameter groups"):
        muon.load_state_dict(adamw.state_dict())


def _run(capsys, spec_file: Path, *sets: str) -> tuple[int, str]:
    code = main(["build", str(spec_file), "--out", str(spec_file.parent / "gen"), *[a for s in sets
                                                                                  for a in ("--set", s)]])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("sets, message", [
    (["train.optimizer={kind: muon, ns_steps: 0}"], "train.optimizer.ns_steps"),
    (["train.optimizer={kind: muon, momentum: 1.0}"], "train.optimizer.momentum"),
    (["train.optimizer={kind: muon, adjust_lr_fn: keller}"], "train.optimizer.adjust_lr_fn"),
    (["train.optimizer={kind: muon, lr: -1}"], "train.optimizer.lr"),
    (["train.optimizer={kind: muon, betas: 0.9}"], "train.optimizer.betas"),
    (["train.optimizer={kind: sgd}"], "train.optimizer"),
    (["train.optimizer={kind: muon}", "train.parallel={kind: fsdp}"], "train.optimizer.kind: muon under "
                                                                        "train.parallel.kind fsdp is not built"),
    (["train.optimizer={kind: muon}", "train.parallel.tp=2"], "train.optimizer.kind: muon with train.parallel.tp"),
    (["train.optimizer={kind: muon}", "train.parallel.pp=2"], "train.optimizer.kind: muon with train.parallel.pp"),
    (["train.optimizer={kind: muon}", "model.parametrization=mup"], "train.optimizer.kind: muon with "
                                                                      "model.parametrization: mup is not built"),
])
def test_what_is_not_valid_or_not_built_is_refused_at_load_in_one_line(tmp_path, capsys, sets, message):
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(yaml.safe_dump({"name": "s", "model": {"vocab_size": 320, "context_length": 32,
                                                                 "d_model": 32, "n_layers": 2,
                                                                 "attention": {"n_heads": 2}}}))
    code, err = _run(capsys, spec_file, *sets)
    assert code == 2, err
    assert message in err and "Traceback" not in err, err


def _muon_step_spectral_norm(width: int, adjust_lr_fn: str) -> float:
    """The spectral norm of one torch.optim.Muon step (lr 0.01, no decay) on a square width × width matrix."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.zeros(width, width))
    w.grad = torch.randn(width, width)
    torch.optim.Muon([w], lr=0.01, weight_decay=0.0, adjust_lr_fn=adjust_lr_fn).step()
    return torch.linalg.matrix_norm(w.detach(), ord=2).item()


def test_the_mup_refusal_states_how_muons_update_scales_with_width(tmp_path, capsys):
    """The reason the refusal gives is the one torch's Muon has: under adjust_lr_fn original the step's spectral norm
    does not move with the width (µP's own condition, so µP would scale it twice); under match_rms_adamw, the default,
    it grows as sqrt(width) (AdamW's RMS), so "already width-independent" (the message until 2026-12-05) was wrong for
    the default, and the message names the rule instead."""
    original = [_muon_step_spectral_norm(w, "original") for w in (32, 128)]
    rms = [_muon_step_spectral_norm(w, "match_rms_adamw") for w in (32, 128)]
    assert original[1] / original[0] == pytest.approx(1.0, rel=0.1)
    assert rms[1] / rms[0] == pytest.approx(2.0, rel=0.1)  # sqrt(128 / 32)
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(yaml.safe_dump({"name": "s", "model": {"vocab_size": 320, "context_length": 32,
                                                                 "d_model": 32, "n_layers": 2,
                                                                 "attention": {"n_heads": 2}}}))
    code, err = _run(capsys, spec_file, "train.optimizer={kind: muon}", "model.parametrization=mup")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "adjust_lr_fn original: already µP's spectral scaling" in err, err
    assert "match_rms_adamw, the default: AdamW's RMS, never composed with µP's rates" in err, err
    assert err.rstrip().endswith("use adamw, or parametrization standard"), err  # whole, not cut at 300 characters
    assert "already width-independent in spectral norm" not in err, err
    assert main(["mup-check", str(spec_file), "--set", "train.optimizer={kind: muon}", "--widths", "32,64",
                 "--both"]) == 2
    err = capsys.readouterr().err
    assert "adjust_lr_fn" in err and "already width-independent" not in err, err


def test_lr_sweep_with_muons_own_rate_is_refused_and_without_it_is_accepted(tmp_path):
    from archspec.ablate.sweep import load_sweep
    from archspec.errors import UserError

    base = yaml.safe_load((SPECS / "llama-like-tiny.yaml").read_text())
    sweep = yaml.safe_load((SPECS / "ablations" / "optimizer.yaml").read_text())
    sweep["base"] = base
    loaded = load_sweep(data=sweep)
    assert [v.spec.train.optimizer.kind for v in loaded.variants] == ["adamw", "muon"]
    sweep["grid"]["train.optimizer"][1] = {"kind": "muon", "lr": 0.02}
    with pytest.raises(UserError, match=r"variant 1 .*train\.optimizer\.lr: lr_sweep sweeps train\.lr"):
        load_sweep(data=sweep)


def test_the_mup_check_runs_a_muon_spec_standard_and_refuses_mup_beside_it(tmp_path, capsys):
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(yaml.safe_dump({"name": "s", "model": {"vocab_size": 320, "context_length": 32,
                                                                 "d_model": 32, "n_layers": 2,
                                                                 "attention": {"n_heads": 2}},
                                         "train": {"optimizer": {"kind": "muon"}}}))
    assert main(["mup-check", str(spec_file), "--widths", "32,64", "--both"]) == 2
    err = capsys.readouterr().err
    assert "--both: µP (model.parametrization: mup) is not built with train.optimizer muon" in err
    assert len(err.strip().splitlines()) == 1, err


def test_two_gloo_processes_with_muon_match_one_process_on_the_same_global_batch(corpus_dir, tmp_path, cache,
                                                                                  make_spec):
    """DDP: each replica holds whole matrices and the averaged gradient, so each takes the one process's Muon step."""
    import json
    import os
    import subprocess

    from tests.train.conftest import tiny_spec_dict
    from tests.train.test_distributed import WORKER

    muon = {"optimizer": {"kind": "muon"}}
    single = train(make_spec(batch_size=8, **muon), run_dir=tmp_path / "single", cache=cache, device="cpu")
    (tmp_path / "spec.json").write_text(json.dumps(tiny_spec_dict(corpus_dir, batch_size=4, **muon)))
    (tmp_path / "worker.py").write_text(WORKER)
    proc = subprocess.run(
        torchrun_command(2, tmp_path / "worker.py", tmp_path / "spec.json", cache, tmp_path),
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0 = json.loads((tmp_path / "result0.json").read_text())
    assert rank0["status"] == "FINISHED" and rank0["tokens"] == single.metrics["tokens"]
    # as AdamW's DDP test: gradients summed in another order round apart (measured: 6e-7 relative)
    assert rank0["losses"] == pytest.approx(single.losses, rel=1e-4)
    assert [v for _, v in rank0["evals"]] == pytest.approx([v for _, v in single.evals], rel=1e-4)
    assert single.losses[-1] < single.losses[0]
