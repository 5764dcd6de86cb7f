"""The filter and sort grammar of `runs list --where/--sort` and `specs list`, and its compilation to SQLAlchemy.

A hand-written tokenizer and recursive-descent parser turn the text into a small AST; the compiler turns the AST into
SQLAlchemy expressions. Nothing from the text ever becomes SQL: column names come from an allow-list, and every
field key (`model.norm.kind`, `val_loss`) and every literal becomes a bound parameter.

Grammar (keywords are case-insensitive; NOT binds tighter than AND, AND tighter than OR):

    filter     := or_expr EOF
    or_expr    := and_expr ("OR" and_expr)*
    and_expr   := not_expr ("AND" not_expr)*
    not_expr   := "NOT" not_expr | "(" or_expr ")" | predicate
    predicate  := field op literal
                | field ["NOT"] "IN" "(" literal ("," literal)* ")"
                | field ["NOT"] "LIKE" string
                | field "IS" ["NOT"] "NULL"
    op         := "=" | "==" | "!=" | "<>" | "<" | "<=" | ">" | ">="
    literal    := number | string | "true" | "false"
    number     := -?digits[.digits][e[+-]digits]        (20e6, 3.2, -1, .5)
    string     := '...' | "..."                         (a doubled quote stands for itself: 'it''s')
    field      := segment ("." segment)*                 (a segment is [A-Za-z0-9_/-]+ or `back-quoted`)

    sort       := key ("," key)*        key := ["-"] field ["ASC" | "DESC"]      ("-" means DESC)

Fields (see FIELDS_HELP): spec params `params.model.*`, `params.train.*`, `params.name`; accounting `params.total`,
`params.active`, `params.embedding`, `params.by_component.<name>`, `flops.forward`, `flops.train`, `kv_cache_bytes`;
metrics `metrics.<key>` (latest value), `metrics.best.<key>` (lowest; highest for throughput, MFU and accuracy: see
`higher_is_better`), `metrics.min.<key>`, `metrics.max.<key>`;
`summary.<key>`; `tags.<key>`; run attributes (status, name, created, ...).

Semantics worth knowing:
- A number compares numerically, a string as text: `params.model.d_model < 1000` is true for 512. A param holds
  either a number or a text (booleans are the text 'true'/'false'), so `params.model.n_layers = '8'` matches nothing.
- A predicate on a field a run does not have is false, including `!=` (`metrics.val_loss != 3` needs a val_loss);
  `NOT (...)` is plain negation, and `field IS NULL` asks for absence.
- LIKE is case-insensitive on every backend (`%` any run, `_` one character, `\\` escapes).
- Times (created, started, ended, heartbeat) compare with ISO strings, taken as UTC: `created >= '2026-05-01'`.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Union

from sqlalchemy import ColumnElement, and_, func, not_, or_, select, true
from sqlalchemy.sql.elements import UnaryExpression

from archspec.data.base import task_kinds
from archspec.errors import UserError
from archspec.registry.models import (
    Evaluation,
    EvaluationMetric,
    MetricStats,
    RunAccounting,
    RunParam,
    RunRecord,
    RunTag,
    SpecAccounting,
    SpecName,
    SpecParam,
    SpecRecord,
    SummaryMetric,
    SweepRun,
)
from archspec.train.logger import STATUSES

# Limits: a filter is typed by a person; past these it is a mistake or an attack, and the database would refuse it
# anyway, less clearly (SQLite: "Expression tree is too large" at depth 1000, "too many terms in ORDER BY clause").
MAX_TEXT = 10_000  # characters of a filter or sort
MAX_NESTING = 50  # parentheses and NOTs, one inside another
MAX_PREDICATES = 200  # comparisons joined by AND / OR
MAX_VALUES = 1000  # literals in all IN lists together
MAX_SORT_KEYS = 16

# ── errors ───────────────────────────────────────────────────────────────────────────────────────────────────────


def text_literal(value: str) -> str:
    """`value` as a string literal of the filter language ('...' with '' for a quote): what code that builds a filter
    from a stored or given name must use (JSON's \\" and \\\\ escapes mean nothing here)."""
    return "'" + str(value).replace("'", "''") + "'"


class FilterError(UserError):
    """A bad filter or sort: the message names the column, and `problems` echo the text with a caret under it."""

    def __init__(self, what: str, text: str, pos: int, message: str):
        shown = re.sub(r"\s", " ", text)  # tabs and newlines would shift the caret
        pos = max(0, min(pos, len(text)))
        caret = pos
        if len(shown) > 200:  # a window around the column, so a long text stays one readable line
            start = max(0, min(pos - 100, len(shown) - 200))
            shown = ("..." if start else "") + shown[start:start + 200] + ("..." if start + 200 < len(shown) else "")
            caret = pos - start + (3 if start else 0)
        super().__init__(f"invalid {what} at column {pos + 1}: {message}", [shown, " " * caret + "^"])
        self.column = pos + 1


# ── tokens ───────────────────────────────────────────────────────────────────────────────────────────────────────

KEYWORDS = {"and", "or", "not", "in", "like", "is", "null", "true", "false", "asc", "desc"}
_SEGMENT = r"(?:[A-Za-z0-9_/\-]+|`(?:[^`]|``)+`)"
_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<number>-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?(?![A-Za-z0-9_/`.]))
  | (?P<string>'(?:[^']|'')*'|"(?:[^"]|"")*")
  | (?P<field>(?:[A-Za-z_][A-Za-z0-9_/\-]*|`(?:[^`]|``)+`)(?:\.%s)*)
  | (?P<op><=|>=|!=|<>|==|=|<|>)
  | (?P<lparen>\()
  | (?P<rparen>\))
  | (?P<comma>,)
  | (?P<minus>-)
    """
    % _SEGMENT,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Token:
    kind: str  # number | string | field | keyword | op | lparen | rparen | comma | minus | eof
    text: str
    pos: int  # 0-based column of the first character


def tokenize(text: str, what: str = "filter") -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            ch = text[pos]
            if ch in "'\"":
                raise FilterError(what, text, pos, f"unterminated string: no closing {ch}")
            if ch == "`":
                raise FilterError(what, text, pos, "unterminated `quoted` field name")
            raise FilterError(what, text, pos, f"unexpected character {ch!r}")
        kind = m.lastgroup
        assert kind is not None
        if kind != "ws":
            word = m.group()
            if kind == "field" and word.lower() in KEYWORDS:
                kind = "keyword"
            tokens.append(Token(kind, word, pos))
        pos = m.end()
    tokens.append(Token("eof", "", len(text)))
    return tokens


# ── AST ──────────────────────────────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Field:
    name: str  # dotted, back-quotes removed
    pos: int


@dataclass(frozen=True)
class Literal:
    value: Union[str, float, bool]
    pos: int


@dataclass(frozen=True)
class Compare:
    field: Field
    op: str  # = != < <= > >=
    value: Literal


@dataclass(frozen=True)
class In:
    field: Field
    values: tuple[Literal, ...]
    negated: bool


@dataclass(frozen=True)
class Like:
    field: Field
    pattern: Literal
    negated: bool


@dataclass(frozen=True)
class IsNull:
    field: Field
    negated: bool


@dataclass(frozen=True)
class And:
    items: tuple["Node", ...]


@dataclass(frozen=True)
class Or:
    items: tuple["Node", ...]


@dataclass(frozen=True)
class Not:
    item: "Node"


Node = Union[Compare, In, Like, IsNull, And, Or, Not]

_OPS = {"=": "=", "==": "=", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def _field_name(text: str) -> str:
    """`metrics.`val loss`` → `metrics.val loss`: split on dots outside back-quotes, unquote each segment."""
    parts, buf, quoted, i = [], [], False, 0
    while i < len(text):
        ch = text[i]
        if ch == "`":
            if quoted and i + 1 < len(text) and text[i + 1] == "`":
                buf.append("`")
                i += 2
                continue
            quoted = not quoted
        elif ch == "." and not quoted:
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
        i += 1
    parts.append("".join(buf))
    return ".".join(parts)


class _Parser:
    def __init__(self, text: str, what: str):
        self.text, self.what = text, what
        if len(text) > MAX_TEXT:
            raise FilterError(what, text, MAX_TEXT, f"{len(text):,} characters, more than the limit of {MAX_TEXT:,}")
        self.tokens = tokenize(text, what)
        self.i = 0
        self.depth = self.predicates = self.values = 0

    # helpers
    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def error(self, message: str, tok: Token | None = None) -> FilterError:
        return FilterError(self.what, self.text, (tok or self.tok).pos, message)

    def is_kw(self, *words: str) -> bool:
        return self.tok.kind == "keyword" and self.tok.text.lower() in words

    def take(self) -> Token:
        tok = self.tok
        self.i += 1
        return tok

    def describe(self, tok: Token) -> str:
        return "the end of the filter" if tok.kind == "eof" else repr(tok.text)

    # grammar
    def parse_filter(self) -> Node:
        node = self.or_expr()
        if self.tok.kind != "eof":
            if self.tok.kind == "rparen":
                raise self.error("unbalanced ')'")
            raise self.error(f"expected AND, OR or the end of the filter, got {self.describe(self.tok)}")
        return node

    def or_expr(self) -> Node:
        items = [self.and_expr()]
        while self.is_kw("or"):
            self.take()
            items.append(self.and_expr())
        return items[0] if len(items) == 1 else Or(tuple(items))

    def and_expr(self) -> Node:
        items = [self.not_expr()]
        while self.is_kw("and"):
            self.take()
            items.append(self.not_expr())
        return items[0] if len(items) == 1 else And(tuple(items))

    def nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.error(f"nested deeper than {MAX_NESTING} levels of parentheses and NOT")

    def not_expr(self) -> Node:
        # NOT chains are read in a loop, not by recursion; both count towards the nesting limit.
        nots = 0
        while self.is_kw("not"):
            self.take()
            self.nest()
            nots += 1
        node = self.operand()
        for _ in range(nots):
            node = Not(node)
        self.depth -= nots
        return node

    def operand(self) -> Node:
        if self.tok.kind == "lparen":
            open_tok = self.take()
            self.nest()
            node = self.or_expr()
            self.depth -= 1
            if self.tok.kind != "rparen":
                if self.tok.kind == "eof":
                    raise self.error(f"missing ')' to close the '(' at column {open_tok.pos + 1}")
                raise self.error(f"expected ')', AND or OR, got {self.describe(self.tok)}")
            self.take()
            return node
        return self.predicate()

    def field(self) -> Field:
        tok = self.tok
        if tok.kind != "field":
            if tok.kind == "keyword":
                raise self.error(f"expected a field name, got the keyword {tok.text.upper()}")
            raise self.error(f"expected a field name (e.g. params.model.n_layers), got {self.describe(tok)}")
        self.take()
        return Field(_field_name(tok.text), tok.pos)

    def literal(self) -> Literal:
        tok = self.tok
        if tok.kind == "number":
            self.take()
            value = float(tok.text)
            if not math.isfinite(value):  # 1e999, or a 5000-digit literal: no column holds it
                raise self.error(f"the number {tok.text[:20]}{'...' if len(tok.text) > 20 else ''} is out of range", tok)
            return Literal(value, tok.pos)
        if tok.kind == "string":
            self.take()
            quote = tok.text[0]
            value = tok.text[1:-1].replace(quote * 2, quote)
            _check_text(value, lambda m: FilterError(self.what, self.text, tok.pos, m))
            return Literal(value, tok.pos)
        if self.is_kw("true", "false"):
            self.take()
            return Literal(tok.text.lower() == "true", tok.pos)
        if tok.kind == "field":
            raise self.error(f"expected a value, got {tok.text!r}; quote text values: '{tok.text}'")
        raise self.error(f"expected a value (number, 'text', true or false), got {self.describe(tok)}")

    def predicate(self) -> Node:
        self.predicates += 1
        if self.predicates > MAX_PREDICATES:
            raise self.error(f"more than {MAX_PREDICATES} comparisons in one filter")
        field = self.field()
        tok = self.tok
        if tok.kind == "op":
            self.take()
            return Compare(field, _OPS[tok.text], self.literal())
        negated = False
        if self.is_kw("not"):
            self.take()
            negated = True
            if not self.is_kw("in", "like"):
                raise self.error(f"expected IN or LIKE after NOT, got {self.describe(self.tok)}")
        if self.is_kw("in"):
            self.take()
            if self.tok.kind != "lparen":
                raise self.error(f"expected '(' after IN, got {self.describe(self.tok)}")
            self.take()
            values = [self.literal()]
            while self.tok.kind == "comma":
                self.take()
                values.append(self.literal())
                if self.values + len(values) > MAX_VALUES:
                    raise self.error(f"more than {MAX_VALUES} values in IN lists")
            self.values += len(values)
            if self.tok.kind != "rparen":
                raise self.error(f"expected ',' or ')' in the IN list, got {self.describe(self.tok)}")
            self.take()
            return In(field, tuple(values), negated)
        if self.is_kw("like"):
            self.take()
            if self.tok.kind != "string":
                raise self.error(f"expected a quoted pattern after LIKE, got {self.describe(self.tok)}")
            return Like(field, self.literal(), negated)
        if self.is_kw("is"):
            self.take()
            neg = False
            if self.is_kw("not"):
                self.take()
                neg = True
            if not self.is_kw("null"):
                raise self.error(f"expected NULL after IS{' NOT' if neg else ''}, got {self.describe(self.tok)}")
            self.take()
            return IsNull(field, neg)
        raise self.error(
            f"expected an operator (= != < <= > >= IN LIKE IS) after {field.name!r}, got {self.describe(tok)}"
        )

    def parse_sort(self) -> list[tuple[Field, bool]]:
        keys: list[tuple[Field, bool]] = []
        while True:
            desc = False
            if self.tok.kind == "minus":
                self.take()
                desc = True
            field = self.field()
            if self.is_kw("asc", "desc"):
                desc = self.take().text.lower() == "desc"
            keys.append((field, desc))
            if len(keys) > MAX_SORT_KEYS:
                raise self.error(f"more than {MAX_SORT_KEYS} sort keys", self.tokens[self.i - 1])
            if self.tok.kind == "comma":
                self.take()
                continue
            if self.tok.kind != "eof":
                raise self.error(f"expected ',', ASC, DESC or the end of the sort, got {self.describe(self.tok)}")
            return keys


def _check_text(value: str, error: Callable[[str], FilterError]) -> None:
    # PostgreSQL refuses NUL in text, and no driver can send a lone surrogate: refuse both here, with a column,
    # rather than as a database error.
    if "\x00" in value:
        raise error("text values cannot contain the NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise error("text value is not valid Unicode") from None


def parse_filter(text: str | None) -> Node | None:
    """Parse a filter; None for an empty one. Raises FilterError (a UserError) with the column of the problem."""
    if text is None or not text.strip():
        return None
    return _Parser(text, "filter").parse_filter()


def parse_sort(text: str | None) -> list[tuple[Field, bool]]:
    """Parse `field [ASC|DESC], -field, ...` into (field, descending) pairs."""
    if text is None or not text.strip():
        return []
    return _Parser(text, "sort").parse_sort()


# ── fields: the allow-list ───────────────────────────────────────────────────────────────────────────────────────

# Accounting figures (from `RunInfo.accounting`, flattened as stored in spec_accounting), and their aliases.
ACCOUNTING_FIELDS = {
    "params.total": "params.total",
    "params.active": "params.active",
    "params.embedding": "params.embedding",
    "flops.forward": "flops.forward",
    "flops.train": "flops.train",
    "flops_per_token.forward": "flops.forward",
    "flops_per_token.train": "flops.train",
    "flops.seq_len": "flops.seq_len",
    "flops.attention": "flops.attention",
    "flops_per_token.attention": "flops.attention",
    "kv_cache_bytes": "kv_cache_bytes",
    "kv_cache_bytes_per_token": "kv_cache_bytes",
    "kv_cache_bytes_per_sequence": "kv_cache_bytes_per_sequence",
}
SPEC_KEY_ROOTS = ("model", "train", "name")  # params.<spec key>: spec keys always start with one of these
METRIC_AGGREGATES = {"min": "min", "max": "max", "last": "last"}  # and "best": min or max by the metric's direction


# Metrics where more is better; every other metric (losses, perplexity, times, memory, grad norms) is best lowest.
HIGHER_IS_BETTER = ("tokens_per_s", "mfu", "mfu_palm", "accuracy", "acc")
HIGHER_IS_BETTER_SUFFIXES = ("_per_s", "_accuracy", "_acc", "_mfu")


def higher_is_better(key: str) -> bool:
    """The direction of `metrics.best.<key>` and of `runs compare`'s "best": higher for throughput (…_per_s),
    MFU and accuracy, lower for everything else."""
    # Any dotted segment counts: `probe.accuracy`, `probe.accuracy.d64` (a capability probe's accuracy by distance).
    return any(part in HIGHER_IS_BETTER or part.endswith(HIGHER_IS_BETTER_SUFFIXES) for part in key.split("."))


def best_aggregate(key: str) -> str:
    return "max" if higher_is_better(key) else "min"


# Typed run attributes: text, number, time or status (text, normalised to upper case and checked).
RUN_ATTRS: dict[str, tuple[Any, str]] = {
    "id": (RunRecord.id, "str"),
    "name": (RunRecord.name, "str"),
    "status": (RunRecord.status, "status"),
    "seed": (RunRecord.seed, "num"),
    "model_hash": (RunRecord.model_hash, "str"),
    "spec_hash": (RunRecord.model_hash, "str"),  # the model hash's earlier name, still accepted
    "data_hash": (RunRecord.data_hash, "str"),
    "host": (RunRecord.host, "str"),
    "code_version": (RunRecord.code_version, "str"),
    "error": (RunRecord.error, "str"),
    "attempt": (RunRecord.attempt, "num"),
    "created": (RunRecord.created, "time"),
    "started": (RunRecord.started, "time"),
    "ended": (RunRecord.ended, "time"),
    "heartbeat": (RunRecord.heartbeat, "time"),
}
SPEC_ATTRS: dict[str, tuple[Any, str]] = {
    "hash": (SpecRecord.hash, "str"),
    "model_hash": (SpecRecord.hash, "str"),
    "spec_hash": (SpecRecord.hash, "str"),  # the model hash's earlier name, still accepted
    "name": (SpecRecord.name, "str"),
    "generated_hash": (SpecRecord.generated_hash, "str"),
    "created": (SpecRecord.created, "time"),
}

FIELDS_HELP = (
    "params.model.* | params.train.* | params.name (spec keys), params.total | params.active | params.embedding | "
    "params.by_component.<name> | flops.forward | flops.train | flops.seq_len | kv_cache_bytes (accounting: a spec's at "
    "context_length in specs list, the run's own at its seq_len in runs list), metrics.<key> (latest) | "
    "metrics.best.<key> (lowest; highest for *_per_s, mfu, accuracy) | metrics.min.<key> | metrics.max.<key>, "
    "summary.<key>, tags.<key>, probe.<key> | probe.<task>.<key> (the latest capability probe, e.g. probe.accuracy), "
    "sweep (any sweep the run belongs to), and run attributes: " + ", ".join(RUN_ATTRS)
)


@dataclass(frozen=True)
class FieldRef:
    """A resolved field: what it is (`attr`, `param`, `acct`, `metric`, `summary`, `tag`) and its key."""

    kind: str
    key: str
    aggregate: str = "last"  # metrics: last | min | max; probes: the task ("" for any task)


def resolve_field(name: str, target: str) -> FieldRef:
    """Map a field name to what it reads, or raise ValueError with a message naming the valid fields.

    `target` is "runs" or "specs": specs have params and accounting but no metrics, status or tags.
    """
    attrs = RUN_ATTRS if target == "runs" else SPEC_ATTRS
    if name == "sweep" and target == "runs":
        return FieldRef("sweep", name)
    if name == "name" and target == "specs":
        return FieldRef("names", name)
    if name in attrs:
        return FieldRef("attr", name)
    if name in ACCOUNTING_FIELDS:
        return FieldRef("acct", ACCOUNTING_FIELDS[name])
    head, _, rest = name.partition(".")
    if head == "params" and rest:
        if rest.startswith("by_component.") and len(rest) > len("by_component."):
            return FieldRef("acct", name)
        if rest.split(".", 1)[0] in SPEC_KEY_ROOTS:
            from archspec.spec import is_known_key, known_keys

            if not is_known_key(rest):  # a typo would otherwise match nothing, silently
                close = difflib.get_close_matches(rest, sorted(known_keys()), n=1)
                hint = f"; did you mean params.{close[0]}?" if close else " (`archspec schema` lists the spec's keys)"
                raise ValueError(f"unknown spec key {name!r}{hint}")
            return FieldRef("param", rest)
        raise ValueError(
            f"unknown field {name!r}: params.* are spec keys (params.model.…, params.train.…, params.name) or "
            "accounting (params.total, params.active, params.embedding, params.by_component.<name>)"
        )
    if head == "probe" and rest:  # capability probes (`archspec probe`): the latest evaluation that has the key
        if target != "runs":
            raise ValueError(f"field {name!r} is not available for specs (probes are evaluations of runs)")
        task, _, key = rest.partition(".")
        if task in task_kinds() and key:  # probe.<task>.<key>: that task's latest evaluation (archspec.data)
            return FieldRef("probe", key, task)
        return FieldRef("probe", rest, "")
    if head in ("metrics", "summary", "tags") and rest:
        if target != "runs":
            raise ValueError(f"field {name!r} is not available for specs (specs have params and accounting only)")
        if head == "metrics":
            agg, _, key = rest.partition(".")
            if agg == "best" and key:
                return FieldRef("metric", key, best_aggregate(key))
            if agg in METRIC_AGGREGATES and key:
                return FieldRef("metric", key, METRIC_AGGREGATES[agg])
            return FieldRef("metric", rest, "last")
        return FieldRef("summary" if head == "summary" else "tag", rest)
    if target == "specs" and name in RUN_ATTRS:
        raise ValueError(f"field {name!r} is a run attribute; specs have: {', '.join(SPEC_ATTRS)}")
    raise ValueError(f"unknown field {name!r}; fields are {FIELDS_HELP}")


# ── compilation ──────────────────────────────────────────────────────────────────────────────────────────────────


@dataclass
class _Slot:
    """Where a field's value lives: a numeric column and/or a text column (or a time column), plus the correlation
    that ties a side table's row to the outer run or spec. `where` turns a condition on the side table into a
    predicate on the outer row; None for the outer table's own columns."""

    num: Any = None
    text: Any = None
    time: Any = None
    status: bool = False
    where: Callable[[ColumnElement], ColumnElement] | None = None  # side-table condition → outer predicate
    scalar: Callable[[Any], Any] | None = None  # a side-table column as a correlated scalar subquery, for sorting


def _side(outer, inner, key_col, key: str):
    """Predicate and sort builders for a key-value side table (`inner` is its column that refers to `outer`).

    Filters compile to `outer IN (SELECT inner FROM side WHERE key = :k AND <cond>)` rather than a correlated
    EXISTS: the subquery runs once, on the side table's (key, value) index, instead of once per run."""

    def where(cond: ColumnElement) -> ColumnElement:
        return outer.in_(select(inner).where(key_col == key, cond))

    def scalar(col):
        return select(col).where(inner == outer, key_col == key).limit(1).scalar_subquery()

    return where, scalar


def _slot(ref: FieldRef, target: str) -> _Slot:
    runs = target == "runs"
    if ref.kind == "attr":
        col, typ = (RUN_ATTRS if runs else SPEC_ATTRS)[ref.key]
        return _Slot(
            num=col if typ == "num" else None,
            text=col if typ in ("str", "status") else None,
            time=col if typ == "time" else None,
            status=typ == "status",
        )
    if ref.kind == "param":
        if runs:
            where, scalar = _side(RunRecord.id, RunParam.run_id, RunParam.key, ref.key)
            return _Slot(num=RunParam.value_num, text=RunParam.value_str, where=where, scalar=scalar)
        where, scalar = _side(SpecRecord.hash, SpecParam.model_hash, SpecParam.key, ref.key)
        return _Slot(num=SpecParam.value_num, text=SpecParam.value_str, where=where, scalar=scalar)
    if ref.kind == "acct":  # a run's own accounting (at its seq_len), a spec's (at context_length)
        if runs:
            where, scalar = _side(RunRecord.id, RunAccounting.run_id, RunAccounting.key, ref.key)
            return _Slot(num=RunAccounting.value, where=where, scalar=scalar)
        where, scalar = _side(SpecRecord.hash, SpecAccounting.model_hash, SpecAccounting.key, ref.key)
        return _Slot(num=SpecAccounting.value, where=where, scalar=scalar)
    if ref.kind == "sweep":  # membership: a run may belong to several sweeps; it matches if any does
        return _Slot(text=SweepRun.sweep, where=lambda cond: RunRecord.id.in_(select(SweepRun.run_id).where(cond)),
                     scalar=lambda col: select(func.min(col)).where(SweepRun.run_id == RunRecord.id).scalar_subquery())
    if ref.kind == "names":  # any name the model was built or trained under
        return _Slot(text=SpecName.name, where=lambda cond: SpecRecord.hash.in_(select(SpecName.model_hash).where(cond)),
                     scalar=lambda col: select(func.min(col)).where(SpecName.model_hash == SpecRecord.hash)
                     .scalar_subquery())
    if ref.kind == "metric":
        columns = {"last": MetricStats.last_value, "min": MetricStats.min_value, "max": MetricStats.max_value}
        col = columns[ref.aggregate]
        where, scalar = _side(RunRecord.id, MetricStats.run_id, MetricStats.key, ref.key)
        return _Slot(num=col, where=where, scalar=scalar)
    if ref.kind == "summary":
        where, scalar = _side(RunRecord.id, SummaryMetric.run_id, SummaryMetric.key, ref.key)
        return _Slot(num=SummaryMetric.value, where=where, scalar=scalar)
    if ref.kind == "tag":
        where, scalar = _side(RunRecord.id, RunTag.run_id, RunTag.key, ref.key)
        return _Slot(text=RunTag.value, where=where, scalar=scalar)
    if ref.kind == "probe":
        return _probe_slot(ref.key, ref.aggregate)
    raise AssertionError(ref)


def _probe_slot(key: str, task: str) -> _Slot:
    """`probe.<key>` / `probe.<task>.<key>`: the value in each run's latest evaluation (of that task) having `key`;
    runs without one never match."""
    scope = [EvaluationMetric.key == key, *([Evaluation.task == task] if task else [])]
    joined = select(Evaluation.run_id).join(EvaluationMetric, EvaluationMetric.evaluation_id == Evaluation.id)
    latest = (select(func.max(Evaluation.id)).join(EvaluationMetric, EvaluationMetric.evaluation_id == Evaluation.id)
              .where(*scope).group_by(Evaluation.run_id))

    def where(cond: ColumnElement) -> ColumnElement:
        return RunRecord.id.in_(joined.where(*scope, Evaluation.id.in_(latest), cond))

    def scalar(col):
        return (select(col).join(Evaluation, Evaluation.id == EvaluationMetric.evaluation_id)
                .where(Evaluation.run_id == RunRecord.id, *scope).order_by(Evaluation.id.desc()).limit(1)
                .scalar_subquery())

    return _Slot(num=EvaluationMetric.value, where=where, scalar=scalar)


def _parse_time(value: str) -> datetime:
    text = value.strip().replace("Z", "+00:00")
    dt = datetime.fromisoformat(text)
    try:
        return dt.astimezone(timezone.utc) if dt.tzinfo else dt.replace(tzinfo=timezone.utc)
    except OverflowError:  # '0001-01-01T00:00+01:00' is in year 0 in UTC
        raise ValueError("outside the years 1-9999 once converted to UTC") from None


class _Compiler:
    def __init__(self, text: str, target: str):
        self.text, self.target = text, target

    def error(self, pos: int, message: str) -> FilterError:
        return FilterError("filter", self.text, pos, message)

    def slot(self, field: Field) -> tuple[FieldRef, _Slot]:
        try:
            ref = resolve_field(field.name, self.target)
        except ValueError as e:
            raise self.error(field.pos, str(e)) from None
        return ref, _slot(ref, self.target)

    def operand(self, field: Field, slot: _Slot, lit: Literal) -> tuple[Any, Any]:
        """The column to compare and the Python value to bind, chosen by the literal's type."""
        v = lit.value
        if isinstance(v, bool):
            if slot.where is not None and slot.text is not None:  # params and tags store booleans as text
                return slot.text, "true" if v else "false"
            raise self.error(lit.pos, f"{field.name} is not a true/false field")
        if isinstance(v, float):
            if slot.num is not None:
                if math.isnan(v):  # unreachable from the tokenizer, kept for API callers
                    raise self.error(lit.pos, "NaN is not a comparable value")
                return slot.num, v
            kind = "a time; compare it with an ISO date such as '2026-05-01'" if slot.time is not None else "text"
            raise self.error(lit.pos, f"{field.name} is {kind}; got the number {_num(v)}")
        # text literal
        if slot.text is not None:
            if slot.status:
                upper = v.upper()
                if upper not in STATUSES:
                    raise self.error(lit.pos, f"unknown status {v!r}; expected one of {', '.join(STATUSES)}")
                return slot.text, upper
            return slot.text, v
        if slot.time is not None:
            try:
                return slot.time, _parse_time(v)
            except ValueError as e:
                message = f"{field.name} is a time; {v!r} is not an ISO date/time like '2026-05-01'"
                if "UTC" in str(e):
                    message = f"{field.name} is a time; {v!r} is {e}"
                raise self.error(lit.pos, message) from None
        raise self.error(lit.pos, f"{field.name} is numeric; compare it with a number, not the text {v!r}")

    def wrap(self, slot: _Slot, cond: ColumnElement) -> ColumnElement:
        return slot.where(cond) if slot.where is not None else cond

    def compile(self, node: Node) -> ColumnElement:
        if isinstance(node, And):
            return and_(*(self.compile(n) for n in node.items))
        if isinstance(node, Or):
            return or_(*(self.compile(n) for n in node.items))
        if isinstance(node, Not):
            return not_(self.compile(node.item))
        if isinstance(node, Compare):
            _, slot = self.slot(node.field)
            col, value = self.operand(node.field, slot, node.value)
            cond = {
                "=": col.__eq__, "!=": col.__ne__, "<": col.__lt__, "<=": col.__le__, ">": col.__gt__, ">=": col.__ge__,
            }[node.op](value)
            if slot.where is None and node.op == "!=":
                cond = and_(col.is_not(None), cond)  # absent (NULL) attributes never match, like absent params
            return self.wrap(slot, cond)
        if isinstance(node, In):
            _, slot = self.slot(node.field)
            # Each value goes to the column its type selects (numbers → value_num, texts → value_str).
            groups: dict[int, tuple[Any, list[Any]]] = {}
            for lit in node.values:
                col, value = self.operand(node.field, slot, lit)
                groups.setdefault(id(col), (col, []))[1].append(value)
            if node.negated:
                cond = and_(*(and_(col.is_not(None), col.not_in(vals)) for col, vals in groups.values()))
            else:
                cond = or_(*(col.in_(vals) for col, vals in groups.values()))
            return self.wrap(slot, cond)
        if isinstance(node, Like):
            _, slot = self.slot(node.field)
            if slot.text is None:
                raise self.error(node.field.pos, f"LIKE needs a text field; {node.field.name} is not text")
            pattern = str(node.pattern.value)
            if (len(pattern) - len(pattern.rstrip("\\"))) % 2:  # PostgreSQL rejects a trailing escape
                raise self.error(node.pattern.pos, "a LIKE pattern cannot end with a lone escape character '\\'")
            like = slot.text.ilike(pattern, escape="\\")
            return self.wrap(slot, and_(slot.text.is_not(None), not_(like)) if node.negated else like)
        if isinstance(node, IsNull):
            ref, slot = self.slot(node.field)
            if slot.where is None:
                col = slot.num if slot.num is not None else slot.text if slot.text is not None else slot.time
                return col.is_not(None) if node.negated else col.is_(None)
            cols = [c for c in (slot.num, slot.text) if c is not None]
            present = slot.where(or_(*(c.is_not(None) for c in cols)))
            return present if node.negated else not_(present)
        raise AssertionError(node)


def _num(v: float) -> str:
    return str(int(v)) if v.is_integer() and abs(v) < 1e16 else repr(v)


def compile_filter(text: str | None, target: str = "runs") -> ColumnElement:
    """The WHERE clause for a filter over `runs` (RunRecord) or `specs` (SpecRecord); `true()` when empty."""
    node = parse_filter(text)
    if node is None:
        return true()
    assert text is not None
    return _Compiler(text, target).compile(node)


def compile_sort(text: str | None, target: str = "runs") -> list[UnaryExpression]:
    """ORDER BY terms; rows without the field sort last in either direction."""
    terms: list[UnaryExpression] = []
    if not text:
        return terms
    for field, desc in parse_sort(text):
        try:
            ref = resolve_field(field.name, target)
        except ValueError as e:
            raise FilterError("sort", text, field.pos, str(e)) from None
        slot = _slot(ref, target)
        if slot.where is None:
            cols = [slot.num if slot.num is not None else slot.text if slot.text is not None else slot.time]
        else:
            assert slot.scalar is not None
            # A param is a number or a text: sort numbers first (numerically), then texts.
            cols = [slot.scalar(c) for c in (slot.num, slot.text) if c is not None]
        for col in cols:
            terms.append((col.desc() if desc else col.asc()).nulls_last())
    return terms




def _fields_of(node: Node | None) -> list[Field]:
    if node is None:
        return []
    if isinstance(node, (And, Or)):
        return [f for item in node.items for f in _fields_of(item)]
    if isinstance(node, Not):
        return _fields_of(node.item)
    return [node.field]


def check_known_keys(where: str | None, sort: str | None, metric_keys: set[str], summary_keys: set[str],
                     probe_keys: set[str] | None = None) -> None:
    """Refuse `metrics.<key>` / `summary.<key>` that no run in the registry has (a typo would match nothing, or sort
    by nothing), with the closest known key; likewise `probe.<key>` once some run has been probed. A registry without
    any runs has nothing to check against."""
    if not metric_keys and not summary_keys and not probe_keys:
        return
    checks = [("filter", where, f) for f in _fields_of(parse_filter(where))]
    checks += [("sort", sort, f) for f, _ in parse_sort(sort)]
    for what, text, field in checks:
        ref = resolve_field(field.name, "runs")
        if ref.kind == "probe":
            key = f"{ref.aggregate}.{ref.key}" if ref.aggregate else ref.key
            if not probe_keys or key in probe_keys or (ref.aggregate and ref.key in probe_keys):
                continue  # a known key under a task nobody probed yet is no typo: it matches nothing
            close = difflib.get_close_matches(key, sorted(probe_keys), n=1)
            hint = f"did you mean probe.{close[0]}?" if close else f"known: {', '.join(sorted(probe_keys))}"
            raise FilterError(what, text or "", field.pos, f"no probe of any run has {key!r}; {hint}")
        if ref.kind not in ("metric", "summary"):
            continue
        known = metric_keys if ref.kind == "metric" else summary_keys
        if ref.key in known:
            continue
        head = field.name[: len(field.name) - len(ref.key)]  # "metrics.", "metrics.best.", "summary."
        close = difflib.get_close_matches(ref.key, sorted(known), n=1)
        hint = f"did you mean {head}{close[0]}?" if close else f"known: {', '.join(sorted(known)) or 'none'}"
        kind = "metric" if ref.kind == "metric" else "summary key"
        raise FilterError(what, text or "", field.pos, f"no run has the {kind} {ref.key!r}; {hint}")


def referenced_fields(where: str | None = None, sort: str | None = None) -> list[str]:
    """Field names a filter and a sort mention, in order of appearance, without repeats (for display columns)."""
    names: list[str] = []

    def walk(node: Node) -> None:
        if isinstance(node, (And, Or)):
            for item in node.items:
                walk(item)
        elif isinstance(node, Not):
            walk(node.item)
        elif node.field.name not in names:
            names.append(node.field.name)

    node = parse_filter(where)
    if node is not None:
        walk(node)
    for f, _ in parse_sort(sort):
        if f.name not in names:
            names.append(f.name)
    return names


__all__ = [
    "FilterError", "Token", "tokenize", "parse_filter", "parse_sort", "compile_filter", "compile_sort",
    "resolve_field", "FieldRef", "FIELDS_HELP", "referenced_fields", "higher_is_better", "check_known_keys",
]
