"""`archspec ui`: a read-only Starlette app over the registry. Pages are Jinja2 (autoescaped: every value from the
registry is hostile), charts are uPlot, shipped in static/ (no page loads anything from another origin), and every
page draws from the JSON endpoints scripts can use too:

    /api/runs?where=&sort=&limit=      runs, filtered and sorted as `runs list` does (a bad filter: 400, the message)
    /api/runs/{id}                     one run: record, spec, accounting, artifacts, evaluations, metric keys
    /api/runs/{id}/metrics/{key}       one metric's history: step, value, tokens, FLOPs
    /api/sweeps/{name}                 a sweep's report: rows with Welch intervals, verdicts, main effects

Nothing here writes to the registry: the app only calls Registry's reads, which never create or migrate anything.
"""

from __future__ import annotations

import difflib
import json
import math
from pathlib import Path
from typing import Any

import jinja2
import markupsafe
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from archspec.console import number
from archspec.errors import UserError, redact
from archspec.registry.query.fields import resolve_field
from archspec.registry.store import Registry, RunRow
from archspec.registry.values import flatten

HERE = Path(__file__).parent
DEFAULT_COLUMNS = ["metrics.val_loss", "params.total", "params.active", "summary.tokens_per_s"]
PAGE_LIMIT = 200  # rows a runs page shows; the JSON endpoint takes ?limit=
MAX_LIMIT = 10_000
# Content-Security-Policy: scripts and styles from this origin only, no inline script, nothing from elsewhere.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")

def shown_text(value: Any) -> Any:
    """Registry text as a page shows it: control characters (but line breaks and tabs) and Unicode format characters
    (the bidi overrides and isolates that reorder what a reader sees, zero-width marks) written as visible escapes
    (`\\u202e`), passwords in URLs hidden (archspec.errors.redact). HTML escaping is Jinja's; this is what it leaves.
    Applied to every value a template prints (the environment's `finalize`) and every string of a JSON answer."""
    if not isinstance(value, str) or isinstance(value, markupsafe.Markup):
        return value
    value = redact(value)
    if value.isprintable():
        return value
    return "".join(c if c.isprintable() or c in "\n\t" else (repr(c)[1:-1] if ord(c) < 0x100 else f"\\u{ord(c):04x}")
                   for c in value)


_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                          undefined=jinja2.StrictUndefined, finalize=shown_text)
_ENV.filters["num"] = lambda v: "-" if v is None else number(v) if isinstance(v, (int, float)) else str(v)


def _json_safe(value: Any) -> Any:
    """NaN and infinities as null: JSON has neither. Strings (keys too) as pages show them (`shown_text`): the pages
    build their tables from these answers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str):
        return shown_text(value)
    if isinstance(value, dict):
        return {shown_text(str(k)): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _json(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(_json_safe(data), status_code=status, headers={"Content-Security-Policy": CSP})


def _page(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    html = _ENV.get_template(name).render(**context)
    return HTMLResponse(html, status_code=status, headers={"Content-Security-Policy": CSP,
                                                            "X-Content-Type-Options": "nosniff"})


def _limit(request: Request, default: int) -> int:
    raw = request.query_params.get("limit", "")
    if not raw:
        return default
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_LIMIT:
        raise HTTPException(400, f"limit: expected a whole number from 1 to {MAX_LIMIT}, got {raw[:40]!r}")
    return int(raw)


def _columns(request: Request) -> list[str]:
    raw = request.query_params.get("columns")
    cols = [c.strip() for c in raw.split(",") if c.strip()] if raw is not None else DEFAULT_COLUMNS
    return cols[:20]


def _steps(run: RunRow) -> int | None:
    """How far a run got: the summary's count once it ended, else its last logged step."""
    done = run.summary.get("steps")
    return int(done) if done is not None else max(run.steps.values(), default=None)


def _run_record(run: RunRow, columns: list[str]) -> dict[str, Any]:
    return {"id": run.id, "name": run.name, "status": run.status, "stale": run.stale, "sweep": run.sweep,
            "seed": run.seed, "started": run.started.isoformat() if run.started else None,
            "steps": _steps(run), "columns": {c: run.get(c) for c in columns}}


class App:
    """The routes over one registry."""

    def __init__(self, registry_url: str | None):
        self.registry = Registry(registry_url)
        self.registry_url = self.registry.url

    # ── data (the JSON endpoints; the pages call the same functions) ──

    def runs(self, request: Request, default_limit: int) -> dict[str, Any]:
        where = request.query_params.get("where") or None
        sort = request.query_params.get("sort") or None
        columns = _columns(request)
        limit = _limit(request, default_limit)
        try:
            for c in columns:
                resolve_field(c, "runs")
            rows = self.registry.runs(where=where, sort=sort or "-created", limit=limit + 1)
        except (UserError, ValueError) as e:  # a FilterError (with its caret) is a UserError
            raise HTTPException(400, e.render() if isinstance(e, UserError) else str(e)) from None
        return {"where": where, "sort": sort, "columns": columns, "limit": limit, "more": len(rows) > limit,
                "runs": [_run_record(r, columns) for r in rows[:limit]]}

    def _get_run(self, run_id: str) -> RunRow:
        try:
            return self.registry.get_run(run_id)
        except UserError:
            raise HTTPException(404, f"no run {run_id[:80]!r} in this registry") from None

    def run(self, run_id: str) -> tuple[RunRow, dict[str, Any]]:
        run = self._get_run(run_id)
        run_id = run.id  # a prefix in the URL: the run's own id from here on
        data = run.to_dict()
        data.update(spec=run.spec, params=run.params, artifacts=[{"kind": k, "path": p} for k, p in
                                                                 self.registry.artifacts(run_id)],
                    evaluations=self.registry.evaluations(run_id), metric_keys=sorted(run.steps))  # keys, no points
        from archspec.registry.values import SYSTEM_TAGS

        tags = data.get("tags") or {}  # the user's own first; what archspec records by itself folded below
        data["user_tags"] = {k: v for k, v in tags.items() if k not in SYSTEM_TAGS}
        data["system_tags"] = {k: v for k, v in tags.items() if k in SYSTEM_TAGS}
        return run, data

    def metric(self, run_id: str, key: str) -> dict[str, Any]:
        run = self._get_run(run_id)
        run_id = run.id
        points = self.registry.metric_history(run_id, key)
        tokens, flops = run.tokens_per_step, run.accounting_fields.get("flops.train")  # None where a row lacks them
        return {"run": run_id, "key": key, "name": run.name,
                "step": [p.step for p in points], "value": [p.value for p in points],
                "tokens": [p.step * tokens for p in points] if tokens else None,
                "flops": [p.step * tokens * flops for p in points] if tokens and flops else None}

    def sweep(self, name: str, budget_key: str | None = None, curve_keys: tuple[str, ...] = ()) -> dict[str, Any]:
        """A sweep's report at one budget (archspec.ablate.budgets: `?budget=` its key; default the latest), with
        every budget the sweep has run at, so that two budgets' runs never mix in one table or chart."""
        from archspec.ablate.budgets import name_budgets
        from archspec.ablate.report import effect_numbers, effect_rows, main_effects, table_rows, variant_numbers
        from archspec.ablate.runner import collect

        budgets = name_budgets(self.registry, name)
        if budget_key is not None:
            chosen = [b for b in budgets if b.key == budget_key or (budget_key and b.key.startswith(budget_key))]
            if len(chosen) != 1:
                raise HTTPException(404, f"sweep {name[:80]!r} has no budget {budget_key[:80]!r}")
            budget = chosen[0]
        else:
            budget = budgets[0] if budgets else None
        try:
            variants, baseline = collect(self.registry, name, None,
                                         only=set(budget.run_ids) if budget is not None else None)
        except UserError:  # a name the filter language cannot hold is no sweep of this registry either
            variants, baseline = [], 0
        if not variants or not any(v.runs for v in variants):
            raise HTTPException(404, f"no sweep {name[:80]!r} in this registry")
        effects = main_effects(variants, baseline)
        rows = table_rows(variants, baseline)
        return {"sweep": name, "baseline": baseline, "rows": rows,
                "groups": {key: sweep_curves(self.registry, variants, rows, key) for key in curve_keys},
                "budget": budget.key if budget is not None else None,
                "budgets": [{"key": b.key, "label": b.label, "runs": len(b.run_ids), "seeds": b.seeds,
                             "steps": b.steps, "latest": b.latest.isoformat() if b.latest else None}
                            for b in budgets],
                "variants": variant_numbers(variants, baseline), "main_effects": effect_numbers(effects),
                "effect_rows": effect_rows(effects),
                "runs": [{"variant": v.label, "run": r.run_id, "seed": r.seed} for v in variants for r in v.runs]}

    # ── routes ──

    async def api_runs(self, request: Request) -> Response:
        return _json(self.runs(request, MAX_LIMIT))

    async def api_run(self, request: Request) -> Response:
        return _json(self.run(request.path_params["run_id"])[1])

    async def api_metric(self, request: Request) -> Response:
        return _json(self.metric(request.path_params["run_id"], request.path_params["key"]))

    async def api_sweep(self, request: Request) -> Response:
        keys = tuple(k for k in request.query_params.getlist("curves") if k)[:8]  # ?curves=val_loss&curves=loss
        data = self.sweep(request.path_params["name"], request.query_params.get("budget"), keys)
        data.pop("effect_rows")
        return _json(data)

    async def runs_page(self, request: Request) -> Response:
        try:
            data = self.runs(request, PAGE_LIMIT)
            error = None
        except HTTPException as e:
            data = {"where": request.query_params.get("where"), "sort": request.query_params.get("sort"),
                    "columns": _columns(request), "limit": PAGE_LIMIT, "more": False, "runs": []}
            error = e.detail
        return _page("runs.html.j2", status=400 if error else 200, error=error, registry=self.registry_url, **data)

    async def run_page(self, request: Request) -> Response:
        run, data = self.run(request.path_params["run_id"])
        import yaml

        spec_yaml = yaml.safe_dump(run.spec, sort_keys=False, allow_unicode=True)
        source, source_error = _generated_source(run.spec)
        return _page("run.html.j2", run=data, spec_yaml=spec_yaml, source=source, source_error=source_error,
                     accounting=flatten(data["accounting"]) if isinstance(data["accounting"], dict) else {},
                     recipe=flatten(data["recipe"]), command=_reproduce(run, str(request.base_url)))

    async def spec_yaml(self, request: Request) -> Response:
        run = self._get_run(request.path_params["run_id"])
        import yaml

        return PlainTextResponse(yaml.safe_dump(run.spec, sort_keys=False, allow_unicode=True),
                                 headers={"Content-Disposition": 'attachment; filename="spec.yaml"'})

    async def compare_page(self, request: Request) -> Response:
        ids = [i for i in request.query_params.get("ids", "").split(",") if i]
        if not 2 <= len(ids) <= 8:
            raise HTTPException(400, f"compare: give 2 to 8 run ids, ?ids=A,B (got {len(ids)})")
        runs = [self._get_run(i) for i in ids]
        ids = [r.id for r in runs]
        flat = [flatten({"model": r.spec.get("model") or {}, "train": r.recipe, "summary": r.summary}) for r in runs]
        keys = sorted(set().union(*flat))
        fields = [{"key": k, "values": [json.dumps(f.get(k), sort_keys=True) if k in f else "-" for f in flat]}
                  for k in keys]
        for f in fields:
            f["differs"] = len(set(f["values"])) > 1
        fields.sort(key=lambda f: not f["differs"])  # what differs first, then the rest in key order
        sources = [_generated_source(r.spec)[0] or "" for r in runs]
        diff = list(difflib.unified_diff(sources[0].splitlines(), sources[1].splitlines(), f"{ids[0]}.py",
                                         f"{ids[1]}.py", lineterm="", n=2))
        return _page("compare.html.j2", ids=ids, runs=[r.to_dict() for r in runs], fields=fields, diff=diff,
                     differing=sum(f["differs"] for f in fields))

    async def sweeps_page(self, request: Request) -> Response:
        return _page("sweeps.html.j2", sweeps=self.registry.sweep_names())

    async def sweep_page(self, request: Request) -> Response:
        data = self.sweep(request.path_params["name"], request.query_params.get("budget"))
        return _page("sweep.html.j2", **data)


def sweep_curves(registry: Registry, variants, rows: list[dict[str, str]], key: str) -> list[dict[str, Any]]:
    """A sweep's curves of metric `key` grouped by variant: at each step the seeds' mean and its 95% t interval (the
    report's own interval function, archspec.ablate.stats.mean_interval), with the variant's verdict beside it."""
    from archspec.ablate.stats import mean_interval

    out = []
    for v, row in zip(variants, rows):
        by_step: dict[int, list[float]] = {}
        for r in v.runs:
            for p in registry.metric_history(r.run_id, key):
                if p.value is not None and math.isfinite(p.value):
                    by_step.setdefault(p.step, []).append(p.value)
        steps = sorted(by_step)
        intervals = [mean_interval(by_step[s]) for s in steps]
        out.append({"variant": v.index, "label": v.label or "base", "row": row["variant"],
                    "verdict": row.get("verdict"), "delta": row.get("Δ vs baseline"), "ci": row.get("95% CI"),
                    "seeds": len(v.runs), "step": steps, "n": [len(by_step[s]) for s in steps],
                    "mean": [i.estimate for i in intervals],
                    "low": [i.low if i.known else None for i in intervals],
                    "high": [i.high if i.known else None for i in intervals]})
    return out


def _generated_source(spec: dict[str, Any]) -> tuple[str | None, str | None]:
    """The run's generated model file, rendered again from its stored spec (same spec → same bytes)."""
    try:
        from archspec.codegen import render
        from archspec.spec import load_spec_dict

        return render(load_spec_dict(spec)), None
    except UserError as e:
        return None, e.render()


def _reproduce(run: RunRow, base_url: str) -> str:
    """The command that trains the run again: its stored spec (model and the recipe as run) through `train`. Every
    part quoted for the shell: the name and the URL come from the registry and the request."""
    import shlex

    file = shlex.quote(f"{run.name}.yaml")
    return f"curl -s {shlex.quote(f'{base_url}runs/{run.id}/spec.yaml')} > {file} && archspec train {file}"


async def _error(request: Request, exc: HTTPException) -> Response:
    if request.url.path.startswith("/api/"):
        return _json({"error": exc.detail}, exc.status_code)
    return _page("error.html.j2", status=exc.status_code, status_code=exc.status_code, message=exc.detail)


def served_hosts(host: str) -> tuple[str, ...]:
    """The Host header names that reach a server bound to `host`, and only those (the Host allow-list): a page
    elsewhere whose domain is rebound to this address (DNS rebinding) is answered 400. Bound to every address
    (0.0.0.0, ::): any name the machine is reached by."""
    import ipaddress

    if host in ("0.0.0.0", "::"):
        return ("*",)
    if host == "localhost":
        return ("localhost", "127.0.0.1", "::1", "[::1]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return (host,)
    if address.version == 6:
        return (host, f"[{host}]", *(("localhost",) if address.is_loopback else ()))
    return (host, *(("localhost",) if address.is_loopback else ()))


LOOPBACK_NAMES = served_hosts("127.0.0.1")  # the default bind: tests give TestClient base_url="http://127.0.0.1"


def create_app(registry_url: str | None = None, allowed_hosts: tuple[str, ...] | list[str] = LOOPBACK_NAMES
               ) -> Starlette:
    """`allowed_hosts`: the Host headers answered (others: 400). Loopback names by default, so a page elsewhere
    whose domain is rebound to 127.0.0.1 (DNS rebinding) cannot read the registry through a browser."""
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    app = App(registry_url)
    routes = [
        Route("/", app.runs_page),
        Route("/runs/{run_id}", app.run_page),
        Route("/runs/{run_id}/spec.yaml", app.spec_yaml),
        Route("/compare", app.compare_page),
        Route("/sweeps", app.sweeps_page),
        Route("/sweeps/{name:path}", app.sweep_page),
        Route("/api/runs", app.api_runs),
        Route("/api/runs/{run_id}", app.api_run),
        Route("/api/runs/{run_id}/metrics/{key:path}", app.api_metric),
        Route("/api/sweeps/{name:path}", app.api_sweep),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    starlette = Starlette(routes=routes, exception_handlers={HTTPException: _error},
                          middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))])
    starlette.state.archspec = app
    return starlette
