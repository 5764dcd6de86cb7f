"""Per-rank peak memory of each parallel layout against the memory plan the loop made (issue 29), on CPU.

    .venv/bin/python bench/parallel_memory.py                 # a table on stdout
    .venv/bin/python bench/parallel_memory.py --json          # the same as one JSON object
    .venv/bin/python bench/parallel_memory.py --only tp2 ep2  # some layouts

Each layout is one `torchrun --standalone` job (gloo, OMP_NUM_THREADS=1, one thread per rank). Every rank measures
its own peak the way bench/bench_memory.py does in one process: the corpus is tokenised, the process group joined and
the modules a step imports (dynamo, DTensor, FSDP) loaded first; then the rank notes its resident set, resets its
high-water mark (`/proc/self/clear_refs`), builds the shared loop's `Trainer` (eager) and runs `--steps` optimizer
steps (the second is the first with AdamW state). Measured = VmHWM − the resident set before the Trainer; planned =
the `Trainer.memory_plan.total` that rank's loop made (archspec.memory.plan_memory at the job's world size, reading
tp/ep from `train.parallel`). Ratio = planned / measured (1.00 is exact; the plan aims within 20%). Under pp the plan is each pipeline process's
(archspec.memory: its stages' weights, the micro-batches its schedule keeps in flight); `planned_bytes` is the
largest, against the largest rank's measured peak, and each rank's own plan is in its row.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench_memory import _status_kib, corpus_dir  # noqa: E402  (the single-process method, shared)

# Dense: llama-like at d_model 512, 4 layers (15M parameters), micro-batch 4 × 256 tokens per data-parallel rank.
DENSE = ("llama-like", ["model.n_layers=4", "train.batch_size=4", "train.seq_len=256"])
# MoE: mixtral-like at 4 layers, 8 experts of hidden 512, top-2 (32M parameters), the same window.
MOE = ("mixtral-like", ["model.n_layers=4", "model.ffn.expert.hidden_dim=512", "train.batch_size=4",
                        "train.seq_len=256"])
# (label, spec, processes, train.parallel). MoE under tp is being built elsewhere: dense specs under tp, MoE under ep.
LAYOUTS = [
    ("single", DENSE, 1, {"kind": "ddp"}),
    ("ddp2", DENSE, 2, {"kind": "ddp"}),
    ("fsdp2", DENSE, 2, {"kind": "fsdp"}),
    ("tp2", DENSE, 2, {"kind": "ddp", "tp": 2}),
    ("fsdp-dp2xtp2", DENSE, 4, {"kind": "fsdp", "tp": 2}),
    ("moe-single", MOE, 1, {"kind": "ddp"}),
    ("ep2", MOE, 2, {"kind": "ddp", "ep": 2}),
    ("fsdp-ep2", MOE, 2, {"kind": "fsdp", "ep": 2}),
    # Pipeline stages (1F1B, micro-batches = pp: 2 of 2 rows): the plan is the largest pipeline process's, so the
    # ratio compares it with the largest rank's measured peak. These run once the loop trains under pp.
    ("pp2", DENSE, 2, {"kind": "ddp", "pp": 2}),
    ("dp2xpp2", DENSE, 4, {"kind": "ddp", "pp": 2}),
    ("tp2xpp2", DENSE, 4, {"kind": "ddp", "tp": 2, "pp": 2}),
]
PIPELINE = {label for label, _, _, parallel in LAYOUTS if parallel.get("pp", 1) > 1}


def loop_trains_pipelines() -> bool:
    """Whether the shared loop builds pipeline stages yet (archspec/train/pipeline.py, which the loop imports when
    train.parallel.pp > 1): without it the pp layouts are skipped, said on stderr."""
    import importlib.util

    return importlib.util.find_spec("archspec.train.pipeline") is not None


def _trim() -> None:
    """Hand back what the preparation freed, so that the baseline holds no heap pages the run would reuse."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def measure(spec_name: str, overrides: list[str], parallel: dict, steps: int, out_dir: str) -> None:
    """In this torchrun rank: join the group, prepare, then measure building the Trainer and `steps` steps."""
    import torch

    sys.path.insert(0, str(ROOT))
    import torch.distributed.fsdp  # noqa: F401  (modules a step imports: not the run's tensors)
    import torch.distributed.tensor  # noqa: F401
    import torch.distributed.tensor.parallel  # noqa: F401
    import torch._dynamo  # noqa: F401

    from archspec.spec import load_spec
    from archspec.cache import cache_dir
    from archspec.train.data import prepare_tokens
    from archspec.train.distributed import init_world
    from archspec.train.loop import Trainer
    from archspec.train.throughput import peak_flops

    torch.set_num_threads(1)
    world = init_world("cpu")
    par = "{" + ", ".join(f"{k}: {v}" for k, v in parallel.items()) + "}"
    spec = load_spec(ROOT / "specs" / f"{spec_name}.yaml", [
        *overrides, f"train.steps={steps}", "train.warmup_steps=1", "train.compile=false",
        f"train.parallel={par}", f"train.data.corpus={{kind: files, paths: [{corpus_dir()}]}}"])
    if world.is_main:  # tokenise (and time the matmul peak) once, outside every rank's measurement
        prepare_tokens(spec.train.data, spec.model.vocab_size, cache_dir())
        peak_flops(torch.device("cpu"), torch.float32, cache_dir())
    world.barrier()
    prepare_tokens(spec.train.data, spec.model.vocab_size, cache_dir())  # reads the cache: its imports, not tokens
    peak_flops(torch.device("cpu"), torch.float32, cache_dir())
    _trim()
    world.barrier()
    with tempfile.TemporaryDirectory() as run_dir:
        baseline = _status_kib("VmRSS") * 1024
        Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM := VmRSS
        trainer = Trainer(spec, device="cpu", run_dir=run_dir, compile=False, world=world)
        stages = [_status_kib("VmHWM") * 1024 - baseline]  # the high-water mark after building, after each step
        for _ in range(steps):
            trainer.train_step()
            stages.append(_status_kib("VmHWM") * 1024 - baseline)
        peak = _status_kib("VmHWM") * 1024
        plan = trainer.memory_plan
        local = sum(getattr(p, "_local_tensor", p).numel() for p in trainer.model.parameters())
    result = {"rank": world.rank, "planned_bytes": plan.total, "measured_bytes": peak - baseline,
              "baseline_rss_bytes": baseline, "stages_bytes": stages, "plan": plan.to_dict(), "local_params": local}
    Path(out_dir, f"rank{world.rank}.json").write_text(json.dumps(result))
    world.barrier()
    world.close()


def run_layout(label: str, spec: tuple[str, list[str]], procs: int, parallel: dict, steps: int,
               mmap_threshold: int | None = None) -> dict:
    """One layout as a torchrun job; every rank's figures. mmap_threshold: glibc's M_MMAP_THRESHOLD for the ranks
    (fixed, so that every tensor above it is its own mapping, returned when freed: the peak of the live tensors
    without the heap's retention), or None for glibc's default (dynamic) one, what a run gets."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    if mmap_threshold is not None:
        env["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold)
    job = json.dumps({"spec": spec[0], "overrides": spec[1], "parallel": parallel, "steps": steps})
    with tempfile.TemporaryDirectory() as out_dir:
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                              str(procs), __file__, "--worker", job, "--out", out_dir],
                             capture_output=True, text=True, check=False, cwd=ROOT, env=env)
        wall = time.perf_counter() - t0
        if out.returncode:
            raise SystemExit(f"layout {label} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
        ranks = sorted((json.loads(p.read_text()) for p in Path(out_dir).glob("rank*.json")), key=lambda r: r["rank"])
    measured = [r["measured_bytes"] for r in ranks]
    planned = [r["planned_bytes"] for r in ranks]
    return {"label": label, "spec": spec[0], "overrides": spec[1], "processes": procs, "parallel": parallel,
            "setup": ranks[0]["plan"]["setup"], "params": ranks[0]["plan"]["params"],
            "local_params": [r["local_params"] for r in ranks], "planned_bytes": max(planned),
            "measured_min_bytes": min(measured), "measured_max_bytes": max(measured),
            "ratio": max(planned) / max(measured), "wall_s": round(wall, 1), "ranks": ranks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", nargs="*", help="layout labels to run (default: all)")
    parser.add_argument("--mmap-threshold", type=int, help="fixed glibc M_MMAP_THRESHOLD in bytes for the ranks (a "
                        "diagnostic: the live tensors' peak without heap retention); default glibc's own")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one rank's measurement
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        job = json.loads(args.worker)
        measure(job["spec"], job["overrides"], job["parallel"], job["steps"], args.out)
        return

    import torch

    from archspec.train.throughput import cpu_name

    report = {"machine": f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}",
              "date": time.strftime("%Y-%m-%d", time.gmtime()), "steps": args.steps,
              "mmap_threshold": args.mmap_threshold, "layouts": []}
    pipelines = loop_trains_pipelines()
    for label, spec, procs, parallel in LAYOUTS:
        if label in PIPELINE and not pipelines:
            if args.only and label in args.only or not args.only:
                print(f"  {label}: skipped (the loop does not train pipeline stages here: no "
                      f"archspec/train/pipeline.py)", file=sys.stderr, flush=True)
            continue
        if not args.only or label in args.only:
            report["layouts"].append(run_layout(label, spec, procs, parallel, args.steps, args.mmap_threshold))
            if not args.json:
                print(f"  {label}: done in {report['layouts'][-1]['wall_s']} s", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    mib = 2 ** 20
    print(f"machine: {report['machine']}  ({report['date']}), {args.steps} steps")
    print(f"{'layout':14} {'spec':13} {'procs':>5} {'params/rank':>12} {'planned':>9} {'measured min–max':>17} "
          f"{'plan/meas':>9}")
    for r in report["layouts"]:
        print(f"{r['label']:14} {r['spec']:13} {r['processes']:5} {max(r['local_params']):12,} "
              f"{r['planned_bytes'] / mib:5.0f} MiB {r['measured_min_bytes'] / mib:6.0f}–"
              f"{r['measured_max_bytes'] / mib:.0f} MiB {r['ratio']:9.2f}")


if __name__ == "__main__":
    main()
