"""Registry benchmarks: query time on a large registry, and the logger's cost per training step.

    .venv/bin/python bench/bench_registry.py                       # 10,000 runs × 1,000 points (about 10M rows)
    .venv/bin/python bench/bench_registry.py --runs 500 --points 100   # a quick look

1. Builds a SQLite registry of N runs × P metric points in a temporary directory: schema by the real migrations,
   specs recorded through `Registry.record_spec`, runs and points bulk-loaded with sqlite3 (dropping the metrics
   index during the load and rebuilding it after, as any bulk load would).
2. Times `runs list` with a two-clause filter and a sort: `Registry.runs(...)` warm (median of repeats), the same
   with limit 50, and the whole CLI command in-process (registry opening and rendering included; the Python
   start-up and imports of the `archspec` executable are not: they are the same for every command).
   Target: < 200 ms.
3. Times the logging overhead per training step on SQLite (3 metrics + a heartbeat per step), against NullLogger
   (no logging) and against raw sqlite3 references (one INSERT+COMMIT per step, and the same batching by hand).
   Target: < 1 ms per step.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from archspec.registry import Registry, RegistryLogger  # noqa: E402
from archspec.registry.store import run_params, typed_value  # noqa: E402
from archspec.spec import canonical_dict, load_spec_dict, model_hash  # noqa: E402
from archspec.train.logger import FINISHED, NullLogger, RunInfo, run_key  # noqa: E402

WHERE = "params.model.norm.kind = 'rmsnorm' and metrics.val_loss < 3.2"
SORT = "metrics.val_loss"


def _specs(n: int):
    rng = random.Random(0)
    out = []
    for i in range(n):
        d_model = rng.choice([128, 256, 384, 512, 768])
        n_heads = rng.choice([h for h in (2, 4, 8) if d_model % h == 0])
        out.append(load_spec_dict({
            "name": f"bench-{i}",
            "model": {"d_model": d_model, "n_layers": rng.choice([2, 4, 6, 8, 12]),
                      "norm": {"kind": rng.choice(["rmsnorm", "layernorm"])},
                      "attention": {"n_heads": n_heads, "n_kv_heads": rng.choice([1, n_heads])},
                      "ffn": {"kind": rng.choice(["mlp", "glu"])}},
        }))
    return out


def _accounting(spec) -> dict:
    m = spec.model
    emb = m.vocab_size * m.d_model
    total = emb + m.n_layers * 12 * m.d_model * m.d_model
    return {"params": {"total": total, "active": total, "embedding": emb, "by_component": {"blocks": total - emb}},
            "flops_per_token": {"forward": 2 * total, "train": 6 * total},
            "kv_cache_bytes_per_token": 2 * m.n_layers * m.attention.n_kv_heads * m.attention.head_dim * 4}


def build(path: Path, n_runs: int, n_points: int, n_specs: int = 200) -> dict:
    """Create the registry at `path`; returns the build timings."""
    t0 = time.perf_counter()
    url = f"sqlite:///{path}"
    reg = Registry(url)
    specs = _specs(n_specs)
    for spec in specs:
        reg.record_spec(spec, "0" * 64, _accounting(spec))
    reg.close()
    t_specs = time.perf_counter() - t0

    rng = random.Random(1)
    now = datetime.now(timezone.utc).replace(tzinfo=None).isoformat(sep=" ")
    keys = ("train_loss", "val_loss")
    per_key = n_points // len(keys)
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA synchronous = OFF")  # a bulk load into a scratch file: durability is not what is measured
    con.execute("DROP INDEX ix_metrics_run_key_step")
    con.execute("BEGIN")
    runs, params, stats, summaries, members = [], [], [], [], []
    for i in range(n_runs):
        spec = specs[i % n_specs]
        data = canonical_dict(spec)
        rid = run_key(model_hash(spec), data["train"], "bench-data", i)
        runs.append((rid, model_hash(spec), spec.name, "bench-data", i, json.dumps(data["train"]), "bench", FINISHED,
                     "benchhost", None, now, now, now, now, 120.0, 1, "{}"))
        members.append((f"sweep-{i % 20}", rid, i % 7, "label", "", 0, now))
        params.extend((rid, k, *typed_value(v)) for k, v in run_params(data, data["train"]).items())
        final = rng.uniform(2.5, 4.5)
        for key in keys:
            stats.append((rid, key, per_key - 1, final, final, final + 5, per_key))
        summaries.append((rid, "tok_s", rng.uniform(1e3, 1e5)))
    con.executemany("INSERT INTO runs (id, spec_hash, name, data_hash, seed, recipe_json, code_version, status, host, "
                    "error, created, started, ended, heartbeat, heartbeat_timeout_s, attempt, accounting_json) VALUES ("
                    + ",".join("?" * 17) + ")", runs)
    con.executemany("INSERT INTO sweep_runs (sweep, run_id, variant, label, sweep_hash, baseline, created) VALUES "
                    "(?,?,?,?,?,?,?)", members)
    con.executemany("INSERT INTO run_params (run_id, key, kind, value_num, value_str) VALUES (?,?,?,?,?)", params)
    con.executemany("INSERT INTO metric_stats VALUES (?,?,?,?,?,?,?)", stats)
    con.executemany("INSERT INTO summary_metrics VALUES (?,?,?)", summaries)
    t_runs = time.perf_counter() - t0 - t_specs

    def points():
        for (rid, *_), st in zip(runs, stats[::2], strict=True):
            final = st[3]
            for key in keys:
                for step in range(per_key):
                    yield rid, key, step, final + 5.0 / (1 + step), 0.0

    con.executemany("INSERT INTO metrics (run_id, key, step, value, time) VALUES (?,?,?,?,?)", points())
    con.execute("COMMIT")
    t_points = time.perf_counter() - t0 - t_specs - t_runs
    con.execute("CREATE INDEX ix_metrics_run_key_step ON metrics (run_id, key, step)")
    con.execute("ANALYZE")
    con.close()
    t_index = time.perf_counter() - t0 - t_specs - t_runs - t_points
    return {"specs_s": t_specs, "runs_s": t_runs, "points_s": t_points, "index_s": t_index,
            "points": n_runs * per_key * len(keys), "size_mb": path.stat().st_size / 2**20}


def _time(fn, repeat: int) -> tuple[float, float, object]:
    result = fn()  # warm-up (and the result, to report how many rows came back)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), result


def bench_query(path: Path, repeat: int) -> dict:
    from archspec.cli import main

    url = f"sqlite:///{path}"
    reg = Registry(url)
    t0 = time.perf_counter()
    reg.runs(where=WHERE, sort=SORT)
    cold_s = time.perf_counter() - t0
    med, best, rows = _time(lambda: reg.runs(where=WHERE, sort=SORT), repeat)
    med50, best50, _ = _time(lambda: reg.runs(where=WHERE, sort=SORT, limit=50), repeat)

    def cli(*args: str):
        def run() -> None:
            with contextlib.redirect_stdout(io.StringIO()):
                assert main(["runs", "list", "--registry", url, "--where", WHERE, "--sort", SORT, *args]) == 0
        return run

    med_table, best_table, _ = _time(cli(), max(3, repeat // 3))
    med_json, best_json, _ = _time(cli("--format", "json"), max(3, repeat // 3))
    reg.close()
    return {"rows": len(rows), "first_query_s": cold_s, "median_s": med, "min_s": best, "limit50_median_s": med50,
            "limit50_min_s": best50, "cli_table_median_s": med_table, "cli_table_min_s": best_table,
            "cli_json_median_s": med_json, "cli_json_min_s": best_json}


def _info(seed: int) -> RunInfo:
    spec = _specs(1)[0]
    data = canonical_dict(spec)
    return RunInfo(spec.name, model_hash(spec), data, "0" * 64, _accounting(spec), "bench-data", 10**6 + seed,
                   data["train"], code_version="bench")


def _loop(logger, steps: int) -> float:
    t0 = time.perf_counter()
    for step in range(steps):
        logger.log_metrics(step, {"train/loss": 3.0 + 1.0 / (step + 1), "lr": 3e-4, "tokens_per_s": 12345.0})
        logger.heartbeat()
    return time.perf_counter() - t0


def bench_logging(path: Path, steps: int) -> dict:
    url = f"sqlite:///{path}"
    with Registry(url) as reg:
        reg.upgrade()  # created before the timed part (opening alone creates nothing)
    out: dict[str, float] = {}

    null = NullLogger()
    null.start(_info(0))
    out["null_us"] = _loop(null, steps) / steps * 1e6

    for name, kwargs in (("registry_us", {}), ("registry_inline_us", {"background": False})):
        logger = RegistryLogger(url, **kwargs)
        logger.start(_info(len(out)))
        loop_s = _loop(logger, steps)
        t0 = time.perf_counter()
        logger.end(FINISHED)
        out[name] = (loop_s + time.perf_counter() - t0) / steps * 1e6  # the final flush counts too

    # References: the same points written with sqlite3 directly into the same kind of table, WAL + NORMAL.
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA synchronous = NORMAL")
    con.execute("CREATE TABLE IF NOT EXISTS ref_metrics (run_id TEXT, key TEXT, step INTEGER, value REAL, time REAL)")
    con.execute("CREATE INDEX IF NOT EXISTS ix_ref ON ref_metrics (run_id, key, step)")
    sql = "INSERT INTO ref_metrics VALUES (?,?,?,?,?)"
    t0 = time.perf_counter()
    for step in range(steps):
        now = time.time()
        con.execute("BEGIN")
        con.executemany(sql, [("ref", "train/loss", step, 3.0, now), ("ref", "lr", step, 3e-4, now),
                              ("ref", "tokens_per_s", step, 12345.0, now)])
        con.execute("COMMIT")
    out["sqlite_per_step_commit_us"] = (time.perf_counter() - t0) / steps * 1e6
    t0 = time.perf_counter()
    buf: list[tuple] = []
    for step in range(steps):
        now = time.time()
        buf += [("ref2", "train/loss", step, 3.0, now), ("ref2", "lr", step, 3e-4, now),
                ("ref2", "tokens_per_s", step, 12345.0, now)]
        if len(buf) >= 256:
            con.execute("BEGIN")
            con.executemany(sql, buf)
            con.execute("COMMIT")
            buf = []
    con.execute("BEGIN")
    con.executemany(sql, buf)
    con.execute("COMMIT")
    out["sqlite_batched_us"] = (time.perf_counter() - t0) / steps * 1e6
    con.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--points", type=int, default=1_000, help="metric points per run")
    p.add_argument("--repeat", type=int, default=15, help="timed repeats of each query")
    p.add_argument("--steps", type=int, default=20_000, help="training steps for the logging benchmark")
    p.add_argument("--dir", help="where to build the registry (default: a temporary directory, removed after)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    a = p.parse_args()

    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        db = Path(tmp) / "bench.db"
        built = build(db, a.runs, a.points)
        query = bench_query(db, a.repeat)
        logging_empty = bench_logging(Path(tmp) / "log.db", a.steps)
        logging_big = bench_logging(db, a.steps)  # the same, into the big registry (larger index to update)
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
                         f"SQLite {sqlite3.sqlite_version}",
              "runs": a.runs, "points_per_run": a.points, "build": built, "query": query,
              "logging_empty_db": logging_empty, "logging_big_db": logging_big}
    if a.json:
        print(json.dumps(result, indent=2))
        return
    ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
    print(f"machine: {result['machine']}")
    print(f"registry: {a.runs:,} runs × {a.points:,} points = {built['points']:,} metric rows, "
          f"{built['size_mb']:.0f} MiB; built in {sum(v for k, v in built.items() if k.endswith('_s')):.1f} s "
          f"(points {built['points_s']:.1f} s, index {built['index_s']:.1f} s)")
    print(f"\nruns list --where \"{WHERE}\" --sort {SORT}   ({query['rows']:,} rows match)")
    print(f"  Registry.runs(), all rows      median {ms(query['median_s'])}  min {ms(query['min_s'])}  "
          f"(first call {ms(query['first_query_s'])})")
    print(f"  Registry.runs(limit=50)        median {ms(query['limit50_median_s'])}  min {ms(query['limit50_min_s'])}")
    print("  the whole `archspec runs list` command in-process (opening the registry, rendering; not Python start-up):")
    for fmt, label in (("table", "--format table (first 50 rows)"), ("json", "--format json (all rows)      ")):
        print(f"    {label}  median {ms(query[f'cli_{fmt}_median_s'])}  min {ms(query[f'cli_{fmt}_min_s'])}")
    for title, lg in (("empty registry", logging_empty), (f"{a.runs:,}-run registry", logging_big)):
        ref = lg["sqlite_per_step_commit_us"]
        print(f"\nlogging overhead per step ({a.steps:,} steps × 3 metrics + heartbeat), {title}:")
        for key, label in (("null_us", "NullLogger (no logging)"), ("registry_us", "RegistryLogger (background)"),
                           ("registry_inline_us", "RegistryLogger (background=False)"),
                           ("sqlite_per_step_commit_us", "raw sqlite3, INSERT+COMMIT per step"),
                           ("sqlite_batched_us", "raw sqlite3, batched by hand (256 points)")):
            print(f"  {label:<40} {lg[key]:8.1f} µs/step   ×{lg[key] / ref:.2f} of per-step sqlite3")


if __name__ == "__main__":
    main()
