"""The loop: determinism, exact resume, failure handling, accumulation, auxiliary losses, logging, the CLI."""

from __future__ import annotations

import json
import re
import math

import pytest
import torch

from archspec.cli import main
from archspec.console import program
from archspec.registry import Registry
from archspec.train.checkpoint import load_checkpoint
from archspec.train.logger import FAILED, FINISHED, KILLED, NullLogger
from archspec.train.loop import Trainer, train


def run_losses(spec, tmp_path, name, cache, **kw):
    return train(spec, run_dir=tmp_path / name, cache=cache, **kw)


def test_same_seed_same_curve_other_seed_other_curve(make_spec, tmp_path, cache):
    a = run_losses(make_spec(), tmp_path, "a", cache)
    b = run_losses(make_spec(), tmp_path, "b", cache)
    c = run_losses(make_spec(seed=1), tmp_path, "c", cache)
    assert a.status == FINISHED and len(a.losses) == 8
    assert a.losses == b.losses and a.evals == b.evals
    assert a.losses != c.losses
    assert a.losses[-1] < a.losses[0]  # it learns


def test_resume_after_a_crash_reproduces_the_uninterrupted_run_exactly(make_spec, tmp_path, cache):
    # dropout and accumulation make the RNG state and the data position matter
    spec = make_spec(model={"dropout": 0.1}, grad_accum=2, checkpoint_interval=4)
    whole = run_losses(spec, tmp_path, "whole", cache)

    crashing = Trainer(spec, run_dir=tmp_path / "crash", cache=cache)
    calls = {"n": 0}

    def crash_in_step_6(module, args):
        calls["n"] += module.training  # evaluation forwards do not count
        if calls["n"] > 5 * spec.train.grad_accum:
            raise RuntimeError("simulated crash")

    crashing.model.register_forward_pre_hook(crash_in_step_6)
    logger = NullLogger()
    crashing.logger = logger
    with pytest.raises(RuntimeError, match="simulated crash"):
        crashing.run()
    assert logger.status == FAILED and "at step 6" in logger.error
    assert load_checkpoint(tmp_path / "crash")["step"] == 4

    resumed = train(spec, resume=tmp_path / "crash", cache=cache)
    assert resumed.step == 8 and resumed.run_dir == tmp_path / "crash"
    assert resumed.losses == whole.losses[4:]  # exact, not approximate
    assert resumed.evals == whole.evals[1:]
    final = [load_checkpoint(tmp_path / d)["model"] for d in ("whole", "crash")]
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])


def test_non_finite_loss_fails_the_run_and_keeps_the_last_good_checkpoint(make_spec, tmp_path, cache):
    spec = make_spec(checkpoint_interval=2)
    trainer = Trainer(spec, run_dir=tmp_path / "nan", cache=cache, logger=(logger := NullLogger()))
    steps = {"n": 0}

    def poison_step_3(module, args, output):
        steps["n"] += module.training
        return output * float("nan") if steps["n"] == 3 else output

    trainer.model.final_norm.register_forward_hook(poison_step_3)
    result = trainer.run()
    assert result.status == FAILED and result.step == 2
    assert result.error == "non-finite loss (nan) at step 3"
    assert logger.status == FAILED and logger.error == result.error
    assert result.checkpoint == tmp_path / "nan" / "checkpoint.pt" and load_checkpoint(result.checkpoint)["step"] == 2
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())  # the bad update was not applied
    assert ("checkpoint", str(result.checkpoint)) in logger.artifacts


def test_non_finite_gradient_fails_before_the_update(make_spec, tmp_path, cache):
    trainer = Trainer(make_spec(), run_dir=tmp_path / "inf", cache=cache)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.model.tok_emb.weight.register_hook(lambda grad: grad * float("inf"))
    result = trainer.run()
    assert result.status == FAILED and result.error.startswith("non-finite gradient norm") and "step 1" in result.error
    assert result.checkpoint is None  # nothing good to keep yet
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_interrupt_ends_the_run_killed_and_propagates(make_spec, tmp_path, cache):
    trainer = Trainer(make_spec(), run_dir=tmp_path / "int", cache=cache, logger=(logger := NullLogger()))
    calls = {"n": 0}

    def ctrl_c_in_step_3(module, args):
        calls["n"] += module.training
        if calls["n"] == 3:
            raise KeyboardInterrupt

    trainer.model.register_forward_pre_hook(ctrl_c_in_step_3)
    with pytest.raises(KeyboardInterrupt):
        trainer.run()
    assert logger.status == KILLED and logger.error == "interrupted at step 2; checkpoint saved at step 2"
    assert logger.summary["steps"] == 2
    assert load_checkpoint(tmp_path / "int")["step"] == 2  # checkpoint_interval 0, and still nothing is lost


def test_gradient_accumulation_matches_the_larger_batch(make_spec, tmp_path, cache):
    big = run_losses(make_spec(batch_size=8), tmp_path, "big", cache)
    accumulated = run_losses(make_spec(batch_size=4, grad_accum=2), tmp_path, "acc", cache)
    assert accumulated.losses == pytest.approx(big.losses, rel=1e-5)


def test_auxiliary_losses_are_added_and_logged(make_spec, tmp_path, cache):
    trainer = Trainer(make_spec(steps=3), run_dir=tmp_path / "aux", cache=cache, logger=(logger := NullLogger()))
    model = trainer.model
    model.auxiliary_losses = lambda: {"balance": 10.0 * model.final_norm.weight.square().mean()}
    trainer.run()
    aux = [v for _, k, v in logger.metrics if k == "aux_balance"]
    assert len(aux) == 3 and aux[0] == pytest.approx(10.0)
    assert aux[-1] < aux[0]  # its gradient reached the weights: the optimizer pulled the norm gain down


def test_logger_sees_the_whole_run(make_spec, tmp_path, cache):
    result = train(make_spec(), run_dir=tmp_path / "log", cache=cache, logger=(logger := NullLogger()))
    info = logger.info
    assert info.run_id == result.run_id and info.spec_name == "tiny" and len(info.data_hash) == 64
    assert info.accounting["params"]["total"] == sum(p.numel() for p in torch.load(
        result.checkpoint, weights_only=True)["model"].values()) - 320 * 32  # tied head stored twice
    keys = {k for _, k, _ in logger.metrics}
    assert {"train_loss", "lr", "grad_norm", "tokens_per_s", "mfu", "val_loss", "val_ppl"} <= keys
    assert [s for s, k, _ in logger.metrics if k == "val_loss"] == [4, 8]
    assert [s for s, k, _ in logger.metrics if k == "train_loss"] == list(range(1, 9))
    val = dict((k, v) for s, k, v in logger.metrics if s == 8 and k.startswith("val"))
    assert val["val_ppl"] == pytest.approx(math.exp(val["val_loss"]))
    assert logger.status == FINISHED and logger.heartbeats >= 2
    assert {k for k, _ in logger.artifacts} == {"model", "checkpoint"}
    for key in ("train_loss", "val_loss", "val_ppl", "tokens_per_s", "mfu", "time_to_first_step_s", "peak_mem_bytes"):
        assert key in logger.summary and math.isfinite(logger.summary[key])
    summary = logger.summary
    # MFU is at most 1, or the run says it is not (the ceiling is never raised to make it so).
    assert 0 < summary["mfu"] <= 1 or summary["mfu_above_ceiling"] == 1.0
    assert summary["mfu_above_ceiling"] == float(max(summary["mfu"], summary["mfu_palm"]) > 1)
    assert summary["mfu_palm"] > summary["mfu"]  # 6N+12LHQT counts all T keys and the norms: a larger count


def test_a_run_beating_the_ceiling_is_flagged_and_leaves_it_alone(make_spec, tmp_path, capsys):
    """A ceiling far below what any run achieves: MFU comes out above 1, flagged, and the cache file is untouched."""
    from archspec.train.throughput import _measurement_key

    cache = tmp_path / "cache"
    cache.mkdir()
    key = _measurement_key(torch.device("cpu"), torch.float32)
    ceiling = {key: {"flops": 1e6, "measured_at": "2026-01-01 00:00 UTC", "how": "test", "load_average": 0.0}}
    (cache / "peak_flops.json").write_text(json.dumps(ceiling))
    before = (cache / "peak_flops.json").read_bytes()
    result = train(make_spec(steps=3), run_dir=tmp_path / "r", cache=cache, device="cpu", progress=True)
    assert (cache / "peak_flops.json").read_bytes() == before
    assert result.metrics["mfu"] > 1 and result.metrics["mfu_above_ceiling"] == 1.0
    assert result.metrics["peak_flops"] == 1e6
    err = capsys.readouterr().err
    # An MFU above 100% is never printed as a figure: the line says the ceiling is too low, and how to fix it.
    assert "MFU not shown: above 100% of this machine's measured matmul rate" in err
    assert not re.search(r"MFU \d", err) and "archspec peak --measure" in err


def test_palm_flops_follow_the_published_formula(make_spec):
    """6N + 12·L·H·Q·T with N the module's parameters less the position table (nanoGPT's estimate_mfu)."""
    from archspec.accounting import account
    from archspec.codegen import generate
    from archspec.train.throughput import palm_train_flops_per_token

    spec = make_spec(model={"attention": {"n_heads": 2, "positional": {"kind": "learned"}}})
    model = generate(spec, write=False).Model()
    n = sum(p.numel() for name, p in model.named_parameters() if "pos" not in name)
    assert n < sum(p.numel() for p in model.parameters())  # the position table exists and was left out
    L, H, Q, T = 2, 2, 16, 32
    acc = account(spec, seq_len=T)
    assert palm_train_flops_per_token(acc, L, H, Q) == 6 * n + 12 * L * H * Q * T


def test_peak_memory_is_the_runs_own(make_spec, tmp_path, cache):
    """Two runs in one process (as a sweep does): the second reports its own peak, not the process's."""
    from pathlib import Path

    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("peak RSS can be reset only on Linux")
    # A first run in this process pays its one-time costs (imports, caches, the CPU ceiling): what is measured is how
    # the second one reports, as in a sweep.
    train(make_spec(steps=2), run_dir=tmp_path / "warm", cache=cache, device="cpu")
    big = torch.ones(100_000_000)  # 400 MB, touched
    hwm = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
               if line.startswith("VmHWM:"))
    del big
    rss = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
               if line.startswith("VmRSS:"))
    if rss > hwm - 350_000_000:  # nothing to tell apart: the freed 400 MB are still resident
        pytest.skip(f"the allocator kept the freed tensor resident (RSS {rss:,} of peak {hwm:,})")
    result = train(make_spec(steps=2), run_dir=tmp_path / "m", cache=cache, device="cpu")
    peak = result.metrics["peak_mem_bytes"]
    assert 0 < peak < hwm - 300_000_000


def test_steps_override_is_validated_like_the_spec(make_spec, tmp_path, cache):
    from archspec.errors import UserError

    with pytest.raises(UserError) as info:
        train(make_spec(warmup_steps=4), steps=0, run_dir=tmp_path / "x", cache=cache)
    assert "train.steps: Input should be greater than or equal to 1, got 0" in info.value.render()


@pytest.fixture
def registry_url_for_train(tmp_path):
    return f"sqlite:///{tmp_path}/registry.db"


def test_cli_trains_and_prints_one_json_object(tmp_path, capsys, corpus_dir):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(f"name: tiny\nmodel: {{vocab_size: 320, context_length: 32, d_model: 32, n_layers: 1, "
                    f"attention: {{n_heads: 2}}}}\ntrain: {{data: {{corpus: {{kind: files, paths: ['{corpus_dir}']}}}}, "
                    f"batch_size: 2, warmup_steps: 1, eval_interval: 2}}\n")
    code = main(["train", str(spec), "--steps", "3", "--no-compile", "--json", "--device", "cpu",
                 "--run-dir", str(tmp_path / "run"), "--set", "train.lr=1e-2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result["status"] == "FINISHED" and result["step"] == 3 and result["compile_s"] == 0.0
    assert {"val_loss", "val_ppl", "tokens_per_s", "mfu", "train_loss"} <= set(result)
    assert (tmp_path / "run" / "checkpoint.pt").exists() and (tmp_path / "run" / "tiny.py").exists()

    registry = Registry(f"sqlite:///{tmp_path}/registry.db")  # the default, per the autouse fixture
    run = registry.get_run(result["run_id"])
    assert run.status == "FINISHED" and run.summary["val_loss"] == pytest.approx(result["val_loss"])
    assert [p.step for p in registry.metric_history(result["run_id"], "train_loss")] == [1, 2, 3]
    assert ("checkpoint", str(tmp_path / "run" / "checkpoint.pt")) in registry.artifacts(result["run_id"])

    # The same command again trains again, as a new run: the finished one keeps its metrics, summary and checkpoint.
    first = registry.get_run(result["run_id"])
    points = registry.count_metrics(result["run_id"])
    ckpt = (tmp_path / "run" / "checkpoint.pt").read_bytes()
    code = main(["train", str(spec), "--steps", "3", "--no-compile", "--json", "-q", "--device", "cpu",
                 "--run-dir", str(tmp_path / "run"), "--set", "train.lr=1e-2"])
    out, err = capsys.readouterr()
    assert code == 2 and "needs a directory of its own" in err  # its directory holds the finished run's checkpoint
    assert main(["train", str(spec), "--steps", "3", "--no-compile", "--json", "-q", "--device", "cpu",
                 "--run-dir", str(tmp_path / "run2"), "--set", "train.lr=1e-2"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["run_id"] != result["run_id"] and again["train_loss"] == result["train_loss"]  # deterministic
    repeat = registry.get_run(again["run_id"])
    assert repeat.status == "FINISHED" and repeat.tags["repeat_of"] == result["run_id"]
    kept = registry.get_run(result["run_id"])
    assert (kept.status, kept.attempt, kept.summary, kept.ended) == (first.status, 1, first.summary, first.ended)
    assert registry.count_metrics(result["run_id"]) == points
    assert (tmp_path / "run" / "checkpoint.pt").read_bytes() == ckpt
    # A third time: the next repeat id, both earlier runs kept.
    assert main(["train", str(spec), "--steps", "3", "--no-compile", "--json", "-q", "--device", "cpu",
                 "--set", "train.lr=1e-2"]) == 0
    third = json.loads(capsys.readouterr().out)["run_id"]
    assert len({result["run_id"], again["run_id"], third}) == 3
    assert [registry.get_run(r).status for r in (result["run_id"], again["run_id"], third)] == ["FINISHED"] * 3


def test_a_failed_rerun_leaves_the_finished_run_whole(make_spec, tmp_path, cache, registry_url_for_train):
    """A repeat that dies does not touch the finished run (it used to end the same run KILLED)."""
    from archspec.registry import RegistryLogger

    spec = make_spec(steps=3)
    done = train(spec, run_dir=tmp_path / "a", cache=cache, logger=RegistryLogger(registry_url_for_train,
                                                                                   rerun_finished=True))
    trainer = Trainer(spec, run_dir=tmp_path / "b", cache=cache,
                      logger=RegistryLogger(registry_url_for_train, rerun_finished=True))
    assert trainer.run_id != done.run_id
    calls = {"n": 0}

    def ctrl_c_in_step_2(module, args):
        calls["n"] += module.training
        if calls["n"] == 2:
            raise KeyboardInterrupt

    trainer.model.register_forward_pre_hook(ctrl_c_in_step_2)
    with pytest.raises(KeyboardInterrupt):
        trainer.run()
    registry = Registry(registry_url_for_train)
    assert registry.get_run(done.run_id).status == "FINISHED" and registry.get_run(trainer.run_id).status == "KILLED"
    assert registry.get_run(done.run_id).summary["val_loss"] == pytest.approx(done.metrics["val_loss"])


@pytest.mark.parametrize("args, message", [
    (["--device", "tpu"], "Invalid value for '--device'"),
    (["--steps", "0"], "Invalid value for '--steps'"),
    (["--set", "train.batch_size=-1"], "train.batch_size"),
])
def test_cli_bad_input_exits_2(tmp_path, capsys, args, message):
    spec = tmp_path / "tiny.yaml"
    spec.write_text("name: tiny\n")
    assert main(["train", str(spec), "--run-dir", str(tmp_path / "run"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_missing_spec_exits_2(tmp_path, capsys):
    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    assert "no such spec file" in capsys.readouterr().err


@pytest.mark.slow
def test_per_block_compile_trains_like_eager(make_spec, tmp_path, cache):
    eager = run_losses(make_spec(steps=3, warmup_steps=1), tmp_path, "eager", cache)
    compiled = run_losses(make_spec(steps=3, warmup_steps=1), tmp_path, "compiled", cache, compile=True)
    assert compiled.metrics["compile_s"] > 0
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-3)
    state = load_checkpoint(compiled.checkpoint)["model"]
    assert set(state) == set(load_checkpoint(eager.checkpoint)["model"])  # compiling does not rename weights


def test_steps_shorter_than_warmup_cut_the_warmup(make_spec):
    from archspec.train.loop import with_steps

    spec = make_spec(steps=8, warmup_steps=6)
    assert (with_steps(spec, 3).train.steps, with_steps(spec, 3).train.warmup_steps) == (3, 3)
    assert with_steps(spec, 7).train.warmup_steps == 6


def test_a_ddp_run_is_a_different_run(make_spec):
    """N data-parallel replicas train N× the tokens per step: the recipe, and so the run id, says so; one process's id does not
    change (a sweep derives it without starting a world)."""
    from archspec.kinds.base import identity_dump
    from archspec.train.build import run_recipe
    from archspec.train.logger import run_key

    spec = make_spec()
    one, two = run_recipe(spec, world_size=1), run_recipe(spec, world_size=2)
    # the recipe's identity form: Since fields at their defaults (train.fp8_scaling) left out, as every run id takes it
    assert one == identity_dump(spec.train) and two == {**one, "data_parallel": 2}
    assert "fp8_scaling" not in one and one["parallel"] == {"kind": "ddp"}  # (tp, ep, pp at 1: Since, left out)
    assert {k: v for k, v in one.items() if k != "parallel"}.items() <= spec.train.model_dump(mode="json").items()
    assert run_key("m", one, "d", 0) != run_key("m", two, "d", 0)
    assert run_recipe(spec, init_digest="w") == {**one, "init_from": "w"}


def test_ctrl_c_prints_the_resume_command_and_it_resumes(tmp_path, capsys, corpus_dir, monkeypatch):
    import shlex

    spec = tmp_path / "tiny.yaml"
    spec.write_text(f"name: tiny\nmodel: {{vocab_size: 320, context_length: 32, d_model: 32, n_layers: 1, "
                    f"attention: {{n_heads: 2}}}}\ntrain: {{data: {{corpus: {{kind: files, paths: ['{corpus_dir}']}}}}, "
                    f"batch_size: 2, warmup_steps: 1, eval_interval: 2, checkpoint_interval: 2}}\n")
    real_step, calls = Trainer.train_step, {"n": 0}

    def ctrl_c_in_step_3(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "train_step", ctrl_c_in_step_3)
    argv = ["train", str(spec), "--steps", "4", "--no-compile", "--device", "cpu", "-q", "--set", "train.lr=1e-2",
            "--run-dir", str(tmp_path / "run")]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 130
    (line,) = [x for x in err.splitlines() if x.startswith("resume with: ")]
    command = shlex.split(line.removeprefix("resume with: "))
    at = command.index("train")  # after the program as this process was invoked (archspec.console.program)
    assert shlex.join(command[:at]) == program()
    assert command[at:at + 2] == ["train", str(spec)] and "--resume" in command and "train.lr=1e-2" in command
    monkeypatch.setattr(Trainer, "train_step", real_step)
    assert main(command[at:] + ["--no-compile", "-q", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["status"] == "FINISHED" and result["step"] == 4


@pytest.mark.parametrize("load,threads,said", [(18.0, 2, True), (18.0, 1, False), (0.5, 2, False)])
def test_a_busy_cpu_is_named_at_the_start_with_the_thread_fix(make_spec, tmp_path, cache, capsys, monkeypatch,
                                                               load, threads, said):
    """Oversubscribed threads made a tiny run ~20× slower under load: the start says so, and what helps."""
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        train(make_spec(steps=3), run_dir=tmp_path / "r", cache=cache, device="cpu", progress=True)
    finally:
        torch.set_num_threads(before)
    err = capsys.readouterr().err
    assert ("load average 18.0 on 2 cores: torch's 2 threads compete" in err and "OMP_NUM_THREADS=1" in err) == said
