"""Migration 0007: the stored recipe's process count becomes the data-parallel size (`train.data_parallel`), run ids
unchanged; on SQLite and PostgreSQL, up and down."""

from __future__ import annotations

import json

from alembic import command
from sqlalchemy import text

from archspec.registry import Registry
from archspec.registry.migrate import alembic_config, head_revision
from archspec.train.logger import run_key

from .helpers import make_info, record_run


def _migrate(reg: Registry, to: str, down: bool = False) -> None:
    with reg.engine.connect().execution_options(archspec_write=True) as conn, conn.begin():
        (command.downgrade if down else command.upgrade)(alembic_config(conn), to)


def _stored(reg: Registry, run_id: str) -> tuple[dict, set[str]]:
    with reg.engine.connect() as conn:
        recipe = json.loads(conn.execute(text("SELECT recipe_json FROM runs WHERE id = :i"), {"i": run_id}).scalar())
        keys = {k for (k,) in conn.execute(text("SELECT key FROM run_params WHERE run_id = :i AND key LIKE 'train.%'"),
                                           {"i": run_id})}
    return recipe, keys


def test_a_data_parallel_run_recorded_as_world_size_is_renamed_and_keeps_its_id(registry_url):
    reg = Registry(registry_url)
    two, one = make_info(data_parallel=2), make_info(seed=1)
    for info in (two, one):
        record_run(reg, info, {"val_loss": [(0, 2.0)]})
    _migrate(reg, "0006", down=True)  # as a registry written before tensor parallelism holds it
    recipe, keys = _stored(reg, two.run_id)
    assert recipe["world_size"] == 2 and "data_parallel" not in recipe
    assert "train.world_size" in keys and "train.data_parallel" not in keys
    # the id that recipe had then is the id it has now: the data-parallel size is hashed under its first name
    assert run_key(two.model_hash, recipe, two.data_hash, two.seed) == two.run_id
    reg.close()
    with Registry(registry_url) as reg:
        assert reg.upgrade() == ("0006", head_revision())
        recipe, keys = _stored(reg, two.run_id)
        assert recipe["data_parallel"] == 2 and "world_size" not in recipe
        assert "train.data_parallel" in keys and "train.world_size" not in keys
        assert [r.id for r in reg.runs(where="params.train.data_parallel = 2")] == [two.run_id]
        assert _stored(reg, one.run_id)[0] == one.recipe  # a one-process run has neither: untouched
        assert reg.get_run(two.run_id).metrics == {"val_loss": 2.0}
