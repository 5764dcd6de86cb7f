"""Housekeeping: free-text notes on runs, and a run's display name (`archspec runs note`, `archspec runs rename`).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

`run_notes` holds every note of a run, oldest first (the latest is the run's `note`); a table of its own so that a
note survives a restart of the run (which rewrites the run's writer tags) and keeps its history. `runs.display_name`
is the name a user gave the run (NULL: the spec's name, still in `runs.name`); the run's id never changes. Downgrade
drops both.
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

BigIntId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "run_notes",
        sa.Column("id", BigIntId, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("created", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_run_notes_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_run_notes"),
    )
    op.create_index("ix_run_notes_run_id", "run_notes", ["run_id"])
    op.add_column("runs", sa.Column("display_name", sa.String(128), nullable=True))  # no table rebuild


def downgrade() -> None:
    op.execute("ALTER TABLE runs DROP COLUMN display_name")  # as 0003 does: no rebuild (and no cascade) of runs
    op.drop_index("ix_run_notes_run_id", table_name="run_notes")
    op.drop_table("run_notes")
