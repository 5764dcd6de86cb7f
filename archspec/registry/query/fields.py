"""The field catalogue: which names a filter or sort may use and what each reads (`resolve_field`, `FieldRef`),
the typed run and spec attributes (`RUN_ATTRS`, `SPEC_ATTRS`, as columns of archspec.registry.models), accounting
aliases, metric aggregates and their direction (`higher_is_better`), probes, `FIELDS_HELP`, and the check that a
`metrics.` / `summary.` / `probe.` key names a key some run has (`check_known_keys`, with "did you mean").

Fields (see FIELDS_HELP): spec params `params.model.*`, `params.train.*`, `params.name`; accounting `params.total`,
`params.active`, `params.embedding`, `params.by_component.<name>`, `flops.forward`, `flops.train`, `kv_cache_bytes`;
metrics `metrics.<key>` (latest value), `metrics.best.<key>` (lowest; highest for throughput, MFU and accuracy: see
`higher_is_better`), `metrics.min.<key>`, `metrics.max.<key>`;
`summary.<key>`; `tags.<key>`; run attributes (status, name, spec_name, note, created, ...).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from archspec.errors import closest_key  # noqa: F401  (the one nearest-key rule: filters and spec keys)
from archspec.registry.models import RunNote, RunRecord, SpecRecord
from archspec.registry.query.parse import FilterError, _fields_of, parse_filter, parse_sort

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
# `name` is what a run is shown as (its display name, `archspec runs rename`, else its spec's name); `spec_name` the
# spec's; `note` the latest note (`archspec runs note`; `note like '%lr%'`, `note is null`).
_LATEST_NOTE = (select(RunNote.text).where(RunNote.run_id == RunRecord.id).order_by(RunNote.id.desc()).limit(1)
                .correlate(RunRecord).scalar_subquery())
RUN_ATTRS: dict[str, tuple[Any, str]] = {
    "id": (RunRecord.id, "str"),
    "name": (func.coalesce(RunRecord.display_name, RunRecord.name), "str"),
    "spec_name": (RunRecord.name, "str"),
    "note": (_LATEST_NOTE, "str"),
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
    "quant.<scheme>.<key> (the latest `archspec quantize`, e.g. quant.int4.val_loss_delta), "
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
                renamed = {"train.world_size": "train.data_parallel"}  # (migration 0007: replicas, not processes)
                close = [renamed[rest]] if rest in renamed else difflib.get_close_matches(rest, sorted(known_keys()), n=1)
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
        from archspec.data.base import task_kinds  # the data units (pydantic): only for a probe field

        if task in task_kinds() and key:  # probe.<task>.<key>: that task's latest evaluation (archspec.data)
            return FieldRef("probe", key, task)
        return FieldRef("probe", rest, "")
    if head == "quant" and rest:  # `archspec quantize`'s evaluations: quant.<scheme>.<key>, e.g. quant.int4.size_ratio
        if target != "runs":
            raise ValueError(f"field {name!r} is not available for specs (quantizations are evaluations of runs)")
        scheme, _, key = rest.partition(".")
        if not key:
            raise ValueError(f"field {name!r}: expected quant.<scheme>.<key>, e.g. quant.int8.val_loss_delta")
        return FieldRef("probe", key, f"quant.{scheme}")
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


def unknown_key(name: str, metric_keys: set[str], summary_keys: set[str], probe_keys: set[str] | None = None
                ) -> str | None:
    """Why `name` (a resolvable runs field) names nothing: a `metrics.` / `summary.` key no run has, or a `probe.`
    key no probe has, with the closest known key; None when it is fine (or there is nothing to check against)."""
    if not metric_keys and not summary_keys and not probe_keys:
        return None
    ref = resolve_field(name, "runs")
    if ref.kind == "probe":
        key = f"{ref.aggregate}.{ref.key}" if ref.aggregate else ref.key
        if not probe_keys or key in probe_keys or (ref.aggregate and ref.key in probe_keys):
            return None  # a known key under a task nobody probed yet is no typo: it matches nothing
        close = closest_key(key, probe_keys)
        head = "" if (close or "").startswith("quant.") else "probe."  # a quantization's key carries its own head
        hint = f"did you mean {head}{close}?" if close else f"known: {', '.join(sorted(probe_keys))}"
        return f"no probe of any run has {key!r}; {hint}"
    if ref.kind not in ("metric", "summary"):
        return None
    known = metric_keys if ref.kind == "metric" else summary_keys
    if ref.key in known:
        return None
    head = name[: len(name) - len(ref.key)]  # "metrics.", "metrics.best.", "summary."
    close = closest_key(ref.key, known)
    hint = f"did you mean {head}{close}?" if close else f"known: {', '.join(sorted(known)) or 'none'}"
    kind = "metric" if ref.kind == "metric" else "summary key"
    return f"no run has the {kind} {ref.key!r}; {hint}"


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
        problem = unknown_key(field.name, metric_keys, summary_keys, probe_keys)
        if problem:
            raise FilterError(what, text or "", field.pos, problem)
