"""The memory plan against measured peak memory, and activation checkpointing's cost and saving, on CPU.

    .venv/bin/python bench/bench_memory.py            # a table on stdout
    .venv/bin/python bench/bench_memory.py --json     # the same as one JSON object

Each configuration runs in a fresh process: the corpus is tokenised and the CPU peak cached first, then the process
notes its resident set, resets its high-water mark (`/proc/self/clear_refs`), builds the shared loop's `Trainer`
(generated model, fused AdamW; eager, as a compiled block saves no more) and runs `--steps` optimizer steps (the
second is the first with AdamW state, i.e. the steady-state peak). Measured = VmHWM − the resident set before the
Trainer: what the run allocated, without the interpreter and torch's libraries, which `archspec.memory` does not
count (on CPU it compares against MemAvailable, which already excludes them). Step time is the median of the steps
after the first.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (label, overrides on specs/llama-like.yaml). Sizes chosen to span weights-bound to activation-bound, up to ~1 GB.
SIZES = [
    ("small", ["model.d_model=256", "model.n_layers=4", "model.attention.n_heads=4", "model.attention.n_kv_heads=2",
               "model.ffn.hidden_dim=704", "train.batch_size=8", "train.seq_len=256"]),
    ("medium", ["train.batch_size=8", "train.seq_len=256"]),  # llama-like itself: 30M parameters
    ("large", ["model.d_model=768", "model.n_layers=12", "model.attention.n_heads=12", "model.attention.n_kv_heads=4",
               "model.ffn.hidden_dim=2048", "train.batch_size=4", "train.seq_len=256"]),
]
# Activation checkpointing none vs full: llama-like (30M parameters) at a window whose activations dominate.
AC_CONFIG = ["train.batch_size=8", "train.seq_len=512", "model.context_length=512"]
CORPUS_MODULES = ["bisect.py", "colorsys.py", "copy.py", "fnmatch.py", "heapq.py", "keyword.py", "numbers.py",
                  "queue.py", "sched.py", "shlex.py", "stat.py", "string.py", "textwrap.py", "token.py", "types.py"]


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def corpus_dir() -> Path:
    """A small fixed corpus (a few stdlib modules as text): tokenising it costs nothing measurable."""
    out = Path(tempfile.gettempdir()) / "archspec-bench-memory-corpus"
    out.mkdir(exist_ok=True)
    root = Path(sysconfig.get_paths()["stdlib"])
    for name in CORPUS_MODULES:
        if (root / name).exists() and not (out / name).exists():
            (out / name.replace(".py", ".txt")).write_text((root / name).read_text(encoding="utf-8"), encoding="utf-8")
    return out


def measure(overrides: list[str], steps: int) -> dict:
    """In this (fresh) process: plan, then measure the peak of building the Trainer and `steps` steps."""
    import torch

    sys.path.insert(0, str(ROOT))
    from archspec.memory import plan_memory
    from archspec.spec import load_spec
    from archspec.cache import cache_dir
    from archspec.train.data import prepare_tokens
    from archspec.train.loop import Trainer
    from archspec.train.throughput import peak_flops

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    spec = load_spec(ROOT / "specs" / "llama-like.yaml", [
        *overrides, f"train.steps={steps}", "train.warmup_steps=1", "train.compile=none",
        f"train.data.corpus={{kind: files, paths: [{corpus_dir()}]}}"])
    plan = plan_memory(spec, device="cpu")
    prepare_tokens(spec.train.data, spec.model.vocab_size, cache_dir())  # tokenise outside the measurement
    peak_flops(torch.device("cpu"), torch.float32, cache_dir())  # cached after the first process
    import torch._dynamo  # noqa: F401  (the optimizer step imports it: ~70 MB of modules, not the run's tensors)
    # Hand back what the preparation freed (a first tokenisation, the matmul peak measurement), so that the baseline
    # is not inflated by heap pages the run would reuse.
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with tempfile.TemporaryDirectory() as run_dir:
        baseline = _status_kib("VmRSS") * 1024
        Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM := VmRSS
        trainer = Trainer(spec, device="cpu", run_dir=run_dir, compile=False)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            trainer.train_step()
            times.append(time.perf_counter() - t0)
        peak = _status_kib("VmHWM") * 1024
    return {"overrides": overrides, "params": plan.params, "planned_bytes": plan.total, "plan": plan.to_dict(),
            "measured_bytes": peak - baseline, "baseline_rss_bytes": baseline,
            "ratio": plan.total / (peak - baseline), "step_s": statistics.median(times[1:] or times)}


def run_worker(overrides: list[str], steps: int) -> dict:
    """`measure` in a fresh Python process (so nothing freed earlier hides in the high-water mark)."""
    out = subprocess.run([sys.executable, __file__, "--worker", json.dumps({"overrides": overrides, "steps": steps})],
                         capture_output=True, text=True, check=False, cwd=ROOT)
    if out.returncode:
        raise SystemExit(f"worker {overrides} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one measurement, JSON on stdout
    args = parser.parse_args()
    if args.worker:
        job = json.loads(args.worker)
        print(json.dumps(measure(job["overrides"], job["steps"])))
        return

    import torch

    from archspec.train.throughput import cpu_name

    report = {"machine": f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}",
              "date": time.strftime("%Y-%m-%d", time.gmtime()), "sizes": {}}
    for label, overrides in SIZES:
        report["sizes"][label] = run_worker(overrides, args.steps)
    report["checkpointing"] = {kind: run_worker(AC_CONFIG + [f"train.activation_checkpointing.kind={kind}"], args.steps)
                               for kind in ("none", "full")}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"machine: {report['machine']}  ({report['date']})")
    print(f"{'size':8} {'params':>11} {'planned':>10} {'measured':>10} {'plan/meas':>10} {'step s':>7}")
    for label, r in report["sizes"].items():
        print(f"{label:8} {r['params']:11,} {r['planned_bytes'] / 2**20:8.0f} MiB {r['measured_bytes'] / 2**20:6.0f} MiB "
              f"{r['ratio']:10.3f} {r['step_s']:7.2f}")
    print(f"activation checkpointing, llama-like {' '.join(AC_CONFIG)}:")
    for kind, r in report["checkpointing"].items():
        print(f"{kind:8} {r['params']:11,} {r['planned_bytes'] / 2**20:8.0f} MiB {r['measured_bytes'] / 2**20:6.0f} MiB "
              f"{r['ratio']:10.3f} {r['step_s']:7.2f}")


if __name__ == "__main__":
    main()
