"""Launchers against `--launcher local` (issue 31): overhead per run, and a sweep's wall time with 1 and 2 workers.

    python bench/bench_launchers.py [--steps 20] [--seeds 2]

A tiny sweep (2 variants × `--seeds` seeds, d_model 32, one layer, `--no-compile`, `--device cpu`, real text from the
standard library) run as a whole `python -m archspec ablate` command in a fresh SQLite registry per configuration,
all sharing one warm data cache: local (this process), slurm-local (submitit's local executor) and ray (a local
cluster) with `--max-parallel 1` and `2`. Per configuration: the command's wall time; its excess over local per run
(what the launcher costs a run: a new interpreter importing torch, submitit's pickles and polling, Ray's start);
and, from the registry, submission → first step of each run (the SCHEDULED row's creation to the first metric point's
time; local has no submission, so its figure is the run's start to its first step). Prints the load average before
and after: figures under a load above the core count measure the neighbours as much as the launchers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
MODULES = ["bisect.py", "colorsys.py", "copy.py", "fnmatch.py", "heapq.py", "keyword.py", "numbers.py", "queue.py"]
CONFIGS = [("local", None), ("slurm-local", 1), ("slurm-local", 2), ("ray", 1), ("ray", 2)]


def sweep_file(work: Path, steps: int, seeds: int) -> Path:
    corpus = work / "corpus"
    corpus.mkdir()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in MODULES:
        (corpus / name.replace(".py", ".txt")).write_text((stdlib / name).read_text(encoding="utf-8"))
    base = {"name": "base",
            "model": {"vocab_size": 300, "context_length": 16, "d_model": 32, "n_layers": 1,
                      "attention": {"n_heads": 2}, "ffn": {"kind": "glu", "hidden_dim": 64}},
            "train": {"batch_size": 2, "seq_len": 16, "lr": 3e-3, "warmup_steps": 1, "eval_tokens": 64,
                      "compile": "none", "data": {"corpus": {"kind": "files", "paths": [str(corpus)]},
                                                 "val_fraction": 0.1}}}
    path = work / "bench.yaml"
    path.write_text(yaml.safe_dump({"name": "bench", "base": base, "seeds": list(range(seeds)),
                                    "budget": {"steps": steps}, "grid": {"model.norm.kind": ["layernorm", "rmsnorm"]}}))
    return path


def first_steps(url: str) -> list[float]:
    """Per run: seconds from its row's creation (SCHEDULED at submission, or RUNNING at a local start) to its
    first metric point."""
    from archspec.registry import Registry

    reg = Registry(url)
    out = []
    for run in reg.runs(where="sweep = 'bench'"):
        points = [p for key in ("loss", "train_loss", "lr") for p in reg.metric_history(run.id, key)]
        if not points:
            points = [p for key in run.metrics for p in reg.metric_history(run.id, key)]
        out.append(min(p.time for p in points) - run.created.timestamp())
    reg.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-launchers-"))
    env = {**os.environ, "ARCHSPEC_HOME": str(work), "ARCHSPEC_CACHE": str(work / "cache"), "PYTHONPATH": str(ROOT)}
    path = sweep_file(work, args.steps, args.seeds)
    runs = 2 * args.seeds
    print(f"load average before: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()}); {runs} runs of {args.steps} steps")
    warm = subprocess.run([sys.executable, "-m", "archspec", "ablate", str(path), "--dry-run"], env=env,
                          cwd=work, capture_output=True, text=True)  # the data cache, not timed
    if warm.returncode:
        sys.exit(warm.stderr)
    rows = []
    local_wall = None
    for kind, parallel in CONFIGS:
        url = f"sqlite:///{work / f'{kind}-{parallel}.db'}"
        cmd = [sys.executable, "-m", "archspec", "ablate", str(path), "--registry", url, "--no-compile", "--device",
               "cpu", "--launcher", kind, "--out", str(work / "reports" / f"{kind}-{parallel}")]
        if parallel:
            cmd += ["--max-parallel", str(parallel)]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode:
            sys.exit(f"{kind}: exit {done.returncode}\n{done.stderr[-3000:]}")
        local_wall = wall if kind == "local" else local_wall
        firsts = first_steps(url)
        rows.append((kind, parallel, wall, (wall - local_wall) / runs, statistics.median(firsts), max(firsts)))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print("| launcher | workers | sweep wall | excess over local per run | submission → first step: median / max |")
    print("|---|---|---|---|---|")
    for kind, parallel, wall, excess, med, top in rows:
        print(f"| {kind} | {parallel or 1} | {wall:.1f} s | {excess:+.1f} s | {med:.1f} / {top:.1f} s |")


if __name__ == "__main__":
    main()
