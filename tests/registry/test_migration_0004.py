"""Migration 0004: evaluation records (capability probes) in tables of their own; runs and their rows untouched."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import inspect

from archspec.errors import UserError
from archspec.registry import Registry
from archspec.registry.migrate import alembic_config, head_revision

from .helpers import make_info, record_run


def _migrate(reg: Registry, to: str, down: bool = False) -> None:
    with reg.engine.connect().execution_options(archspec_write=True) as conn, conn.begin():
        (command.downgrade if down else command.upgrade)(alembic_config(conn), to)


def test_upgrade_from_0003_adds_the_evaluation_tables_and_keeps_every_run(registry_url):
    reg = Registry(registry_url)
    info = make_info()
    record_run(reg, info, {"val_loss": [(0, 2.0), (1, 1.5)]}, summary={"val_loss": 1.5})
    _migrate(reg, "0003", down=True)
    assert not {"evaluations", "evaluation_metrics"} & set(inspect(reg.engine).get_table_names())
    reg.close()
    with Registry(registry_url) as old:
        assert old.schema_revision == "0003"
        assert old.upgrade() == ("0003", head_revision())
        assert {"evaluations", "evaluation_metrics"} <= set(inspect(old.engine).get_table_names())
        run = old.get_run(info.run_id)
        assert run.metrics == {"val_loss": 1.5} and run.summary == {"val_loss": 1.5} and run.probes == {}
        first = old.record_evaluation(info.run_id, "passkey", {"distances": [8, 64]},
                                      {"accuracy": 0.5, "accuracy.d8": 1.0, "accuracy.d64": 0.0}, "ckpt.pt", "test")
        second = old.record_evaluation(info.run_id, "mqar", {"pairs": 4}, {"accuracy": 0.25}, "ckpt.pt", "test")
        assert second > first
        run = old.get_run(info.run_id)
        assert run.probes == {"accuracy": 0.25, "mqar.accuracy": 0.25, "passkey.accuracy": 0.5,
                              "accuracy.d8": 1.0, "passkey.accuracy.d8": 1.0, "accuracy.d64": 0.0,
                              "passkey.accuracy.d64": 0.0}
        assert run.summary == {"val_loss": 1.5} and run.metrics == {"val_loss": 1.5}  # the run's record as it was
        assert [r.id for r in old.runs(where="probe.passkey.accuracy.d8 > 0.9 and probe.accuracy < 0.3")] == [
            info.run_id]
        assert old.runs(where="probe.accuracy > 0.3") == []  # the latest probe (mqar, 0.25) is the run's figure
        with pytest.raises(UserError, match="no run 'nope'"):
            old.record_evaluation("nope", "mqar", {}, {"accuracy": 1.0}, "x", "test")
        _migrate(old, "0003", down=True)  # downgrade drops the probes, nothing else
        assert not {"evaluations", "evaluation_metrics"} & set(inspect(old.engine).get_table_names())
    with Registry(registry_url) as again:
        assert again.upgrade() == ("0003", head_revision())
        assert again.get_run(info.run_id).metrics == {"val_loss": 1.5}
