"""`archspec ablate --dry-run` estimates against the wall time of the same sweeps (issue 33).

    python bench/bench_estimate.py [--steps 20] [--eval-tokens 8192]

In a fresh registry and state root: two calibration runs of llama-like-tiny (d_model 48 and 128, `--no-compile`),
then for each preset (norm, ffn, scaling) the dry-run estimate read from that registry alone (never the sweep's own
runs), then the sweep itself, timed as a whole command. Prints one row per preset: estimate, actual, ratio. Run it on
a quiet machine (`uptime` load well under the core count): the ratio measures the estimate, not the neighbours.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRESETS = ["norm", "ffn", "scaling"]


def archspec(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "archspec", *args], capture_output=True, text=True, env=env,
                          cwd=env["ARCHSPEC_HOME"], check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--eval-tokens", type=int, default=8192)
    ap.add_argument("--presets", default=",".join(PRESETS))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-estimate-"))
    env = {**os.environ, "ARCHSPEC_HOME": str(work), "COLUMNS": "250", "PYTHONPATH": str(ROOT)}
    calib = f"sqlite:///{work / 'calib.db'}"
    for d_model, hidden in ((48, 128), (128, 352)):
        r = archspec("train", str(ROOT / "specs/llama-like-tiny.yaml"), "--steps", str(args.steps), "--no-compile",
                     "-q", "--device", "cpu", "--registry", calib, "--set", f"model.d_model={d_model}",
                     "--set", f"model.ffn.hidden_dim={hidden}", "--set", f"train.eval_tokens={args.eval_tokens}",
                     env=env)
        if r.returncode:
            raise SystemExit(f"calibration failed: {r.stderr[-2000:]}")
    common = ["--steps", str(args.steps), "--seeds", "0", "--no-compile", "--device", "cpu",
              "--set", f"train.eval_tokens={args.eval_tokens}"]
    print(f"{'sweep':<10} {'estimate s':>11} {'actual s':>9} {'actual/estimate':>16}   load before")
    for name in args.presets.split(","):
        spec = str(ROOT / f"specs/ablations/{name}.yaml")
        dry = archspec("ablate", spec, *common, "--dry-run", "--registry", calib, env=env)
        m = re.search(r"estimated total ([0-9.]+) (s|min)", dry.stdout + dry.stderr)
        if dry.returncode or not m:
            raise SystemExit(f"{name}: no estimate: {(dry.stdout + dry.stderr)[-2000:]}")
        estimate = float(m.group(1)) * (60 if m.group(2) == "min" else 1)
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        real = archspec("ablate", spec, *common, "--registry", f"sqlite:///{work / (name + '.db')}",
                        "--out", str(work / name), env=env)
        actual = time.perf_counter() - t0
        if real.returncode:
            raise SystemExit(f"{name}: sweep failed: {real.stderr[-2000:]}")
        print(f"{name:<10} {estimate:>11.0f} {actual:>9.1f} {actual / estimate:>16.2f}   {load:.2f}", flush=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
