"""The filter and sort grammar of `runs list --where/--sort` and `specs list`, and its compilation to SQLAlchemy,
in three modules along their seams:

- `parse`: the language: tokens, grammar, AST, FilterError with the column and a caret (no SQLAlchemy here);
- `fields`: the catalogue: what each field name reads (`resolve_field`), run and spec attributes, accounting,
  metrics and their direction, probes, `FIELDS_HELP`, and the check of metric, summary and probe keys;
- `sql`: the compiler of a parsed filter or sort into WHERE conditions and ORDER BY terms over the registry's models.

This package re-exports the names other modules import, so `from archspec.registry.query import X` keeps working.
"""

from archspec.registry.query.fields import (
    ACCOUNTING_FIELDS,
    FIELDS_HELP,
    HIGHER_IS_BETTER,
    HIGHER_IS_BETTER_SUFFIXES,
    METRIC_AGGREGATES,
    RUN_ATTRS,
    SPEC_ATTRS,
    SPEC_KEY_ROOTS,
    FieldRef,
    best_aggregate,
    check_known_keys,
    higher_is_better,
    resolve_field,
)
from archspec.registry.query.parse import (
    KEYWORDS,
    MAX_NESTING,
    MAX_PREDICATES,
    MAX_SORT_KEYS,
    MAX_TEXT,
    MAX_VALUES,
    And,
    Compare,
    Field,
    FilterError,
    In,
    IsNull,
    Like,
    Literal,
    Node,
    Not,
    Or,
    Token,
    parse_filter,
    parse_sort,
    referenced_fields,
    text_literal,
    tokenize,
)
from archspec.registry.query.sql import compile_filter, compile_sort

__all__ = [
    "FilterError", "Token", "tokenize", "parse_filter", "parse_sort", "compile_filter", "compile_sort",
    "resolve_field", "FieldRef", "FIELDS_HELP", "referenced_fields", "higher_is_better", "check_known_keys",
]
