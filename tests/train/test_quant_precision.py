"""train.precision fp16 (autocast + dynamic loss scaling, on the CPU) and fp8 (refused without an FP8 CUDA device):
an overflowed step is skipped, never applied; the scale and skipped steps are metrics; the scaler's state resumes;
fp16 tracks fp32; precision is in the run key, and new values leave the old ids alone."""

from __future__ import annotations

import math

import pytest
import torch

from archspec.cli import main
from archspec.errors import UserError
from archspec.spec import load_spec_dict
from archspec.train.checkpoint import load_checkpoint
from archspec.train.logger import NullLogger, run_key
from archspec.train.loop import Trainer
from tests.train.conftest import tiny_spec_dict


def test_an_overflowed_fp16_step_is_skipped_the_scale_halves_and_both_are_recorded(make_spec, tmp_path, cache):
    trainer = Trainer(make_spec(precision="fp16", steps=3, eval_interval=3), run_dir=tmp_path / "fp16", cache=cache,
                      logger=(logger := NullLogger()))
    assert trainer.scaler is not None and trainer.amp_dtype == torch.float16
    trainer.train_step()  # a clean step first: the scale before the overflow is known
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    adam_steps = [s["step"].clone() for s in trainer.optimizer.state.values()]
    scale = trainer.scaler.get_scale()
    hook = trainer.model.tok_emb.weight.register_hook(lambda g: torch.full_like(g, float("inf")))  # finite loss
    stats = trainer.train_step()
    hook.remove()
    assert math.isfinite(stats.loss) and math.isnan(stats.grad_norm)
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())  # nothing applied
    assert [s["step"] for s in trainer.optimizer.state.values()] == adam_steps  # not even Adam's step count
    assert trainer.scaler.get_scale() == scale / 2 and trainer.skipped_steps == 1 and trainer.step == 2
    trainer._record_step(stats)
    recorded = {k: v for s, k, v in logger.metrics if s == 2}
    assert recorded["loss_scale"] == scale / 2 and recorded["skipped_steps"] == 1
    trainer.train_step()  # and training goes on from there
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_the_loss_scaler_resumes_where_it_was(make_spec, tmp_path, cache):
    spec = make_spec(precision="fp16", steps=4, checkpoint_interval=2)
    trainer = Trainer(spec, run_dir=tmp_path / "r", cache=cache)
    trainer.train_step()
    trainer.train_step()
    trainer.scaler.update(1024.0)  # a scale no fresh scaler starts with
    trainer.precision.skipped_steps = 3  # (the loss scaler belongs to the run's Precision)
    trainer.save()
    saved = load_checkpoint(tmp_path / "r")["grad_scaler"]
    assert saved["scale"] == 1024.0 and saved["skipped_steps"] == 3
    resumed = Trainer(spec, run_dir=tmp_path / "r", cache=cache, resume=tmp_path / "r")
    assert resumed.scaler.get_scale() == 1024.0 and resumed.skipped_steps == 3 and resumed.step == 2


def test_fp16_with_loss_scaling_tracks_fp32_on_the_cpu(make_spec, tmp_path, cache):
    losses = {}
    for precision in ("fp32", "fp16"):
        result = Trainer(make_spec(precision=precision, steps=6, eval_interval=6), run_dir=tmp_path / precision,
                         cache=cache).run()
        assert result.status == "FINISHED", result.error
        losses[precision] = result.losses
    # the same batches and init: per-step losses agree to fp16's rounding (a skipped step would show as a gap)
    assert max(abs(a - b) for a, b in zip(losses["fp32"], losses["fp16"])) < 0.05


def test_precision_is_part_of_the_run_key_and_fp8_scaling_leaves_old_ids_alone(corpus_dir):
    from archspec.train.build import run_recipe

    ids = {}
    for precision in ("auto", "fp32", "fp16", "fp8"):
        spec = load_spec_dict(tiny_spec_dict(corpus_dir, precision=precision))
        ids[precision] = run_recipe(spec)
        assert "fp8_scaling" not in ids[precision]  # a Since field at its default: out of the identity
    assert len({run_key("m", recipe, "d", 0) for recipe in ids.values()}) == 4
    rowwise = run_recipe(load_spec_dict(tiny_spec_dict(corpus_dir, precision="fp8", fp8_scaling="rowwise")))
    assert rowwise["fp8_scaling"] == "rowwise"
    assert run_key("m", rowwise, "d", 0) != run_key("m", ids["fp8"], "d", 0)
    with pytest.raises(UserError) as info:
        load_spec_dict(tiny_spec_dict(corpus_dir, precision="fp16", fp8_scaling="rowwise"))
    assert "train.fp8_scaling: applies to train.precision fp8 only" in info.value.render()


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9),
                    reason="this device has FP8: the refusal is for devices without it")
def test_fp8_without_an_fp8_device_exits_2_with_the_reason(corpus_dir, tmp_path, capsys):
    import yaml

    path = tmp_path / "fp8.yaml"
    path.write_text(yaml.safe_dump(tiny_spec_dict(corpus_dir, precision="fp8")))
    rc = main(["train", str(path), "--device", "cpu", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: train.precision fp8: needs a CUDA device with FP8 matmuls"), err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
