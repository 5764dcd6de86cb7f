"""The filter grammar: parsing, precedence, typed comparisons, errors with columns, injection, fuzzing."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, inspect, select
from sqlalchemy.dialects import postgresql, sqlite

from archspec.errors import UserError
from archspec.registry.models import RunRecord
from archspec.registry.query import (
    And,
    Compare,
    FilterError,
    Not,
    Or,
    compile_filter,
    parse_filter,
    parse_sort,
    referenced_fields,
)

from .helpers import INJECTION, populate


@pytest.fixture
def data(registry):
    return registry, populate(registry)


def ids(rows) -> set[str]:
    return {r.id for r in rows}


def names(data, *keys) -> set[str]:
    return {data[1][k] for k in keys}


# ── parsing ──────────────────────────────────────────────────────────────────────────────────────────────────────


def test_precedence_not_and_or():
    node = parse_filter("a = 1 or b = 2 and not c = 3")
    assert isinstance(node, Or)
    left, right = node.items
    assert isinstance(left, Compare) and left.field.name == "a"
    assert isinstance(right, And) and isinstance(right.items[1], Not)
    # Parentheses override; keywords are case-insensitive.
    node = parse_filter("(a = 1 OR b = 2) AnD c = 3")
    assert isinstance(node, And) and isinstance(node.items[0], Or)


def test_literals_numbers_strings_booleans():
    node = parse_filter("params.active < 20e6 and x = 'it''s' and y = \"say \"\"hi\"\"\" and z = true and w >= -1.5e-3")
    values = [item.value.value for item in node.items]
    assert values == [20e6, "it's", 'say "hi"', True, -1.5e-3]


def test_backquoted_field_names_keep_dots_spaces_and_keywords():
    node = parse_filter("metrics.`val loss` < 1 and tags.`and` = 'x'")
    assert [i.field.name for i in node.items] == ["metrics.val loss", "tags.and"]


def test_sort_syntax():
    keys = parse_sort("-metrics.val_loss, name DESC, params.total asc, created")
    assert [(f.name, d) for f, d in keys] == [
        ("metrics.val_loss", True), ("name", True), ("params.total", False), ("created", False)]


def test_referenced_fields():
    assert referenced_fields("a = 1 and (b < 2 or not a > 3)", "-c, b") == ["a", "b", "c"]


@pytest.mark.parametrize(
    "text, column, fragment",
    [
        ("params.model.n_layers >", 24, "expected a value"),
        ("params.model.n_layers >= 8 and", 31, "expected a field name"),
        ("(status = 'FINISHED'", 21, "missing ')'"),
        ("status = 'FINISHED')", 20, "unbalanced ')'"),
        ("name = 'llama", 8, "unterminated string"),
        ("name = llama", 8, "quote text values"),
        ("name ~ 'x'", 6, "unexpected character '~'"),
        ("name 'x'", 6, "expected an operator"),
        ("name in 'x'", 9, "expected '(' after IN"),
        ("name in ('x' 'y')", 14, "expected ',' or ')'"),
        ("name like 3", 11, "quoted pattern"),
        ("name is not 3", 13, "expected NULL"),
        ("and = 1", 1, "keyword AND"),
        ("seed = 1 seed = 2", 10, "expected AND, OR"),
        ("x = 1.2.3", 5, "unexpected character '1'"),
    ],
)
def test_syntax_errors_point_at_the_column(text, column, fragment):
    with pytest.raises(FilterError) as e:
        parse_filter(text)
    assert e.value.column == column
    assert fragment in str(e.value)
    assert isinstance(e.value, UserError)
    # The message echoes the filter and puts a caret under the column.
    echo, caret = e.value.problems
    assert echo == text and caret == " " * (column - 1) + "^"


def test_caret_stays_aligned_with_newlines_and_tabs():
    with pytest.raises(FilterError) as e:
        parse_filter("seed = 1\n\tand ?")
    echo, caret = e.value.problems
    assert echo[len(caret) - 1] == "?"


@pytest.mark.parametrize(
    "text, column, fragment",
    [
        ("params.foo = 1", 1, "unknown field 'params.foo'"),
        ("bogus < 3", 1, "unknown field 'bogus'"),
        ("seed = 1 and metrics.val_loss < 'low'", 33, "numeric; compare it with a number"),
        ("name = 3", 8, "is text; got the number 3"),
        ("status = 'DONE'", 10, "unknown status 'DONE'"),
        ("created > 'yesterday'", 11, "not an ISO date"),
        ("seed like 'x%'", 1, "LIKE needs a text field"),
        ("name like 'a\\'", 11, "lone escape character"),
        ("seed = true", 8, "not a true/false field"),
        ("name = 'a\x00b'", 8, "NUL"),
    ],
)
def test_semantic_errors_point_at_the_column(registry, text, column, fragment):
    with pytest.raises(FilterError) as e:
        registry.runs(where=text)
    assert e.value.column == column and fragment in str(e.value)


def test_specs_refuse_run_only_fields(registry):
    with pytest.raises(UserError, match="not available for specs"):
        registry.specs(where="metrics.val_loss < 3")
    with pytest.raises(UserError, match="run attribute"):
        registry.specs(where="status = 'FINISHED'")


# ── semantics on a real database ─────────────────────────────────────────────────────────────────────────────────


def test_issue_example(data):
    reg, _ = data
    where = "params.model.norm.kind = 'rmsnorm' and (metrics.val_loss < 3.2 or params.model.n_layers >= 8)"
    rows = reg.runs(where=where)
    assert ids(rows) == names(data, "llama0", "wide0")


def test_precedence_changes_results(data):
    reg, _ = data
    a_or_b_and_c = reg.runs(where="name = 'gpt' or name = 'llama' and seed = 1")
    a_or_b__and_c = reg.runs(where="(name = 'gpt' or name = 'llama') and seed = 1")
    assert ids(a_or_b_and_c) == names(data, "gpt0", "llama1")
    assert ids(a_or_b__and_c) == names(data, "llama1")
    assert ids(reg.runs(where="not name = 'llama' and seed = 0")) == names(data, "gpt0", "wide0")
    assert ids(reg.runs(where="not (name = 'llama' and seed = 0)")) == names(data, "llama1", "gpt0", "wide0")


def test_numbers_compare_numerically_and_texts_as_text(data):
    reg, _ = data
    # As text, '512' < '1000' is false and '64' < '100' is false: a numeric comparison is what finds these.
    assert ids(reg.runs(where="params.model.d_model < 100")) == names(data, "llama0", "llama1")
    assert ids(reg.runs(where="params.model.d_model < 1000")) == names(data, "llama0", "llama1", "gpt0", "wide0")
    assert ids(reg.runs(where="params.model.d_model = '64'")) == set()  # a number is not the text '64'
    assert ids(reg.runs(where="params.model.norm.kind > 'm'")) == names(data, "llama0", "llama1", "wide0")
    assert ids(reg.runs(where="params.model.tie_embeddings = true")) == names(data, "llama0", "llama1", "gpt0", "wide0")
    assert ids(reg.runs(where="params.train.compile = false")) == set()


def test_accounting_fields_and_scientific_literals(data):
    reg, _ = data
    small = reg.runs(where="params.active < 2e6")
    assert ids(small) == names(data, "llama0", "llama1", "wide0")
    assert ids(reg.runs(where="params.total >= 20e6 and flops.train > 0 and kv_cache_bytes > 0")) == names(data, "gpt0")
    assert ids(reg.runs(where="params.by_component.ffn > 0 and params.embedding = 16384")) == names(
        data, "llama0", "llama1")


def test_unknown_metric_and_summary_keys_are_errors_with_suggestions(data):
    reg, _ = data
    with pytest.raises(FilterError) as info:
        reg.runs(where="metrics.val_los < 3")
    assert "no run has the metric 'val_los'; did you mean metrics.val_loss?" in str(info.value)
    assert info.value.column == 1
    with pytest.raises(FilterError, match="did you mean metrics.best.val_loss"):
        reg.runs(where="status = 'FINISHED' and metrics.best.val_lss < 3")
    with pytest.raises(FilterError, match=r"invalid sort .*did you mean summary.tok_s"):
        reg.runs(sort="-summary.toks")
    assert ids(reg.runs(where="metrics.train_loss is null")) == names(data, "llama1", "gpt0", "wide0")  # known key


def test_best_is_highest_for_throughput_and_mfu_lowest_for_losses(registry):
    from .helpers import make_info, record_run

    a = record_run(registry, make_info(seed=0), {"val_loss": [(0, 4.0), (1, 3.0), (2, 3.5)],
                                                 "tokens_per_s": [(0, 100.0), (1, 300.0), (2, 200.0)],
                                                 "mfu": [(0, 0.1), (1, 0.4), (2, 0.2)]})
    (row,) = registry.runs()
    assert row.best == {"val_loss": 3.0, "tokens_per_s": 300.0, "mfu": 0.4}
    assert row.min["tokens_per_s"] == 100.0 and row.max["val_loss"] == 4.0
    assert [r.id for r in registry.runs(where="metrics.best.tokens_per_s >= 300 and metrics.best.mfu > 0.3")] == [a]
    assert registry.runs(where="metrics.best.val_loss > 3.2") == []
    assert [r.id for r in registry.runs(where="metrics.min.tokens_per_s = 100")] == [a]


def test_metrics_latest_best_and_summary(data):
    reg, _ = data
    assert ids(reg.runs(where="metrics.val_loss < 3.2")) == names(data, "llama0", "gpt0")  # latest
    assert ids(reg.runs(where="metrics.best.val_loss < 3.2")) == names(data, "llama0", "llama1", "gpt0")  # lowest
    assert ids(reg.runs(where="metrics.max.val_loss > 4.1")) == names(data, "gpt0")
    assert ids(reg.runs(where="summary.tok_s >= 1000")) == names(data, "llama0")
    assert ids(reg.runs(where="metrics.val_loss is null")) == names(data, "wide0")
    assert ids(reg.runs(where="metrics.val_loss is not null and metrics.train_loss is null")) == names(
        data, "llama1", "gpt0")


def test_in_like_not_equal_and_attributes(data):
    reg, _ = data
    assert ids(reg.runs(where="name in ('gpt', 'wide')")) == names(data, "gpt0", "wide0")
    assert ids(reg.runs(where="name not in ('gpt', 'wide')")) == names(data, "llama0", "llama1")
    assert ids(reg.runs(where="params.model.n_layers in (8, 'x')")) == names(data, "gpt0", "wide0")
    assert ids(reg.runs(where="name like 'LL%'")) == names(data, "llama0", "llama1")  # case-insensitive
    assert ids(reg.runs(where="name like 'gp_'")) == names(data, "gpt0")
    assert ids(reg.runs(where="name not like '%a%'")) == names(data, "gpt0", "wide0")
    assert ids(reg.runs(where="status = 'finished'")) == names(data, "llama0", "gpt0")
    assert ids(reg.runs(where="status in ('FAILED', 'running')")) == names(data, "llama1", "wide0")
    assert ids(reg.runs(where="sweep != 's1'")) == names(data, "gpt0")  # a missing sweep is not "!= s1"
    assert ids(reg.runs(where="sweep is null")) == names(data, "wide0")
    assert ids(reg.runs(where="metrics.val_loss != 3.0")) == names(data, "llama1", "gpt0")
    assert ids(reg.runs(where="created > '2000-01-01' and created < '2999-01-01T00:00:00Z'")) == set(data[1].values())
    assert ids(reg.runs(where="tags.note = 'baseline'")) == names(data, "llama0")
    assert ids(reg.runs(where=f"id = '{data[1]['gpt0']}'")) == names(data, "gpt0")


def test_sort_numeric_nulls_last_and_limit(data):
    reg, _ = data
    order = [r.id for r in reg.runs(sort="metrics.val_loss")]
    assert order == [data[1][k] for k in ("gpt0", "llama0", "llama1", "wide0")]
    order = [r.id for r in reg.runs(sort="-metrics.val_loss")]
    assert order == [data[1][k] for k in ("llama1", "llama0", "gpt0", "wide0")]  # no metric: last either way
    # Numeric, not text, order of a param: 64, 64, 128, 512 (as text: 128, 512, 64, 64).
    d_models = [r.get("params.model.d_model") for r in reg.runs(sort="params.model.d_model, seed")]
    assert d_models == [64, 64, 128, 512]
    top = reg.runs(where="metrics.val_loss is not null", sort="metrics.best.val_loss desc", limit=2)
    assert [r.id for r in top] == [data[1]["llama1"], data[1]["llama0"]]  # lowest val_loss: 3.1, 3.0


def test_specs_filter_before_any_training(registry):
    from .helpers import accounting, make_spec

    small, big = make_spec("small"), make_spec("big", d_model=1024, n_layers=24, attention={"n_heads": 16})
    for spec in (small, big):
        registry.record_spec(spec, "g" * 64, accounting(spec))
    assert [s.name for s in registry.specs(where="params.active < 20e6")] == ["small"]
    assert [s.name for s in registry.specs(where="params.model.n_layers >= 8 and params.total > 20e6")] == ["big"]
    assert [s.name for s in registry.specs(sort="-params.active")] == ["big", "small"]


# ── injection: values stay values ────────────────────────────────────────────────────────────────────────────────


def _table_counts(reg) -> dict[str, int]:
    insp = inspect(reg.engine)
    counts = {}
    with reg.engine.connect() as conn:
        for table in insp.get_table_names():
            counts[table] = conn.execute(select(func.count()).select_from(_t(table))).scalar_one()
    return counts


def _t(name):
    from sqlalchemy import table

    return table(name)


@pytest.mark.parametrize("attack", [
    INJECTION,
    "x' OR '1'='1",
    "x\" OR \"1\"=\"1",
    "1; DELETE FROM metrics",
    "') OR 1=1 --",
    "%' ; UPDATE runs SET status = 'FINISHED' ; --",
])
def test_injection_attempts_are_plain_values(data, attack):
    reg, _ = data
    before = _table_counts(reg)
    quoted = "'" + attack.replace("'", "''") + "'"
    expected = names(data, "gpt0") if attack == INJECTION else set()
    assert ids(reg.runs(where=f"sweep = {quoted}")) == expected
    assert ids(reg.runs(where=f"tags.note = {quoted}")) == expected
    assert ids(reg.runs(where=f"name like {quoted} or name in ({quoted}, 'zzz')")) == set()
    back = attack.replace("`", "``")
    assert reg.runs(where=f"tags.`{back}` = 'v'") == []
    with pytest.raises(FilterError, match="no run has the metric"):  # metric keys are checked against the registry
        reg.runs(where=f"metrics.`{back}` < 1 or tags.`{back}` = 'v'")
    with pytest.raises(FilterError, match="unknown spec key"):  # spec keys are known: refused before any SQL
        reg.runs(where=f"params.model.`{back}` = 1")
    assert _table_counts(reg) == before
    assert reg.run_status(data[1]["llama1"]) == "FAILED"


def _sql(text: str, dialect) -> tuple[str, dict]:
    compiled = select(RunRecord.id).where(compile_filter(text)).compile(dialect=dialect)
    return str(compiled), compiled.params


@settings(max_examples=150, deadline=None)
@given(value=st.text(), key=st.text(min_size=1).filter(lambda s: "\x00" not in s))
def test_sql_text_never_depends_on_values_or_keys(value, key):
    """Whatever a literal or a field key holds, the SQL sent is the same: only bound parameters change."""
    for dialect in (sqlite.dialect(), postgresql.dialect()):
        quoted = "'" + value.replace("'", "''") + "'"
        if "\x00" in value:
            with pytest.raises(FilterError):
                _sql(f"tags.note = {quoted}", dialect)
            continue
        sql, params = _sql(f"tags.note = {quoted} and metrics.`{key.replace('`', '``')}` < 1", dialect)
        reference, _ = _sql("tags.note = 'x' and metrics.`k` < 1", dialect)
        assert sql == reference
        assert value in params.values() and key in params.values()


# A grammar-aware fuzzer: random sequences of real tokens (and some junk) reach the parser far deeper than random text.
_FIELDS = ["name", "status", "seed", "sweep", "created", "params.model.d_model", "params.model.norm.kind",
           "params.total", "metrics.val_loss", "metrics.best.val_loss", "summary.tok_s", "tags.note",
           "params.bogus", "nope", "metrics.`a'b`", "runs", "id"]
_PIECES = st.one_of(
    st.sampled_from(_FIELDS),
    st.sampled_from(["=", "!=", "<", "<=", ">", ">=", "<>", "==", "in", "not", "like", "is", "null", "and", "or",
                     "(", ")", ",", "true", "false", "-", ";", "--", "/*", "*/", "'", '"', "`"]),
    st.integers(-10**30, 10**30).map(str),
    st.floats(allow_nan=False).map(repr),
    st.text(max_size=12).map(lambda s: "'" + s.replace("'", "''") + "'"),
    st.text(max_size=6),
)


# ... and well-formed, well-typed filters with hostile values: every one of them must reach the database.
_TEXT = st.text().filter(lambda s: "\x00" not in s)
_QUOTED = _TEXT.map(lambda s: "'" + s.replace("'", "''") + "'")
_NUMBER = st.one_of(st.integers(-10**30, 10**30).map(str), st.floats(allow_nan=False, allow_infinity=False).map(repr))
_INJECTION = "'" + INJECTION.replace("'", "''") + "'"
_TYPED = [  # (fields, literals that fit them)
    (["name", "sweep", "id", "tags.note", "params.model.norm.kind"], st.one_of(_QUOTED, st.just(_INJECTION))),
    (["seed", "params.total", "params.model.d_model", "metrics.val_loss", "metrics.best.val_loss", "summary.tok_s",
      "metrics.`a'b; DROP TABLE runs`", "summary.`x'); --`"], _NUMBER),
    (["status"], st.sampled_from(["'finished'", "'FAILED'", "'Running'"])),
    (["created", "ended"], st.sampled_from(["'2026-01-01'", "'1999-12-31T23:59:59+05:00'"])),
    (["params.model.tie_embeddings"], st.sampled_from(["true", "false"])),
]


def _typed_clause(fields, literal):
    field = st.sampled_from(fields)
    like = _TEXT.map(lambda s: "'" + s.rstrip("\\").replace("'", "''") + "'")
    options = [
        st.builds("{} {} {}".format, field, st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), literal),
        st.builds("{} {}in ({})".format, field, st.sampled_from(["", "not "]),
                  st.lists(literal, min_size=1, max_size=3).map(", ".join)),
        st.builds("{} is {}null".format, field, st.sampled_from(["", "not "])),
    ]
    if fields[0] == "name":
        options.append(st.builds("{} {}like {}".format, field, st.sampled_from(["", "not "]), like))
    return st.one_of(*options)


_FILTERS = st.recursive(st.one_of(*(_typed_clause(f, lit) for f, lit in _TYPED)), lambda inner: st.one_of(
    st.builds("({}) and ({})".format, inner, inner),
    st.builds("{} OR {}".format, inner, inner),
    st.builds("not {}".format, inner),
), max_leaves=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(_PIECES, max_size=12), sort=st.lists(st.sampled_from(_FIELDS + ["-", ",", "desc"]), max_size=4))
def test_fuzz_token_soup_parses_or_fails_cleanly(fuzz_registry, pieces, sort):
    reg, before = fuzz_registry
    text = " ".join(pieces)
    for query in (lambda: reg.runs(where=text, sort=" ".join(sort)), lambda: reg.specs(where=text)):
        try:
            query()
        except UserError:
            pass  # a FilterError with a column, or another input error: never a database error
    assert _table_counts(reg) == before


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_FILTERS, sort=st.sampled_from(["", "metrics.val_loss", "-params.model.d_model, name", "tags.note desc"]))
def test_fuzz_wellformed_filters_with_hostile_values_all_run(fuzz_registry, text, sort):
    reg, before = fuzz_registry
    rows = reg.runs(where=text, sort=sort)  # never refused, never a database error
    assert len(rows) <= 5
    assert _table_counts(reg) == before


@pytest.fixture
def fuzz_registry(registry):
    from .helpers import make_info, record_run, make_spec

    populate(registry)
    # Metric and summary keys are checked against the registry before any SQL: a run that has the hostile keys
    # lets filters on them reach the database, where they must stay bound parameters.
    record_run(registry, make_info(make_spec("hostile"), seed=7), {"a'b; DROP TABLE runs": [(0, 1.0)]},
               summary={"x'); --": 1.0})
    return registry, _table_counts(registry)


def test_unknown_spec_keys_are_refused_with_a_suggestion():
    """A typo in a spec key would match nothing and look like "no such runs"; it is an error instead."""
    with pytest.raises(FilterError, match=r"unknown spec key 'params.model.n_layer'; did you mean params.model.n_layers\?"):
        compile_filter("params.model.n_layer >= 8")
    compile_filter("params.model.attention.positional.theta > 1e4 and params.train.data.corpus.kind = 'stdlib'")


# ── the package's seams ──────────────────────────────────────────────────────────────────────────────────────────

_PARSE_ALONE = textwrap.dedent("""
    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("query_parse_alone", sys.argv[1])
    parse = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = parse
    spec.loader.exec_module(parse)
    node = parse.parse_filter("metrics.val_loss < 3 and not name in ('a', 'b')")
    assert isinstance(node, parse.And), node
    assert parse.referenced_fields("x = 1", "-y") == ["x", "y"]
    try:
        parse.parse_filter("a = (")
    except parse.FilterError as e:
        assert e.column == 5, e.column
    else:
        raise AssertionError("no FilterError")
    loaded = sorted(m for m in sys.modules if m == "sqlalchemy" or m.startswith("sqlalchemy."))
    assert not loaded, loaded[:5]
    print("OK")
""")


def test_the_parser_imports_no_sqlalchemy():
    """The language (query/parse.py) stands alone: loaded by its file path (importing the package would run
    archspec.registry's __init__, which opens the store), it parses, and SQLAlchemy never gets imported."""
    import archspec.registry.query.parse as parse

    proc = subprocess.run([sys.executable, "-c", _PARSE_ALONE, parse.__file__], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "OK", proc.stderr[-2000:]


def test_the_package_re_exports_its_modules_names():
    """`archspec.registry.query` keeps every name it had as one module: each is the submodule's own object."""
    import archspec.registry.query as query
    from archspec.registry.query import fields, parse, sql

    for name in ("FilterError", "Token", "tokenize", "parse_filter", "parse_sort", "referenced_fields", "text_literal",
                 "And", "Or", "Not", "Compare", "In", "Like", "IsNull", "Field", "Literal"):
        assert getattr(query, name) is getattr(parse, name), name
    for name in ("resolve_field", "FieldRef", "FIELDS_HELP", "RUN_ATTRS", "SPEC_ATTRS", "higher_is_better",
                 "check_known_keys", "ACCOUNTING_FIELDS"):
        assert getattr(query, name) is getattr(fields, name), name
    for name in ("compile_filter", "compile_sort"):
        assert getattr(query, name) is getattr(sql, name), name
    assert all(hasattr(query, name) for name in query.__all__)
