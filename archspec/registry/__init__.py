"""The experiment registry: every spec and run, queryable, nothing lost.

    from archspec.registry import Registry, RegistryLogger, default_url
    reg = Registry()                                          # $ARCHSPEC_REGISTRY or sqlite:///registry/archspec.db
    reg.specs(where="params.active < 20e6")                   # recorded by `archspec build`, before any training
    reg.runs(where="params.model.attention.n_kv_heads = 1 and metrics.val_loss < 3.2", sort="metrics.val_loss")

- `models`: the SQLAlchemy schema; `migrations/`: alembic revisions, applied by `migrate.ensure_schema`.
- `store`: `Registry`, from `engine` (open, schema check, retries), `writes` and `reads` (reads never write);
  `query/`: the filter grammar (`parse`), its fields (`fields`) and its compiler to SQL (`sql`).
- `logger`: `RegistryLogger`, the training loop's `RunLogger`; `install_signal_handlers`, `tracked_run`.
- `cli`: `archspec runs ...` and `archspec specs ...`.
"""

from archspec.registry.logger import RegistryLogger, Terminated, error_text, install_signal_handlers, tracked_run
from archspec.registry.migrate import SchemaTooNewError, SchemaTooOldError
from archspec.registry.query.parse import FilterError
from archspec.registry.store import (
    MetricPoint,
    QueryResult,
    Registry,
    RegistryBusyError,
    RetryPolicy,
    RunActiveError,
    RunFinishedError,
    RunRow,
    SpecRow,
    default_url,
)

__all__ = [
    "Registry", "RegistryLogger", "default_url", "RunRow", "SpecRow", "QueryResult", "MetricPoint", "RetryPolicy",
    "install_signal_handlers", "tracked_run", "error_text", "Terminated", "FilterError", "SchemaTooNewError",
    "SchemaTooOldError", "RegistryBusyError", "RunActiveError", "RunFinishedError",
]
