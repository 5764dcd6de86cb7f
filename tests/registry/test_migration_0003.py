"""Revision 0003 on a registry written by the previous archspec (tests/registry/fixtures/registry_0002.db, made by
fixtures/make_registry_0002.py at commit 3b65987): specs merge into one row per model with their names, runs are
re-keyed (the two runs of one experiment under two names become one run key, the other kept under its old id),
sweeps become memberships, and nothing is lost."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from archspec.cli import main
from archspec.registry import Registry, SchemaTooOldError
from archspec.registry.migrate import head_revision
from archspec.spec import canonical_text, load_spec_dict, text_hash
from archspec.train.logger import run_key

FIXTURE = Path(__file__).with_name("fixtures") / "registry_0002.db"
MODEL = {"vocab_size": 256, "context_length": 64, "d_model": 64, "n_layers": 2, "attention": {"n_heads": 4}}
OLD_IDS = {"a0": "c329b8947f79430f", "c0": "f096a2d2a12cb180", "b1": "8d725a18b5b3a1f3"}


@pytest.fixture
def old_registry(tmp_path) -> str:
    path = tmp_path / "registry_0002.db"
    shutil.copy(FIXTURE, path)
    return f"sqlite:///{path}"


def test_the_fixture_is_an_old_registry_that_reads_refuse(old_registry):
    with Registry(old_registry) as reg:
        assert reg.schema_revision == "0002"
        with pytest.raises(SchemaTooOldError, match="archspec registry upgrade"):
            reg.runs()


def test_upgrade_carries_the_old_registry_over(old_registry, capsys):
    assert main(["registry", "upgrade", "--registry", old_registry]) == 0
    assert f"upgraded from revision 0002 to {head_revision()}" in capsys.readouterr().out
    with Registry(old_registry) as reg:
        # One model, three names; keyed by the hash of the model section the old rows stored (a later change to the
        # spec's defaults, e.g. a new model field, makes today's hash of the same YAML differ: that is not this).
        (row,) = reg.specs()
        model = text_hash(canonical_text(row.spec["model"]))
        assert row.hash == model and row.names == ["tiny-a", "tiny-c", "tiny-b"]  # in the order first recorded
        assert set(row.spec) == {"model"} and row.spec["model"]["d_model"] == 64
        assert set(row.params) == {k for k in row.params if k.startswith("model.")}
        assert reg.specs(where="name = 'tiny-c'")[0].hash == model

        runs = {r.name: r for r in reg.runs()}
        assert set(runs) == {"tiny-a", "tiny-b", "tiny-c"}
        a0, c0, b1 = runs["tiny-a"], runs["tiny-c"], runs["tiny-b"]
        assert {r.model_hash for r in runs.values()} == {model}
        # a0 and c0 are one experiment: the better (FINISHED, latest) takes the run key, the other keeps its id.
        key = run_key(model, a0.recipe, "data-v1", 0)
        assert key == run_key(model, c0.recipe, "data-v1", 0)
        assert {a0.id, c0.id} == {key, OLD_IDS["a0"] if c0.id == key else OLD_IDS["c0"]}
        assert b1.id == run_key(model, b1.recipe, "data-v1", 1) and b1.status == "FAILED"
        # Metrics, summaries, params and tags moved with their runs.
        for r in runs.values():
            assert reg.count_metrics(r.id) == len(reg.metric_history(r.id, "val_loss")) > 0
            assert r.summary["val_loss"] == r.metrics["val_loss"]
            assert r.params["train.seq_len"] == 32 and r.tags["device"] == "cpu"
        assert reg.count_metrics() == 5
        # Sweeps became memberships, with the variants their tags recorded.
        assert a0.sweeps == ["s1"] and c0.sweeps == ["s2"] and b1.sweeps == []
        assert a0.memberships["s1"].variant == 0 and c0.memberships["s2"].variant == 1
        assert [r.id for r in reg.runs(where="sweep = 's2'")] == [c0.id]
        assert [r.id for r in reg.runs(where="sweep is null")] == [b1.id]
        # Accounting: the old figures were at train.seq_len 32 or context_length 64 (whichever wrote last), so only
        # those that do not depend on it are kept, until the next build or run records the rest.
        assert a0.accounting_fields.get("params.total") == row.get("params.total") > 0
        assert "flops.forward" not in a0.accounting_fields and row.get("flops.forward") is None


def test_the_upgraded_registry_takes_new_runs_and_builds(old_registry):
    from tests.registry.helpers import accounting, make_info, record_run

    with Registry(old_registry) as reg:
        reg.upgrade()
        spec = load_spec_dict({"name": "tiny-d", "model": MODEL})
        reg.record_spec(spec, None, accounting(spec))
        (row,) = reg.specs(where="name = 'tiny-d'")
        assert "tiny-d" in row.names and row.get("flops.seq_len") == 64 and row.get("flops.forward") > 0
        info = make_info(spec, seed=5)
        record_run(reg, info, {"val_loss": [(0, 1.0)]})
        assert reg.get_run(info.run_id).accounting_fields["flops.seq_len"] == spec.train.seq_len
