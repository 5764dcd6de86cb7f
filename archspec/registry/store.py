"""The registry: one class, `Registry`, assembled from its three roles.

    reg = Registry()                                   # $ARCHSPEC_REGISTRY or sqlite:///registry/archspec.db
    reg.runs(where="params.model.attention.n_kv_heads = 1 and params.active < 20e6", sort="metrics.val_loss")

- `engine.py`: opening a database, the schema check, transactions, retries (`RegistryEngine`).
- `writes.py`: recording specs and runs, metrics, statuses, reaping dead runs (`RegistryWriter`).
- `reads.py`: queries and the rows they return (`RegistryReader`, `RunRow`, `SpecRow`). Reads never write.
- `values.py`: flattening and typing of stored values.
"""

from __future__ import annotations

from archspec.registry.engine import DEFAULT_URL, RegistryBusyError, RegistryEngine, RetryPolicy, default_url
from archspec.registry.reads import MetricPoint, QueryResult, RegistryReader, RunRow, SpecRow
from archspec.registry.values import accounting_fields, flatten, run_params, typed_value
from archspec.registry.writes import RegistryWriter, RunActiveError, RunFinishedError


class Registry(RegistryWriter, RegistryReader):
    """A registry database: writes (`RegistryWriter`) and reads (`RegistryReader`) over one `RegistryEngine`.

    Opening one reads its schema revision and nothing else: it creates no file and migrates nothing. The first write
    creates the database or brings its schema to head; `archspec registry upgrade` (`Registry.upgrade()`) does that
    explicitly. See `archspec.registry.engine` for the rules.
    """


__all__ = [
    "Registry", "RegistryEngine", "RegistryReader", "RegistryWriter", "RegistryBusyError", "RetryPolicy",
    "RunActiveError", "RunFinishedError", "MetricPoint", "QueryResult", "RunRow", "SpecRow", "DEFAULT_URL",
    "default_url", "accounting_fields", "flatten", "run_params", "typed_value",
]
