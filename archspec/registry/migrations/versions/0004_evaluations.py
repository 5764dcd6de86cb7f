"""Evaluation records: capability probes of trained runs (`archspec probe RUN --task mqar|passkey`).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

Two new tables, nothing else touched: `evaluations` (one probe of one run: task, its parameters, the checkpoint
evaluated) and `evaluation_metrics` (its figures, with a (key, value) index for `probe.<key>` filters). A probe is
recorded beside the run, so a finished run's own record never changes. Downgrade drops both tables.
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

BigIntId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "evaluations",
        sa.Column("id", BigIntId, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("task", sa.String(64), nullable=False),
        sa.Column("params_json", sa.Text(), nullable=False),
        sa.Column("checkpoint", sa.Text(), nullable=False),
        sa.Column("code_version", sa.String(128), nullable=False),
        sa.Column("created", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_evaluations_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_evaluations"),
    )
    op.create_index("ix_evaluations_run_id", "evaluations", ["run_id"])
    op.create_table(
        "evaluation_metrics",
        sa.Column("evaluation_id", BigIntId, nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("value", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(["evaluation_id"], ["evaluations.id"],
                                name="fk_evaluation_metrics_evaluation_id_evaluations", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("evaluation_id", "key", name="pk_evaluation_metrics"),
    )
    op.create_index("ix_evaluation_metrics_key_value", "evaluation_metrics", ["key", "value"])


def downgrade() -> None:
    op.drop_index("ix_evaluation_metrics_key_value", table_name="evaluation_metrics")
    op.drop_table("evaluation_metrics")
    op.drop_index("ix_evaluations_run_id", table_name="evaluations")
    op.drop_table("evaluations")
