"""Compile modes of the shared loop (`train.compile`): compile seconds, steady tokens/s and MFU per mode, per size.

    .venv/bin/python bench/compile_modes.py                    # CUDA: llama-like 26M + gpt2-small-like 124M, all modes,
                                                               # and nanoGPT compiled beside gpt2; CPU: the two CPU sizes
    .venv/bin/python bench/compile_modes.py --size smoke       # CPU smoke test: tiny sizes, two steps (minutes)
    .venv/bin/python bench/compile_modes.py --json out.json    # also the report as JSON

Each (size, mode) runs in its own process with a fresh inductor cache (the compile seconds are a new spec's on a new
machine: cold), through `archspec.train.loop.Trainer` (`compile=<mode>`; the mode actually used and why are
reported: cudagraphs falls back on CPU), then `--steps` steps after two warm-up steps; the median step counts, and
the fastest beside it (load from other work only ever slows a step down).
MFU = our training FLOPs per token (exact matmuls, causal attention) × tokens/s ÷ the ceiling: the datasheet bf16
peak on a known GPU, else this machine's measured fp32 matmul rate. The peer, beside gpt2-small-like, is
bench/reference_nanogpt.py compiled whole as nanoGPT does (`compile=True`), driven as bench/bench_train.py drives it.

Sizes: `gpu` (CUDA; bf16 autocast; batch 8 × 1024): llama-like (26M; issue 32's H200 figures: per-block 422k tok/s,
whole 815k, cudagraphs 1,234k) and gpt2-small-like (124M). `cpu` (fp32): llama-like-tiny (0.5M, batch 8 × 128) and a
llama-like at 4 layers, d_model 384, vocab 8192 (~11M, batch 4 × 256): the figures `auto`'s CPU rule uses
(archspec.train.compile.CPU_MEASURED). `smoke`: tiny models, two steps: that the script runs.
Everything is printed as it is measured (one line per process), so a run cut short by a time limit keeps what it did.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from archspec.accounting import account  # noqa: E402
from archspec.spec import load_spec  # noqa: E402
from archspec.cache import cache_dir  # noqa: E402
from archspec.train.throughput import cpu_name, measure_matmul_flops, peak_flops  # noqa: E402

# name: (preset, overrides); the training recipe (batch, seq_len) is part of each size
SIZES = {
    "gpu": {
        "llama-26M": ("llama-like.yaml", ["train.batch_size=8", "train.seq_len=1024"]),
        "gpt2-124M": ("gpt2-small-like.yaml", ["train.batch_size=8", "train.seq_len=1024"]),
    },
    "cpu": {
        "llama-tiny": ("llama-like-tiny.yaml", ["train.batch_size=8", "train.seq_len=128"]),
        "llama-11M": ("llama-like.yaml", ["model.n_layers=4", "model.d_model=384", "model.attention.n_heads=6",
                                          "model.attention.n_kv_heads=2", "model.attention.head_dim=64",
                                          "model.ffn.hidden_dim=1024", "model.context_length=256",
                                          "train.batch_size=4", "train.seq_len=256"]),
    },
    "smoke": {
        "llama-tiny": ("llama-like-tiny.yaml", ["model.n_layers=1", "train.batch_size=2", "train.seq_len=32"]),
        "gpt2-tiny": ("gpt2-tiny.yaml", ["model.n_layers=1", "train.batch_size=2", "train.seq_len=32"]),
    },
}
PEER_FOR = {"gpt2-124M": "gpt2", "gpt2-tiny": "gpt2"}  # sizes that get nanoGPT compiled beside them
MODES_CUDA = ("none", "per_block", "whole", "cudagraphs")
MODES_CPU = ("none", "per_block", "whole", "cudagraphs")  # cudagraphs: shows the fallback (to whole) and its reason


def size_spec(size: str, name: str):
    preset, overrides = SIZES[size][name]
    return load_spec(ROOT / "specs" / preset, [*overrides, "train.steps=1000", "train.warmup_steps=10",
                                               "train.eval_tokens=4096"])


# ── one process: one (size, mode) or the peer ───────────────────────────────────────────────────────────────────


def measure(size: str, name: str, mode: str, steps: int) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    spec = size_spec(size, name)
    if mode == "nanogpt":
        from bench_train import peer_step

        step, compile_s = peer_step(PEER_FOR[name], spec, device)
        used, reason = "whole", "nanoGPT's compile=True: torch.compile(model)"
    else:
        from archspec.train.loop import Trainer

        run_dir = tempfile.mkdtemp(prefix="bench-compile-")
        atexit.register(shutil.rmtree, run_dir, ignore_errors=True)
        trainer = Trainer(spec, device=device.type, run_dir=run_dir, compile=mode)
        step, compile_s = trainer.train_step, trainer.compile_s
        used, reason = trainer.compile_mode, trainer.compile_reason
    t0 = time.perf_counter()
    step()  # the first real step (a cudagraphs run records its graphs here)
    first_s = time.perf_counter() - t0
    step()
    times, cpu_times = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    tokens = spec.train.batch_size * spec.train.seq_len
    median = statistics.median(times)
    return {"size": name, "mode": mode, "used": used, "reason": reason, "compile_s": compile_s,
            "first_step_s": first_s, "step_s": median, "step_times_s": times, "tokens_per_step": tokens,
            "tokens_per_s": tokens / median, "step_min_s": min(times),
            # CPU seconds of the process's threads: barely moved by other work on a shared machine
            "step_cpu_s": statistics.median(cpu_times)}


def run_one(size: str, name: str, mode: str, steps: int, timeout: float, cold: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="inductor-") as inductor:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": inductor} if cold else dict(os.environ)  # cold: a new spec
        try:
            out = subprocess.run([sys.executable, __file__, "--one", size, name, mode, "--steps", str(steps)],
                                 capture_output=True, text=True, env=env, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return {"size": name, "mode": mode, "error": f"over {timeout:.0f} s"}
    if out.returncode:
        return {"size": name, "mode": mode, "error": out.stderr.strip().splitlines()[-1][-300:] if out.stderr else
                f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


# ── the matrix ──────────────────────────────────────────────────────────────────────────────────────────────────


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), help="default: gpu with CUDA, else cpu")
    parser.add_argument("--steps", type=int, default=0, help="measured steps per process (default: 20 gpu, 5 cpu, "
                                                             "2 smoke)")
    parser.add_argument("--modes", default="", help="comma-separated subset of the modes")
    parser.add_argument("--only", default="", help="comma-separated subset of the size's models (e.g. llama-tiny)")
    parser.add_argument("--budget-s", type=float, default=540.0,
                        help="stop starting processes past this many seconds (the device limit is 10 minutes)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--repeats", type=int, default=1, help="processes per (size, mode), the modes alternating; the "
                        "fastest counts (load from other work only ever slows one down)")
    parser.add_argument("--cache", choices=["cold", "warm"], help="inductor cache per process: a fresh one (cold, "
                        "the default: compile seconds as a new spec sees them) or the user's (warm; smoke's default)")
    parser.add_argument("--one", nargs=3, metavar=("SIZE", "NAME", "MODE"), help=argparse.SUPPRESS)  # internal
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    size = args.one[0] if args.one else (args.size or ("gpu" if cuda else "cpu"))
    steps = args.steps or {"gpu": 20, "cpu": 5, "smoke": 2}[size]
    if args.one:
        print(json.dumps(measure(*args.one, steps)))
        return

    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    if cuda:
        ceiling, source = peak_flops(device, dtype, cache_dir())
    else:
        ceiling, source = measure_matmul_flops(device, dtype), "this machine's measured fp32 matmul rate"
    modes = [m for m in (args.modes.split(",") if args.modes else (MODES_CUDA if cuda else MODES_CPU))]
    cold = (args.cache or ("warm" if size == "smoke" else "cold")) == "cold"
    started = time.perf_counter()
    report = {"inductor_cache": "cold" if cold else "warm", "machine": f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
                         + (f", {torch.cuda.get_device_name(device)}" if cuda else ""),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(sys.argv),
              "precision": "bf16 autocast" if cuda else "fp32", "load_average_start": os.getloadavg(), "ceiling_flops": ceiling, "ceiling_source": source,
              "results": []}
    print(f"# {report['machine']} · {report['precision']} · ceiling {ceiling / 1e12:.2f} TFLOP/s ({source})",
          flush=True)
    print(f"{'size':<11} {'params':>7} {'mode':<10} {'used':<10} {'compile s':>9} {'step ms':>9} {'tok/s':>10} "
          f"{'MFU':>6} {'vs eager':>8} {'min ms':>8} {'vs eager':>8} {'CPU s ÷ eager':>13}", flush=True)
    for name in [n for n in SIZES[size] if not args.only or n in args.only.split(",")]:
        spec = size_spec(size, name)
        acc = account(spec, seq_len=spec.train.seq_len)
        # the peer first: the comparison the issue asks for is never the one a spent budget skips
        runs = (["nanogpt"] if name in PEER_FOR else []) + modes
        best: dict[str, dict] = {}
        for _ in range(args.repeats):  # alternate, so drifting load falls on every mode alike
            for mode in runs:
                left = args.budget_s - (time.perf_counter() - started)
                if left < 30:
                    best.setdefault(mode, {"size": name, "mode": mode, "error": "skipped: budget spent"})
                    continue
                r = run_one(size, name, mode, steps, timeout=left, cold=cold)
                print(f"  ({name} {mode}: " + (f"{r['tokens_per_s']:,.0f} tok/s, compile {r['compile_s']:.1f} s, "
                      f"used {r['used']})" if "error" not in r else f"{r['error']})"), flush=True)
                if "error" in r and "error" not in best.get(mode, r):
                    continue
                if mode not in best or "error" in best[mode] or r.get("tokens_per_s", 0) > best[mode]["tokens_per_s"]:
                    best[mode] = r
        eager = best.get("none") if "error" not in best.get("none", {"error": ""}) else None
        for mode in runs:
            r = best[mode]
            r["params"] = acc.total
            if "error" not in r:
                r["mfu"] = acc.flops_train * r["tokens_per_s"] / ceiling
                r["vs_eager"] = r["tokens_per_s"] / eager["tokens_per_s"] if eager else None
                # the fastest step: load from other work only ever slows a step down
                r["min_vs_eager"] = eager["step_min_s"] / r["step_min_s"] if eager else None
                r["cpu_time_vs_eager"] = r["step_cpu_s"] / eager["step_cpu_s"] if eager else None
                r["train_flops_per_s"] = acc.flops_train * r["tokens_per_s"]
                print(f"{name:<11} {acc.total / 1e6:>6.1f}M {mode:<10} {r['used']:<10} {r['compile_s']:>9.1f} "
                      f"{r['step_s'] * 1e3:>9.1f} {r['tokens_per_s']:>10,.0f} {r['mfu']:>6.1%} "
                      f"{(r['vs_eager'] or 0):>7.2f}× {r['step_min_s'] * 1e3:>8.1f} {(r['min_vs_eager'] or 0):>7.2f}× "
                      f"{(r['cpu_time_vs_eager'] or 0):>13.2f}", flush=True)
                if r["used"] != mode and mode != "nanogpt":
                    print(f"  {mode} → {r['used']}: {r['reason']}", flush=True)
            else:
                print(f"{name:<11} {mode}: FAILED {r['error']}", flush=True)
            report["results"].append(r)
    report["wall_s"] = time.perf_counter() - started
    report["load_average_end"] = os.getloadavg()
    print(f"# {report['wall_s']:.0f} s; load average {report['load_average_start'][0]:.1f} at the start, "
          f"{report['load_average_end'][0]:.1f} at the end", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    out = os.environ.get("OUT")
    if out and Path(out).is_dir():
        (Path(out) / f"compile_modes_{size}.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
