"""The recipe's process count becomes the data-parallel size (`train.data_parallel`).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

With tensor and pipeline parallelism a job's processes are no longer all data-parallel replicas: what changes what is
learned is the data-parallel size, world / (tp · pp). Runs recorded before this revision were all pure data parallel,
so their `world_size` *was* their data-parallel size: each run's stored recipe (`runs.recipe_json`) and its
`train.world_size` param row are renamed to `data_parallel`, values unchanged. Run ids do not change: the run key
hashes the data-parallel size under its first name (archspec.train.logger.learning_recipe). Downgrade renames back.
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _rename(old: str, new: str) -> None:
    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT id, recipe_json FROM runs WHERE recipe_json LIKE :pat"),
                        {"pat": f'%"{old}"%'}).fetchall()
    for run_id, text in rows:
        try:
            recipe = json.loads(text)
        except (TypeError, ValueError):
            continue  # a damaged row stays as it is (reads already report it)
        if not isinstance(recipe, dict) or old not in recipe or new in recipe:
            continue
        recipe[new] = recipe.pop(old)
        conn.execute(sa.text("UPDATE runs SET recipe_json = :j WHERE id = :id"),
                     {"j": json.dumps(recipe, sort_keys=True, default=str), "id": run_id})
    conn.execute(sa.text("UPDATE run_params SET key = :new WHERE key = :old AND run_id NOT IN "
                         "(SELECT run_id FROM run_params WHERE key = :new)"),
                 {"old": f"train.{old}", "new": f"train.{new}"})


def upgrade() -> None:
    _rename("world_size", "data_parallel")


def downgrade() -> None:
    _rename("data_parallel", "world_size")
