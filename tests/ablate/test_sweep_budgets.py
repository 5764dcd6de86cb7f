"""A sweep is its file plus its options (archspec.ablate.budgets): a bare `--status` lists every budget the file has
run at, `report` and the UI find them the same way, and no budget's report overwrites another's."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from archspec.ablate.sweep import load_sweep
from archspec.ablate.budgets import budget_slug, file_budgets, identity_overrides, name_budgets, report_dir
from archspec.cli import main
from archspec.registry import Registry
from tests.registry.helpers import record_run


def write_sweep(workdir, base_spec):
    sweep = {"name": "mini", "base": base_spec, "seeds": [0], "budget": {"steps": 4},
             "grid": {"model.norm.kind": ["layernorm", "rmsnorm"]}}
    path = workdir / "mini.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def record_sweep(reg, sweep, loss: float) -> None:
    """The sweep's runs as `archspec ablate` records them (membership, recipe, val_loss curve), without training."""
    from archspec.ablate.runner import membership
    from archspec.accounting import account
    from archspec.spec import canonical_dict, model_hash
    from archspec.train.build import run_recipe
    from archspec.train.logger import RunInfo

    for job in sweep.jobs:
        spec = job.spec
        info = RunInfo(spec_name=spec.name, model_hash=model_hash(spec), spec_json=canonical_dict(spec),
                       generated_hash="g" * 64, accounting={**account(spec, seq_len=spec.train.seq_len).to_dict(),
                                                            "seq_len": spec.train.seq_len},
                       data_hash="data", seed=job.seed, recipe=run_recipe(spec), sweep=membership(sweep, job),
                       host="testhost")
        value = loss + 0.1 * job.variant.index + 0.01 * job.seed
        record_run(reg, info, {"val_loss": [(1, value + 1), (spec.train.steps, value)]},
                   summary={"val_loss": value, "eval_tokens": 64.0})


@pytest.fixture
def two_budgets(workdir, base_spec, capsys):
    """mini.yaml run as written (4 steps), at --steps 2 --seeds 0,1, and at --steps 2 --set train.lr=0.001: three
    budgets, recorded as `archspec ablate` records them (nothing is trained)."""
    path = write_sweep(workdir, base_spec)
    url = f"sqlite:///{workdir / 'reg.db'}"
    reg = Registry(url)
    for loss, options in ((3.0, {}), (3.5, {"steps": 2, "seeds": [0, 1]}),
                          (3.7, {"steps": 2, "overrides": ["train.lr=0.001"]})):
        record_sweep(reg, load_sweep(path, **options), loss)
    return path, url


def test_every_budget_found_with_its_options_and_runs(two_budgets, capsys, monkeypatch):
    path, url = two_budgets
    budgets = file_budgets(Registry(url), path)
    assert [(b.steps, b.overrides, len(b.run_ids)) for b in budgets] == [
        (None, (), 2), (2, ("train.lr=0.001",), 2), (2, (), 4)]  # as written first, then the latest first
    assert {i for b in budgets for i in b.run_ids} == {r.id for r in Registry(url).runs(where="sweep = 'mini'")}
    # a bare --status lists each with its counts, not zeros
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["ablate", str(path), "--registry", url, "--status"]) == 0
    out = capsys.readouterr().out
    assert "sweep mini (as written)" in out and "sweep mini (--steps 2)" in out
    assert "sweep mini (--steps 2 --set train.lr=0.001)" in out
    # the UI groups the same runs the same way, by name alone
    by_name = name_budgets(Registry(url), "mini")
    assert sorted(sorted(b.run_ids) for b in by_name) == sorted(sorted(b.run_ids) for b in budgets)


def test_reports_of_budgets_do_not_overwrite_each_other(two_budgets, workdir, capsys):
    path, url = two_budgets
    for options in ([], ["--steps", "2", "--seeds", "0,1"], ["--steps", "2", "--set", "train.lr=0.001"]):
        assert main(["report", str(path), "--registry", url, "--json", *options]) == 0  # ablate's report path
    written = workdir / "reports" / "mini"
    assert (written / "mini.html").exists()
    assert (written / "steps-2" / "mini.html").exists()
    assert any(p.name.startswith("steps-2_set-") for p in written.iterdir())
    # each report holds its own budget's runs only
    html = (written / "steps-2" / "mini.html").read_text()
    assert "--steps 2" in html


def test_report_without_options_picks_a_budget_and_names_the_others(two_budgets, capsys):
    path, url = two_budgets
    assert main(["report", str(path), "--registry", url, "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert sum(1 for _ in report["rows"]) == 2
    assert "has run at 3 budgets" in captured.err and "--steps 2" in captured.err


def test_report_by_name_shows_one_budget_and_names_the_others(two_budgets, capsys):
    path, url = two_budgets
    assert main(["report", "mini", "--registry", url, "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    latest = name_budgets(Registry(url), "mini")[0]
    assert sum(row["val loss"].endswith(f"(n={len(latest.run_ids) // 2})") for row in report["rows"]) == 2
    assert "has run at 3 budgets; showing the latest" in captured.err


def test_ui_shows_one_budget_at_a_time(two_budgets):
    from starlette.testclient import TestClient

    from archspec.ui.app import create_app

    path, url = two_budgets
    client = TestClient(create_app(url), base_url="http://127.0.0.1")  # a host the app serves
    data = client.get("/api/sweeps/mini").json()
    assert len(data["budgets"]) == 3
    seen = set()
    for b in data["budgets"]:
        one = client.get("/api/sweeps/mini", params={"budget": b["key"]}).json()
        ids = {r["run"] for r in one["runs"]}
        assert len(ids) == b["runs"] and not ids & seen
        seen |= ids
    assert client.get("/api/sweeps/mini", params={"budget": "nope"}).status_code == 404
    page = client.get("/sweeps/mini").text
    assert "3 budgets" in page


@given(st.lists(st.sampled_from(["train.eval_tokens=8", "train.eval_interval=3", "model.d_model=64",
                                 "train.lr=0.1", "train.compile=none"]), max_size=5))
def test_observation_options_make_no_other_budget(overrides):
    kept = identity_overrides(overrides)
    assert all(not o.startswith(("train.eval_", "train.compile")) for o in kept)
    assert budget_slug(None, overrides) == budget_slug(None, list(reversed(kept)))
    assert (report_dir("s", None, overrides) == report_dir("s")) == (not kept)
