"""The compiler: a parsed filter or sort (parse.py), its fields resolved (fields.py), turned into SQLAlchemy WHERE
conditions and ORDER BY terms over the models in archspec.registry.models. Every field key and literal is a bound
parameter; side tables (params, accounting, metric stats, summary, tags, sweeps, names, probes) are reached through
`outer IN (SELECT ...)` subqueries, or correlated scalar subqueries for sorting.

Semantics worth knowing:
- A number compares numerically, a string as text: `params.model.d_model < 1000` is true for 512. A param holds
  either a number or a text (booleans are the text 'true'/'false'), so `params.model.n_layers = '8'` matches nothing.
- A predicate on a field a run does not have is false, including `!=` (`metrics.val_loss != 3` needs a val_loss);
  `NOT (...)` is plain negation, and `field IS NULL` asks for absence.
- LIKE is case-insensitive on every backend (`%` any run, `_` one character, `\\` escapes).
- Times (created, started, ended, heartbeat) compare with ISO strings, taken as UTC: `created >= '2026-05-01'`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from sqlalchemy import ColumnElement, and_, func, not_, or_, select, true
from sqlalchemy.sql.elements import UnaryExpression

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
from archspec.registry.query.fields import RUN_ATTRS, SPEC_ATTRS, FieldRef, resolve_field
from archspec.registry.query.parse import (
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
    parse_filter,
    parse_sort,
)
from archspec.train.logger import STATUSES

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
