"""Runs on a cluster: the scheduler's job id of each run (`archspec ablate --launcher slurm|slurm-local|ray`).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02

`runs.scheduler_job` is what the launcher that started the run's process calls it: a SLURM job id (`1234`, or
`1234_3` for task 3 of an array), a Ray task id, the pid of submitit's local job; NULL for a run trained in the
command's own process (`--launcher local`, `archspec train`). The host is already in `runs.host`. Downgrade drops it.
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("scheduler_job", sa.String(128), nullable=True))  # no table rebuild


def downgrade() -> None:
    op.execute("ALTER TABLE runs DROP COLUMN scheduler_job")  # as 0003 and 0005 do: no rebuild (and no cascade) of runs
