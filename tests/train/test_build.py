"""One build, computed once (issue 24): the spec's accounting, its data, its run key and its memory plan are made
once per run by `archspec.train.build.prepare` and passed down; the sweep runner's build is the loop's."""

from __future__ import annotations

import archspec.accounting
from archspec.ablate.runner import check_data, check_fits
from archspec.ablate.sweep import load_sweep
from archspec.spec import canonical_dict
from archspec.train import loop
from archspec.train.build import prepare
from archspec.train.data import build_data
from archspec.train.loop import Trainer


def _count_accountings(monkeypatch) -> list[int]:
    calls = [0]
    real = archspec.accounting.Accounting.__init__

    def counted(self, *args, **kwargs):
        calls[0] += 1
        real(self, *args, **kwargs)

    monkeypatch.setattr(archspec.accounting.Accounting, "__init__", counted)
    return calls


def _count_data(monkeypatch) -> list[int]:
    calls = [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return build_data(*args, **kwargs)

    monkeypatch.setattr(loop, "build_data", counted)
    return calls


def test_a_trainer_accounts_and_plans_once(make_spec, cache, monkeypatch, tmp_path):
    spec = make_spec(steps=2)
    accountings, data = _count_accountings(monkeypatch), _count_data(monkeypatch)
    trainer = Trainer(spec, device="cpu", cache=cache, compile=False, run_dir=tmp_path / "run")
    trainer.run_info()
    trainer.summary([])
    # the run's accounting at seq_len, the spec's at context_length, and the generated banner's: no more, however
    # many places read them (the memory plan, MFU, the run record, the summary, the progress lines)
    assert accountings[0] <= 3, accountings[0]
    assert data[0] == 1
    assert trainer.memory_plan is trainer.build.memory is not None


def test_the_runner_builds_once_and_the_loop_trains_from_that_build(make_spec, cache, monkeypatch, tmp_path):
    import yaml

    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(canonical_dict(make_spec(steps=2))), encoding="utf-8")
    sweep = load_sweep(data={"name": "once", "base": str(base), "seeds": [0, 1], "budget": {"steps": 1},
                             "grid": {"train.lr": [1e-3, 2e-3]}})
    builds = check_fits(sweep.jobs, check_data(sweep.jobs, cache), "cpu")
    assert {b.experiment_id for b in builds.values()} == {prepare(j.spec, build_data(j.spec, cache)).experiment_id
                                                          for j in sweep.jobs}
    data = _count_data(monkeypatch)
    job = sweep.jobs[0]
    trainer = Trainer(job.spec, device="cpu", cache=cache, compile=False, run_dir=tmp_path / "r",
                      build=builds[job.key])
    assert data[0] == 0  # the runner's data, not prepared again
    assert trainer.run_id == builds[job.key].experiment_id and trainer.memory_plan is builds[job.key].memory


def test_a_build_for_another_world_is_not_reused(make_spec, cache, tmp_path):
    spec = make_spec(steps=2)
    foreign = prepare(spec, build_data(spec, cache), world_size=2)
    trainer = Trainer(spec, device="cpu", cache=cache, compile=False, run_dir=tmp_path / "w", build=foreign)
    assert trainer.build is not foreign and trainer.build.world_size == 1
    assert trainer.experiment_id != foreign.experiment_id
