"""`archspec runs list|show|compare|export` and `archspec specs list`: the registry from the command line.

Every command takes `--registry URL` (default `$ARCHSPEC_REGISTRY`, else sqlite:///registry/archspec.db), on the
group (`archspec runs --registry URL list`) or on the command (`archspec runs list --registry URL`). Bad filters,
unknown run ids and bad URLs raise `UserError`, which `archspec.cli.main` turns into exit code 2 and a message.
"""

from __future__ import annotations

import csv
import io
import json
import math
from datetime import datetime
from typing import Any, Sequence

import click
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from archspec.cli.options import FiniteFloat, registry_option
from archspec.console import (
    dropped_note,
    echo,
    fit_columns,
    is_mfu_key,
    make_console,
    number,
)
from archspec.errors import UserError, printable
from archspec.registry.housekeeping import KEEP_POLICIES
from archspec.registry.query.fields import FIELDS_HELP, higher_is_better, resolve_field
from archspec.registry.query.parse import referenced_fields
from archspec.registry.store import (
    MetricPoint,
    Registry,
    RunRow,
    SpecRow,
    accounting_fields,
    default_url,
)

FORMATS = ["table", "json", "csv"]
TABLE_LIMIT = 50  # rows a `list` table shows unless --limit says otherwise
STATUS_STYLE = {"FINISHED": "green", "FAILED": "red", "KILLED": "yellow", "RUNNING": "cyan", "SCHEDULED": "dim"}
_WHERE_HELP = "filter, e.g. \"params.model.attention.n_kv_heads = 1 and metrics.val_loss < 3.2\"; fields: " + FIELDS_HELP



def _open(ctx: click.Context, url: str | None) -> Registry:
    url = url or (ctx.obj or {}).get("registry_url") or default_url()
    reg = Registry(url)
    ctx.call_on_close(reg.close)
    return reg


def _console() -> Console:
    return make_console(data=True)  # stored values are shown as data: no markup, control characters escaped


# ── formatting ───────────────────────────────────────────────────────────────────────────────────────────────────


def _fmt(name: str, v: Any) -> str:
    """A value for a table cell: numbers in the one format of archspec.console.number, times to the minute."""
    if v is None:
        return "-"
    if isinstance(v, datetime):
        return v.strftime("%Y-%m-%d %H:%M")
    if isinstance(v, (int, float)) and not isinstance(v, bool) and is_mfu_key(name) and v > 1.0:
        return "above ceiling"  # an MFU over 100% says the measured ceiling is too low, not how fast the run was
    if isinstance(v, (bool, int, float)):
        return number(v)
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return str(v)


def _status(run: RunRow) -> Text:
    """The status as recorded; a RUNNING run whose writer stopped beating says so (reads never mark it KILLED)."""
    if run.stale:
        return Text(f"{run.status} (stale)", style="yellow")
    return Text(run.status, style=STATUS_STYLE.get(run.status, ""))


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"


def _json_default(o: Any) -> Any:
    if isinstance(o, datetime):
        return o.isoformat()
    raise TypeError(type(o).__name__)


def _json_clean(o: Any) -> Any:
    """NaN/inf are not JSON: write them as null so that every JSON tool can read the output."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _json_clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_json_clean(v) for v in o]
    return o


def _dump_json(data: Any) -> str:
    return json.dumps(_json_clean(data), indent=2, default=_json_default)


def _run_record(r: RunRow, extra: Sequence[str] = ()) -> dict[str, Any]:
    """A run as one flat record whose keys are the filter fields (`params.model.d_model`, `flops.forward`,
    `metrics.best.val_loss`, `summary.mfu`, ...): what `--where`/`--sort` name is what JSON and CSV exports hold."""
    out = r.flat(params=True)
    out["stale"] = r.stale  # RUNNING without a recent heartbeat (computed when read; not a filter field)
    for c in extra:
        out.setdefault(c, r.get(c))
    return out


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    """NaN/inf are not JSON: null (metric values are the only floats that can be non-finite)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}


def _dump_json_rows(rows: Sequence[dict[str, Any]]) -> str:
    """A JSON array with one object per line: valid JSON, greppable, and written by json's C encoder (an indented
    dump of 10,000 runs takes seconds)."""
    if not rows:
        return "[]"
    return "[\n" + ",\n".join(json.dumps(r, default=_json_default) for r in rows) + "\n]"


def _write_csv(records: Sequence[dict[str, Any]], out) -> None:
    columns: list[str] = []
    for r in records:
        columns.extend(k for k in r if k not in columns)
    w = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in records:
        w.writerow({k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in r.items()})


def _split_columns(columns: str | None, target: str) -> list[str]:
    names = [c.strip() for c in (columns or "").split(",") if c.strip()]
    for name in names:
        try:
            resolve_field(name, target)
        except ValueError as e:
            raise UserError(f"--columns: {e}") from None
    return names


def _check_columns(reg: Registry, names: Sequence[str]) -> None:
    """A `metrics.` / `summary.` / `probe.` column no run has would print a column of `-`: refused like a --where
    field, with the closest key."""
    from archspec.registry.query.fields import unknown_key

    if not names:
        return
    known = reg.known_keys()
    for name in names:
        problem = unknown_key(name, *known)
        if problem:
            raise UserError(f"--columns {printable(name, 80)}: {problem}")


def _sparkline(values: Sequence[float], width: int = 40) -> str:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return ""
    if len(values) > width:  # downsample by taking evenly spaced points
        values = [values[round(i * (len(values) - 1) / (width - 1))] for i in range(width)]
    lo, hi = min(vals), max(vals)
    bars = "▁▂▃▄▅▆▇█"
    span = (hi - lo) or 1.0
    return "".join(" " if math.isnan(v) else bars[min(7, int((v - lo) / span * 8))] for v in values)


# ── runs ─────────────────────────────────────────────────────────────────────────────────────────────────────────


@click.group("runs")
@registry_option
@click.pass_context
def runs_cmd(ctx: click.Context, registry_url: str | None) -> None:
    """Query the runs in the registry."""
    ctx.ensure_object(dict)["registry_url"] = registry_url


def _default_metric_columns(rows: Sequence[RunRow], limit: int = 3) -> list[str]:
    keys = sorted({k for r in rows for k in r.metrics})
    losses = [k for k in keys if "loss" in k.lower()]
    return [f"metrics.{k}" for k in (losses or keys)[:limit]]


def _run_columns(rows: Sequence[RunRow], where: str | None, sort: str | None, extra: list[str]) -> list[str]:
    cols = ["params.active"]
    for name in [*referenced_fields(where, sort), *extra, *_default_metric_columns(rows)]:
        if name not in cols and name not in ("id", "name", "status", "sweep", "seed", "started"):
            cols.append(name)
    return cols


@runs_cmd.command("list")
@registry_option
@click.option("--where", "-w", help=_WHERE_HELP)
@click.option("--sort", "-s", help="sort fields, e.g. 'metrics.val_loss' or '-created, name' (- or DESC: descending)")
@click.option("--limit", "-n", type=click.IntRange(0, 1 << 31), default=None,
              help=f"at most N runs; 0: all (default: {TABLE_LIMIT} for a table, all for json/csv)")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="table: for reading; json/csv: every row, keyed by the filter field names")
@click.option("--columns", "-c",
              help="extra fields to show, comma-separated (params.model.n_layers,summary.tokens_per_s); checked like "
                   "--where fields")
@click.pass_context
def runs_list(ctx, registry_url, where, sort, limit, fmt, columns) -> None:
    """List runs, filtered and sorted (newest first by default)."""
    extra = _split_columns(columns, "runs")
    reg = _open(ctx, registry_url)
    _check_columns(reg, extra)
    # A table is for reading: show the first TABLE_LIMIT and say so; json/csv are for tools and get everything.
    cut = TABLE_LIMIT if limit is None and fmt == "table" else limit or None
    rows = reg.runs(where=where, sort=sort, limit=cut + 1 if cut and limit is None else cut)
    more = limit is None and cut is not None and len(rows) > cut
    rows = rows[:cut] if more else rows
    if fmt == "json":
        echo(_dump_json_rows([_finite(_run_record(r, extra)) for r in rows]))
        return
    if fmt == "csv":
        out = io.StringIO()
        _write_csv([_run_record(r, extra) for r in rows], out)
        echo(out.getvalue(), nl=False)
        return
    if not rows:
        echo(f"no runs{' match' if where else ''} in {reg.url}")
        return
    cols = _run_columns(rows, where, sort, extra)
    heads = ["id", "name", "status", "sweep", "seed", "started", "time", *cols]
    cells = [[r.id, r.name, _status(r), r.sweep or "-", str(r.seed),
              _fmt("started", r.started), _duration(r.duration_s), *(_fmt(c, r.get(c)) for c in cols)] for r in rows]
    console = _console()
    table, dropped = fit_columns(console, heads, cells, keep=3, make_table=_plain_table)
    console.print(table)
    shown = f"{len(rows)} run{'s' if len(rows) != 1 else ''}"
    if more:
        shown = f"first {shown}; more match (--limit N or --limit 0 for all)"
    console.print(Text(shown + dropped_note(dropped, console), style="dim"))
    stale = sum(r.stale for r in rows)
    if stale:
        console.print(Text(f"{stale} RUNNING run{'s' if stale != 1 else ''} without a recent heartbeat (stale): "
                           "`archspec runs reap` marks them KILLED", style="yellow"))


def _plain_table(heads: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    """A borderless table whose cells are never cut or wrapped: the first column (ids) at full width always."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    for i, head in enumerate(heads):
        numeric = "." in head or head in ("runs",)
        table.add_column(head, no_wrap=True, justify="right" if numeric else "left",
                         min_width=max((len(str(r[i])) for r in rows), default=0) if i == 0 else None)
    for r in rows:
        table.add_row(*r)
    return table


def _history_table(histories: dict[str, list[MetricPoint]]) -> Table:
    table = Table(title="metrics", box=None, header_style="bold", title_justify="left", pad_edge=False)
    for head in ("key", "points", "steps", "last", "min", "max", "history"):
        table.add_column(head, justify="left" if head in ("key", "history", "steps") else "right", no_wrap=True)
    for key, pts in histories.items():
        vals = [p.value for p in pts]
        finite = [v for v in vals if not math.isnan(v)]
        table.add_row(
            key, str(len(pts)), f"{pts[0].step}–{pts[-1].step}", _fmt(key, vals[-1]),
            _fmt(key, min(finite)) if finite else "-", _fmt(key, max(finite)) if finite else "-", _sparkline(vals),
        )
    return table


@runs_cmd.command("show")
@registry_option
@click.argument("run_id")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="table: for reading; json: one object")
@click.option("--history", "history_key", metavar="KEY", help="print only every point of this metric (step, value)")
@click.pass_context
def runs_show(ctx, registry_url, run_id, fmt, history_key) -> None:
    """One run: its spec, params, summary and metric history (RUN_ID or a unique prefix of it)."""
    reg = _open(ctx, registry_url)
    run = reg.get_run(run_id)
    histories = reg.metric_histories(run.id)
    artifacts = reg.artifacts(run.id)
    evaluations = reg.evaluations(run.id)
    if history_key is not None and history_key not in histories:
        known = ", ".join(histories) or "none"
        raise UserError(f"run {run.id} has no metric {history_key!r} (it has: {known})")
    if history_key is not None:  # the history alone: what was asked for, ready to pipe
        points = histories[history_key]
        if fmt == "json":
            echo(_dump_json({"run": run.id, "key": history_key,
                                   "history": [[p.step, p.value, p.time] for p in points]}))
            return
        pts = Table(box=None, header_style="bold", pad_edge=False)
        pts.add_column("step", justify="right")
        pts.add_column("value", justify="right")
        for p in points:
            pts.add_row(str(p.step), _fmt(history_key, p.value))
        console = _console()
        console.print(f"{history_key} of run {run.id}", highlight=False)
        console.print(pts)
        return
    if fmt == "json":
        data = run.to_dict()
        data.update(notes=[{"created": t.isoformat() if t else None, "text": n} for t, n in reg.notes(run.id)])
        data.update(accounting=accounting_fields(run.accounting), spec=run.spec, params=run.params,
                    artifacts=[{"kind": k, "path": p} for k, p in artifacts], evaluations=evaluations,
                    history={k: [[p.step, p.value, p.time] for p in pts] for k, pts in histories.items()})
        echo(_dump_json(data))
        return
    console = _console()
    info = Table(box=None, show_header=False, pad_edge=False)
    info.add_column(style="bold")
    info.add_column()
    for label, value in [
        ("run", run.id), ("name", run.name), ("status", _status(run)),
        ("attempt", str(run.attempt)), ("sweep", run.sweep or "-"), ("seed", str(run.seed)),
        ("model hash", run.model_hash), ("data hash", run.data_hash), ("host", run.host or "-"),
        ("code version", run.code_version or "-"), ("created", _fmt("", run.created)),
        ("started", _fmt("", run.started)), ("ended", _fmt("", run.ended)), ("duration", _duration(run.duration_s)),
        ("tags", ", ".join(f"{k}={v}" for k, v in run.tags.items()) or "-"),
        *([("spec name", run.spec_name)] if run.spec_name and run.spec_name != run.name else []),
        ("note", run.note or "-"),
    ]:
        info.add_row(label, value)
    console.print(info)
    if run.error:
        console.print(Text("\nerror:", style="bold red"))
        console.print(Text("\n".join(printable(line) for line in run.error.split("\n"))))
    acct = Table(title="accounting", box=None, header_style="bold", title_justify="left", pad_edge=False)
    acct.add_column("field")
    acct.add_column("value", justify="right")
    for key, value in accounting_fields(run.accounting).items():  # named as in filters: flops.forward, ...
        acct.add_row(key, f"{value:,}" if isinstance(value, int) else str(value))
    console.print()
    console.print(acct)
    console.print(Text("\nspec", style="bold italic"))
    spec = dict(run.spec)
    spec["train"] = run.recipe or spec.get("train")  # the recipe actually used: these are the run's params
    console.print(Text(yaml.safe_dump(spec, sort_keys=False).rstrip()))
    if run.summary:
        summ = Table(title="summary", box=None, header_style="bold", title_justify="left", pad_edge=False)
        summ.add_column("key")
        summ.add_column("value", justify="right")
        for k, v in run.summary.items():
            summ.add_row(k, _fmt(k, v))
        console.print()
        console.print(summ)
    console.print()
    if histories:
        console.print(_history_table(histories))
    else:
        console.print(Text("no metrics recorded", style="dim"))
    if artifacts:
        console.print(Text("\nartifacts", style="bold italic"))
        for kind, path in artifacts:
            console.print(f"  {kind}: {path}")
    if evaluations:  # capability probes (`archspec probe`), recorded beside the run
        probes = Table(title="\nprobes", box=None, header_style="bold", title_justify="left", pad_edge=False)
        for head in ("id", "task", "params", "metrics", "created"):
            probes.add_column(head)
        for e in evaluations:
            params = ", ".join(f"{k}={v}" for k, v in e["params"].items() if k != "kind")
            figures = ", ".join(f"{k}={_fmt(k, v)}" for k, v in e["metrics"].items())
            probes.add_row(str(e["id"]), e["task"], printable(params), figures, e["created"] or "-")
        console.print(probes)


@runs_cmd.command("compare")
@registry_option
@click.argument("run_ids", nargs=-1, required=True)
@click.option("--all", "show_all", is_flag=True, help="also list the params that are the same in every run")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="table: for reading; json: one object")
@click.pass_context
def runs_compare(ctx, registry_url, run_ids, show_all, fmt) -> None:
    """Runs side by side: the params that differ (the spec diff), accounting, and metrics."""
    if len(run_ids) < 2:
        raise UserError("runs compare needs at least two run ids")
    reg = _open(ctx, registry_url)
    runs = [reg.get_run(r) for r in run_ids]
    params = [r.params for r in runs]
    keys = sorted({k for p in params for k in p})
    missing = object()
    diff = {k: [p.get(k, missing) for p in params] for k in keys}
    differing = {k: vs for k, vs in diff.items() if len({json.dumps(v, default=str) for v in vs}) > 1}
    shown = diff if show_all else differing
    metric_keys = sorted({k for r in runs for k in r.metrics})
    summary_keys = sorted({k for r in runs for k in r.summary})
    accts = [accounting_fields(r.accounting) for r in runs]
    acct_keys = list(dict.fromkeys(k for a in accts for k in a))
    if fmt == "json":
        echo(_dump_json({
            "runs": [r.id for r in runs],
            "status": [r.status for r in runs],
            "seed": [r.seed for r in runs],
            "params": {k: [None if v is missing else v for v in vs] for k, vs in shown.items()},
            "accounting": {k: [a.get(k) for a in accts] for k in acct_keys},
            "metrics": {k: [r.metrics.get(k) for r in runs] for k in metric_keys},
            "best": {k: [r.best.get(k) for r in runs] for k in metric_keys},
            "best_is": {k: "highest" if higher_is_better(k) else "lowest" for k in metric_keys},
            "summary": {k: [r.summary.get(k) for r in runs] for k in summary_keys},
        }))
        return
    console = _console()
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("")
    for r in runs:
        table.add_column(f"{r.id}\n{r.name}", justify="right", no_wrap=True)

    def section(title: str) -> None:
        table.add_row(Text(title, style="bold italic"), *[""] * len(runs))

    table.add_row("status", *(_status(r) for r in runs))
    table.add_row("seed", *(str(r.seed) for r in runs))
    table.add_row("sweep", *(r.sweep or "-" for r in runs))
    section(f"params ({'all' if show_all else f'{len(differing)} differ'})")
    for k, vs in shown.items():
        style = "" if k in differing else "dim"
        cells = (Text("-" if v is missing else _fmt(k, v), style=style) for v in vs)
        table.add_row(Text(f"  {k}", style=style), *cells)
    section("accounting")
    for k in acct_keys:
        table.add_row(f"  {k}", *(_fmt(k, a.get(k)) for a in accts))
    if metric_keys:
        section("metrics (latest / best: lowest, or highest for throughput, MFU, accuracy)")
        for k in metric_keys:
            label = f"  {k} (best {'highest' if higher_is_better(k) else 'lowest'})"
            table.add_row(label, *(f"{_fmt(k, r.metrics.get(k))} / {_fmt(k, r.best.get(k))}" for r in runs))
    if summary_keys:
        section("summary")
        for k in summary_keys:
            table.add_row(f"  {k}", *(_fmt(k, r.summary.get(k)) for r in runs))
    console.print(table)
    from archspec.ablate.report import loads_differed

    note = loads_differed([r.summary for r in runs if r.summary.get("tokens_per_s")])
    if note:  # tokens_per_s above measured the machine as much as the runs
        echo(f"note: {note}", err=True)


@runs_cmd.command("reap")
@registry_option
@click.option("--timeout", "timeout_s", type=FiniteFloat(0.0, 365 * 86400.0), default=None, metavar="SECONDS",
              help="call a run dead after this long without a heartbeat (default: the timeout its writer recorded)")
@click.pass_context
def runs_reap(ctx, registry_url, timeout_s) -> None:
    """Mark KILLED every RUNNING run whose writer stopped sending heartbeats (a write; reads only show them stale)."""
    reg = _open(ctx, registry_url)
    marked = reg.reap(timeout_s=timeout_s)
    for run_id in marked:
        echo(run_id)
    echo(f"marked {len(marked)} stale run{'s' if len(marked) != 1 else ''} KILLED in {reg.url}", err=True)


@runs_cmd.command("export")
@registry_option
@click.option("--where", "-w", help=_WHERE_HELP)
@click.option("--sort", "-s", help="sort fields (see runs list)")
@click.option("--limit", "-n", type=click.IntRange(0, 1 << 31), default=None, help="at most N runs (default: all)")
@click.option("--format", "fmt", type=click.Choice(["json", "jsonl", "csv"]), default="json", show_default=True,
              help="one record per run keyed by the filter field names (params.*, flops.*, metrics.*, summary.*)")
@click.option("--metrics/--no-metrics", "with_metrics", default=False,
              help="include every metric point (json/jsonl: a history per run; csv: one row per point)")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), help="file to write (default: stdout)")
@click.pass_context
def runs_export(ctx, registry_url, where, sort, limit, fmt, with_metrics, output) -> None:
    """Export runs (and optionally their metric histories) as JSON, JSON lines or CSV."""
    reg = _open(ctx, registry_url)
    rows = reg.runs(where=where, sort=sort, limit=limit or None)

    def record(r: RunRow) -> dict[str, Any]:
        data = _finite(_run_record(r))
        if with_metrics:
            data["history"] = {k: [[p.step, p.value if math.isfinite(p.value) else None, p.time] for p in pts]
                               for k, pts in reg.metric_histories(r.id).items()}
        return data

    out = io.StringIO()
    if fmt == "json":
        out.write(_dump_json_rows([record(r) for r in rows]) + "\n")
    elif fmt == "jsonl":
        for r in rows:
            out.write(json.dumps(record(r), default=_json_default) + "\n")
    elif with_metrics:
        w = csv.writer(out, lineterminator="\n")
        w.writerow(["run_id", "key", "step", "value", "time"])
        for r in rows:
            for k, pts in reg.metric_histories(r.id).items():
                w.writerows([r.id, k, p.step, p.value, p.time] for p in pts)
    else:
        _write_csv([_run_record(r) for r in rows], out)
    if output:
        try:
            with open(output, "w", encoding="utf-8") as f:
                f.write(out.getvalue())
        except OSError as e:
            raise UserError(f"--output {output}: {e.strerror}") from None
        echo(f"exported {len(rows)} run{'s' if len(rows) != 1 else ''} to {output}", err=True)
    else:
        echo(out.getvalue(), nl=False)


# ── housekeeping: tags, notes, names, deletion, checkpoints ─────────────────────────────────────────────────────

_TAG_KEY_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
MAX_TAG_VALUE = 4096
MAX_NOTE = 10_000
MAX_NAME = 128  # runs.display_name is String(128)


def _tag_key(key: str, what: str) -> str:
    from archspec.registry.writes import WRITER_TAGS

    if not key or len(key) > 128 or not set(key) <= _TAG_KEY_CHARS or key[0] in ".-" or key.endswith("."):
        raise UserError(f"{what}: tag key {printable(key, 60)!r} must be 1-128 letters, digits, '_', '.' or '-' "
                        "(starting with a letter, digit or '_'), so that `tags.<key>` can name it")
    if key in WRITER_TAGS:
        raise UserError(f"{what}: tag {key!r} is written by the training loop itself ({', '.join(WRITER_TAGS)}); "
                        "choose another key")
    return key


def _user_text(text: str, what: str, limit: int, one_line: bool) -> str:
    text = text.strip()
    if not text:
        raise UserError(f"{what} is empty")
    if len(text) > limit:
        raise UserError(f"{what} is {len(text)} characters long; at most {limit}")
    bad = next((c for c in text if not c.isprintable() and not (c == "\n" and not one_line)), None)
    if bad is not None:
        raise UserError(f"{what} holds the control character {bad!r}"
                        f"{' (a name is one line)' if one_line else ''}: {printable(text, 60)!r}")
    return text


@runs_cmd.command("tag")
@registry_option
@click.argument("run_id")
@click.argument("assignments", nargs=-1, metavar="KEY=VALUE...")
@click.option("--remove", "-r", "removals", multiple=True, metavar="KEY", help="remove this tag (also: KEY=)")
@click.pass_context
def runs_tag(ctx, registry_url, run_id, assignments, removals) -> None:
    """Set tags on a run (KEY=VALUE; KEY= or --remove KEY removes one); filter them as tags.KEY."""
    if not assignments and not removals:
        raise UserError("runs tag needs KEY=VALUE (or KEY= / --remove KEY to remove a tag)")
    tags: dict[str, str] = {}
    remove = [_tag_key(k, "--remove") for k in removals]
    for a in assignments:
        key, eq, value = a.partition("=")
        if not eq:
            raise UserError(f"runs tag: {printable(a, 60)!r} is not KEY=VALUE (KEY= removes a tag)")
        key = _tag_key(key.strip(), "runs tag")
        if value.strip():
            tags[key] = _user_text(value, f"the value of tag {key!r}", MAX_TAG_VALUE, one_line=True)
        else:
            remove.append(key)
    both = sorted(set(tags) & set(remove))
    if both:
        raise UserError(f"runs tag: tag {both[0]!r} is both set and removed")
    reg = _open(ctx, registry_url)
    run = reg.get_run(run_id)
    reg.set_tags(run.id, tags, remove)
    gone = [k for k in remove if k in run.tags]
    echo(f"run {run.id}: " + "; ".join(
        [*(f"{k}={printable(v, 80)}" for k, v in tags.items()), *(f"removed {k}" for k in gone)] or ["no change"]))


@runs_cmd.command("note")
@registry_option
@click.argument("run_id")
@click.argument("text")
@click.pass_context
def runs_note(ctx, registry_url, run_id, text) -> None:
    """Add a free-text note to a run; `runs show` shows the latest, `--where "note like '%lr%'"` finds it."""
    text = _user_text(text, "the note", MAX_NOTE, one_line=False)
    reg = _open(ctx, registry_url)
    run = reg.get_run(run_id)
    reg.add_note(run.id, text)
    echo(f"run {run.id}: noted")


@runs_cmd.command("rename")
@registry_option
@click.argument("run_id")
@click.argument("new_name", required=False)
@click.option("--reset", is_flag=True, help="give the run back its spec's name (instead of NEW_NAME; also: '-')")
@click.pass_context
def runs_rename(ctx, registry_url, run_id, new_name, reset) -> None:
    """Give a run a display name (its id never changes; `spec_name` keeps the spec's); --reset takes it away."""
    if (new_name is None) == (not reset):
        raise UserError("runs rename needs NEW_NAME or --reset (not both)" if reset else
                        "runs rename needs NEW_NAME (or --reset to give the run back its spec's name)")
    name = None if reset or new_name == "-" else _user_text(new_name, "the new name", MAX_NAME, one_line=True)
    reg = _open(ctx, registry_url)
    run = reg.get_run(run_id)
    reg.rename_run(run.id, name)
    echo(f"run {run.id}: {printable(run.name, 80)} → {printable(name or run.spec_name, 80)}")


@runs_cmd.command("delete")
@registry_option
@click.argument("run_ids", nargs=-1, required=True, metavar="RUN...")
@click.option("--force", is_flag=True, help="also delete FINISHED runs that belong to a sweep, and RUNNING runs "
              "that are stale but not yet reaped (their writer may be alive on another host)")
@click.option("--yes", "-y", is_flag=True, help="do not ask for confirmation (scripts)")
@click.option("--dry-run", is_flag=True, help="say what would be deleted, delete nothing")
@click.option("--keep-files", is_flag=True, help="delete the registry rows only; leave every file in place")
@click.pass_context
def runs_delete(ctx, registry_url, run_ids, force, yes, dry_run, keep_files) -> None:
    """Delete runs: their registry rows and their run directories, together (never half of it)."""
    from archspec.console import byte_size
    from archspec.registry.housekeeping import delete_runs, plan_deletion

    reg = _open(ctx, registry_url)
    runs = list({r.id: r for r in (reg.get_run(i) for i in run_ids)}.values())
    for r in runs:
        if r.status == "RUNNING" and not r.stale:
            raise UserError(f"run {r.id} is RUNNING (its writer is alive); stop it first (or `archspec runs reap` "
                            "once it is dead)")
        if r.status == "RUNNING" and not force:  # stale by its heartbeat only: a slow writer, or one on another host
            raise UserError(f"run {r.id} is RUNNING and stale (no recent heartbeat), but its writer may still be "
                            "alive; `archspec runs reap` marks it KILLED first (then delete it), or --force deletes it "
                            "anyway")
        if r.status == "FINISHED" and r.sweeps and not force:
            raise UserError(f"run {r.id} FINISHED and belongs to sweep {printable(r.sweeps[0], 60)}: its report needs "
                            "it; --force deletes it anyway")
    plans = plan_deletion(reg, runs, keep_files=keep_files)
    for p in plans:
        echo(f"run {p.run.id} ({printable(p.run.name, 60)}, {p.run.status}): its registry rows")
        for d in p.dirs:
            echo(f"  directory {printable(str(d), 200)} ({byte_size(p.size)})")
        for d in p.missing:
            echo(f"  ({printable(str(d), 200)} is not here (another host, moved, or a relative path); left alone)")
    total = sum(p.size for p in plans)  # plan_deletion lists a directory two runs share once
    what = f"{len(plans)} run{'s' * (len(plans) != 1)}" + (f" and {byte_size(total)} of files" if total else "")
    if dry_run:
        echo(f"would delete {what} (dry run: nothing deleted)")
        return
    if not yes:
        try:
            ok = click.confirm(f"delete {what}?", default=False)
        except click.exceptions.Abort:
            raise UserError("no answer to the confirmation (stdin closed); pass --yes to delete without asking; "
                            "nothing deleted") from None
        if not ok:
            echo("nothing deleted")
            ctx.exit(1)
    delete_runs(reg, plans, done=lambda left: _said_done(f"deleted {what}", left))


@click.command("gc")
@registry_option
@click.option("--keep", type=click.Choice(KEEP_POLICIES), default="last", show_default=True,
              help="last: each FINISHED run keeps its latest checkpoint; best: per model, only the run with the best "
                   "--metric keeps one; none: no FINISHED run keeps any")
@click.option("--metric", default="val_loss", show_default=True, help="the metric --keep best judges by "
              "(metrics.best.<metric>: lowest, or highest for throughput, MFU, accuracy)")
@click.option("--where", "-w", help="only runs matching this filter (see runs list)")
@click.option("--apply", "do_apply", is_flag=True, help="delete the files (default: a dry run listing them)")
@click.pass_context
def gc_cmd(ctx, registry_url, keep, metric, where, do_apply) -> None:
    """Free the checkpoints of FINISHED runs that a policy lets go (dry run unless --apply). Never touches a RUNNING
    run, or a file that is not recorded as a run's checkpoint."""
    from archspec.console import byte_size
    from archspec.registry.housekeeping import apply_gc, plan_gc
    from archspec.registry.query.fields import unknown_key

    reg = _open(ctx, registry_url)
    if keep == "best":
        try:
            ref = resolve_field(f"metrics.best.{metric}", "runs")
        except ValueError:
            ref = None
        if not metric or ref is None or ref.kind != "metric" or ref.key != metric or metric.startswith(".") \
                or metric.endswith(".") or ".." in metric or not all(c.isprintable() and not c.isspace() for c in metric):
            raise UserError(f"--metric {printable(metric, 80)!r} is not a metric key (e.g. val_loss, loss)")
        problem = unknown_key(f"metrics.best.{metric}", *reg.known_keys()[:2])
        if problem:
            raise UserError(f"--metric {printable(metric, 80)}: {problem.replace('metrics.best.', '')}")
    plan = plan_gc(reg, keep, metric, where)
    for f in plan:
        echo(f"{f.run.id}  {byte_size(f.size):>10}  {printable(str(f.path), 200)}  ({f.why})")
    total = byte_size(sum(f.size for f in plan))
    n = f"{len(plan)} checkpoint{'s' * (len(plan) != 1)}"
    if not do_apply:
        echo(f"would free {total} in {n} (--keep {keep}; --apply deletes them)")
        return
    if not plan:  # nothing to free: nothing written (a mistyped --registry URL is not created)
        echo(f"freed {total} in {n}")
        return
    apply_gc(reg, plan, done=lambda left: _said_done(f"freed {total} in {n}", left))


def _said_done(what: str, left: list[str]) -> None:
    """What a deletion did, said once it is complete (before an interrupt that arrived meanwhile is acted on)."""
    echo(what)
    for a in left:
        echo(f"could not remove {printable(a, 200)}; remove it by hand", err=True)


# ── specs ────────────────────────────────────────────────────────────────────────────────────────────────────────


@click.group("specs")
@registry_option
@click.pass_context
def specs_cmd(ctx: click.Context, registry_url: str | None) -> None:
    """Query the specs recorded by `archspec build` (with their accounting), trained or not."""
    ctx.ensure_object(dict)["registry_url"] = registry_url


@specs_cmd.command("list")
@registry_option
@click.option("--where", "-w", help="filter over params and accounting, e.g. 'params.active < 20e6'")
@click.option("--sort", "-s", help="sort fields, e.g. 'params.active' or '-created'")
@click.option("--limit", "-n", type=click.IntRange(0, 1 << 31), default=None,
              help=f"at most N specs; 0: all (default: {TABLE_LIMIT} for a table, all for json/csv)")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="table: for reading; json/csv: every row, keyed by the filter field names")
@click.option("--columns", "-c", help="extra fields to show, comma-separated (e.g. params.model.d_model)")
@click.pass_context
def specs_list(ctx, registry_url, where, sort, limit, fmt, columns) -> None:
    """List recorded models (one row per model, with every name it was built under) and their parameter counts,
    FLOPs at context_length (flops.seq_len) and KV-cache size. In `runs list`, flops.* are each run's own, at its
    seq_len."""
    extra = _split_columns(columns, "specs")
    reg = _open(ctx, registry_url)
    cut = TABLE_LIMIT if limit is None and fmt == "table" else limit or None
    rows: list[SpecRow] = list(reg.specs(where=where, sort=sort, limit=cut + 1 if cut and limit is None else cut))
    more = limit is None and cut is not None and len(rows) > cut
    rows = rows[:cut] if more else rows
    if fmt == "json":
        echo(_dump_json_rows([s.flat() for s in rows]))
        return
    if fmt == "csv":
        out = io.StringIO()
        _write_csv([s.flat() for s in rows], out)
        echo(out.getvalue(), nl=False)
        return
    if not rows:
        echo(f"no specs{' match' if where else ''} in {reg.url}")
        return
    cols = ["params.total", "params.active", "params.embedding", "flops.forward", "flops.seq_len", "kv_cache_bytes"]
    for name in [*referenced_fields(where, sort), *extra]:
        if name not in cols and name not in ("hash", "model_hash", "spec_hash", "name", "created"):
            cols.append(name)
    heads = ["hash", "names", *cols, "runs", "created"]
    cells = [[s.hash[:12], ", ".join(s.names) or s.name, *(_fmt(c, s.get(c)) for c in cols), str(s.n_runs),
              _fmt("", s.created)] for s in rows]
    console = _console()
    table, dropped = fit_columns(console, heads, cells, keep=2, make_table=_plain_table)
    console.print(table)
    shown = f"{len(rows)} spec{'s' if len(rows) != 1 else ''}"
    if more:
        shown = f"first {shown}; more match (--limit N or --limit 0 for all)"
    console.print(Text(shown + dropped_note(dropped, console), style="dim"))


# ── the database itself ──────────────────────────────────────────────────────────────────────────────────────────


@click.group("registry")
def registry_cmd() -> None:
    """The registry database itself: its schema revision, and upgrading it."""


@registry_cmd.command("upgrade")
@registry_option
def registry_upgrade(registry_url) -> None:
    """Create the registry, or bring its schema to this archspec's revision (reads never do this themselves)."""
    from archspec.registry.migrate import head_revision

    with Registry(registry_url or default_url()) as reg:
        before, after = reg.upgrade()
    if before == after:
        echo(f"registry {reg.url}: already at revision {after}")
    elif before is None:
        echo(f"registry {reg.url}: created at revision {after}")
    else:
        echo(f"registry {reg.url}: upgraded from revision {before} to {after}")
    assert after == head_revision()


@registry_cmd.command("status")
@registry_option
def registry_status(registry_url) -> None:
    """The registry's schema revision, and whether this archspec reads it as it is."""
    from archspec.registry.migrate import head_revision, readable_revisions

    with Registry(registry_url or default_url()) as reg:
        rev = reg.schema_revision
    if rev is None:
        echo(f"registry {reg.url}: no registry there yet (the first write, or `archspec registry upgrade`, "
                   "creates it)")
    elif rev == head_revision():
        echo(f"registry {reg.url}: revision {rev}, current")
    elif rev in readable_revisions():
        echo(f"registry {reg.url}: revision {rev}, readable as it is; the next write upgrades it to "
                   f"{head_revision()}")
    else:
        echo(f"registry {reg.url}: revision {rev}, older than this archspec reads; "
                   "`archspec registry upgrade` brings it to " + head_revision())
