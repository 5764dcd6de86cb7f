"""Alembic environment for the registry.

`archspec.registry.migrate` runs the migrations programmatically on a connection it already holds (inside the
transaction that also holds the migration lock), passed in `config.attributes["connection"]`. Running the
`alembic` command line against `sqlalchemy.url` works too, for maintainers writing a new revision.
"""

from alembic import context
from sqlalchemy import create_engine

from archspec.registry.migrate import VERSION_TABLE
from archspec.registry.models import Base

config = context.config


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        render_as_batch=True,  # SQLite cannot ALTER most things; batch mode rebuilds the table instead
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.begin() as conn:
        _run(conn)
