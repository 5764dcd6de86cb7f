"""A training-loop stand-in, run as a separate process by the concurrency and signal tests.

    python tests/registry/writer.py URL NAME SEED STEPS MODE [--flush-every N] [--heartbeat-timeout S]

MODE: normal (log STEPS steps, FINISHED) · hang (log, flush, report, keep logging unflushed until killed) ·
      wait (log, flush, report, keep logging until a signal ends it) · raise (fail with ValueError at step STEPS)
Each step logs 3 metrics. Lines on stdout: `flushed N` once N points are in the database, `done` at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tests.registry.helpers

from archspec.registry import RegistryLogger, tracked_run  # noqa: E402 - after the sys.path line
from tests.registry.helpers import make_info, make_spec  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("name")
    p.add_argument("seed", type=int)
    p.add_argument("steps", type=int)
    p.add_argument("mode", choices=["normal", "hang", "wait", "raise"])
    p.add_argument("--flush-every", type=int, default=16)
    p.add_argument("--heartbeat-timeout", type=float, default=120.0)
    a = p.parse_args()

    info = make_info(make_spec(a.name), seed=a.seed, data_hash=f"data-{a.name}")  # names alone are labels
    unflushed = a.mode in ("hang", "wait")  # only the explicit flush() below writes points
    logger = RegistryLogger(a.url, flush_every=10**9 if unflushed else a.flush_every,
                            heartbeat_timeout_s=a.heartbeat_timeout, flush_interval_s=3600 if unflushed else 5.0)
    with tracked_run(logger, info):
        for step in range(a.steps):
            if a.mode == "raise" and step == a.steps - 1:
                raise ValueError("boom at the last step")
            logger.log_metrics(step, {"loss": 1.0 / (step + 1), "lr": 1e-3, "tok_s": 1000.0 + step})
            logger.heartbeat()
        if a.mode in ("hang", "wait"):
            print(f"flushed {logger.flush()}", flush=True)
            step = a.steps
            while True:  # buffered, never flushed, until a signal or kill -9 ends the process
                logger.log_metrics(step, {"loss": 0.0, "lr": 0.0, "tok_s": 0.0})
                step += 1
                time.sleep(0.01)
    print("done", flush=True)


if __name__ == "__main__":
    main()
