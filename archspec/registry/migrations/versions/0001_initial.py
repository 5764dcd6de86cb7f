"""Initial registry schema: specs with params and accounting, runs with params, tags, metrics, summary, artifacts.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Written out by hand (not imported from archspec.registry.models) so that this revision stays what it was when
later models change; tests/registry/test_migrations.py checks that head matches the models.
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Metric and artifact ids: SQLite only auto-increments an INTEGER PRIMARY KEY.
BigIntId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _param_columns() -> list[sa.Column]:
    return [
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("value_num", sa.Double(), nullable=True),
        sa.Column("value_str", sa.Text(), nullable=True),
    ]


def upgrade() -> None:
    op.create_table(
        "specs",
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("canonical_json", sa.Text(), nullable=False),
        sa.Column("generated_hash", sa.String(64), nullable=True),
        sa.Column("accounting_json", sa.Text(), nullable=False),
        sa.Column("created", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("hash", name="pk_specs"),
    )
    op.create_index("ix_specs_name", "specs", ["name"])

    op.create_table(
        "spec_params",
        sa.Column("spec_hash", sa.String(64), nullable=False),
        *_param_columns(),
        sa.ForeignKeyConstraint(
            ["spec_hash"], ["specs.hash"], name="fk_spec_params_spec_hash_specs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("spec_hash", "key", name="pk_spec_params"),
    )
    op.create_table(
        "spec_accounting",
        sa.Column("spec_hash", sa.String(64), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("value", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["spec_hash"], ["specs.hash"], name="fk_spec_accounting_spec_hash_specs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("spec_hash", "key", name="pk_spec_accounting"),
    )

    op.create_table(
        "runs",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("spec_hash", sa.String(64), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("data_hash", sa.String(64), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("recipe_json", sa.Text(), nullable=False),
        sa.Column("code_version", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("sweep", sa.String(128), nullable=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created", sa.DateTime(), nullable=False),
        sa.Column("started", sa.DateTime(), nullable=True),
        sa.Column("ended", sa.DateTime(), nullable=True),
        sa.Column("heartbeat", sa.DateTime(), nullable=True),
        sa.Column("heartbeat_timeout_s", sa.Double(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["spec_hash"], ["specs.hash"], name="fk_runs_spec_hash_specs"),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
    )
    for column in ("created", "name", "spec_hash", "status", "sweep"):
        op.create_index(f"ix_runs_{column}", "runs", [column])

    op.create_table(
        "run_params",
        sa.Column("run_id", sa.String(64), nullable=False),
        *_param_columns(),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_run_params_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "key", name="pk_run_params"),
    )
    op.create_table(
        "run_tags",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_run_tags_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "key", name="pk_run_tags"),
    )
    op.create_table(
        "metrics",
        sa.Column("id", BigIntId, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("value", sa.Double(), nullable=True),
        sa.Column("time", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_metrics_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_metrics"),
    )
    op.create_index("ix_metrics_run_key_step", "metrics", ["run_id", "key", "step"])
    op.create_table(
        "metric_stats",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("last_value", sa.Double(), nullable=True),
        sa.Column("min_value", sa.Double(), nullable=True),
        sa.Column("max_value", sa.Double(), nullable=True),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_metric_stats_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "key", name="pk_metric_stats"),
    )
    op.create_table(
        "summary_metrics",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("value", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_summary_metrics_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "key", name="pk_summary_metrics"),
    )
    op.create_table(
        "artifacts",
        sa.Column("id", BigIntId, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("created", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_artifacts_run_id_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_artifacts"),
    )
    op.create_index("ix_artifacts_run_id", "artifacts", ["run_id"])


def downgrade() -> None:
    for table in ("artifacts", "summary_metrics", "metric_stats", "metrics", "run_tags", "run_params", "runs",
                  "spec_accounting", "spec_params", "specs"):
        op.drop_table(table)
