"""`archspec ui` server-side times over a large registry: 10,000 runs × 1,000 points (bench_registry's builder), the
runs page and a 10-run chart (the ten metric requests its script makes), each through the app in-process (Starlette's
TestClient: routing, the registry query, rendering, JSON; no network). Target: each under 300 ms.

    .venv/bin/python bench/bench_ui.py [--runs 10000] [--points 1000] [--repeat 15] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_registry import SORT, WHERE, build  # noqa: E402


def _time(fn, repeat: int) -> dict:
    first = time.perf_counter()
    fn()
    first = time.perf_counter() - first
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"first_ms": 1e3 * first, "median_ms": 1e3 * statistics.median(times), "max_ms": 1e3 * max(times)}


def main() -> None:
    from starlette.testclient import TestClient

    from archspec.ui.app import create_app

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--points", type=int, default=1_000)
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        built = build(db, a.runs, a.points)
        client = TestClient(create_app(f"sqlite:///{db}"), base_url="http://127.0.0.1")
        ids = [r["id"] for r in client.get("/api/runs", params={"limit": "10"}).json()["runs"]]

        def ok(response):
            assert response.status_code == 200, response.text[:300]
            return response

        result = {
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
            "runs": a.runs, "points_per_run": a.points, "build_s": sum(v for k, v in built.items() if k.endswith("_s")),
            "runs_page": _time(lambda: ok(client.get("/")), a.repeat),
            "runs_page_filtered": _time(lambda: ok(client.get("/", params={"where": WHERE, "sort": SORT})), a.repeat),
            "chart_10_runs": _time(lambda: [ok(client.get(f"/api/runs/{i}/metrics/val_loss")) for i in ids], a.repeat),
            "run_page": _time(lambda: ok(client.get(f"/runs/{ids[0]}")), a.repeat),
        }
    if a.json:
        print(json.dumps(result, indent=2))
        return
    print(f"machine: {result['machine']}; {a.runs:,} runs × {a.points:,} points (built in {result['build_s']:.0f} s)")
    for key in ("runs_page", "runs_page_filtered", "chart_10_runs", "run_page"):
        r = result[key]
        print(f"  {key:<20} median {r['median_ms']:7.1f} ms   max {r['max_ms']:7.1f} ms   first {r['first_ms']:7.1f} ms")


if __name__ == "__main__":
    main()
