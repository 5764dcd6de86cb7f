"""Pipeline bubble on CPU (issue 30): each process's idle share of a training step under each schedule, against the
schedule's theory, (pp - 1) / (m + pp - 1) for GPipe and 1F1B.

    .venv/bin/python bench/pipeline_bubble.py [--stages 2 4] [--microbatches 4 8] [--steps 6] [--json OUT]

Each layout is one torchrun job of pp processes (OMP_NUM_THREADS=1) training llama-like-tiny's shape at 8 layers
(d_model 128, batch 16 × 128 tokens) through the shared loop. A process's busy time in a step is its CPU time (its
one thread computing: forward and backward of its stages); its idle share is 1 − busy / wall. The measured bubble is
the mean idle share over the pipeline's processes, over the steps after the first two. On a machine with fewer cores
than processes the processes also wait for a core: that wait is idle too, so the figure at pp above the core count
mixes the bubble with the oversubscription (said beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_memory import corpus_dir  # noqa: E402  (the benches' small fixed corpus)

WORKER = textwrap.dedent("""
    import json, os, sys, time
    import torch
    from archspec.spec import load_spec_dict
    from archspec.train.loop import Trainer
    torch.set_num_threads(1)
    spec = load_spec_dict(json.load(open(sys.argv[1])))
    t = Trainer(spec, device="cpu", cache=sys.argv[2], run_dir=sys.argv[3] + "/run" + os.environ["RANK"])
    rows = []
    for step in range(int(sys.argv[4])):
        torch.distributed.barrier()
        w0, c0 = time.perf_counter(), time.process_time()
        t.train_step()
        rows.append((time.perf_counter() - w0, time.process_time() - c0))
    out = [None] * t.world.size
    torch.distributed.all_gather_object(out, rows)
    if t.world.is_main:
        json.dump(out, open(sys.argv[3] + "/rows.json", "w"))
    os._exit(0)
""")


def spec(pp: int, schedule: str, m: int, corpus: str) -> dict:
    return {"name": "bubble", "model": {"vocab_size": 320, "context_length": 128, "d_model": 128, "n_layers": 8,
                                        "attention": {"n_heads": 4, "n_kv_heads": 2},
                                        "ffn": {"kind": "glu", "hidden_dim": 344}},
            "train": {"seed": 0, "steps": 100, "batch_size": 16, "seq_len": 128, "compile": "none",
                      "eval_interval": 100, "data": {"corpus": {"kind": "files", "paths": [corpus]}},
                      "parallel": {"kind": "ddp", "pp": pp, "schedule": schedule, "microbatches": m}}}


def measure(pp: int, schedule: str, m: int, steps: int, corpus: str, cache: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "spec.json").write_text(json.dumps(spec(pp, schedule, m, corpus)))
        Path(tmp, "worker.py").write_text(WORKER)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(pp),
                        f"{tmp}/worker.py", f"{tmp}/spec.json", cache, tmp, str(steps)], check=True, env=env,
                       capture_output=True, text=True)
        rows = json.loads(Path(tmp, "rows.json").read_text())
    idle = [1 - sum(c for _, c in r[2:]) / sum(w for w, _ in r[2:]) for r in rows]
    wall = sum(w for w, _ in rows[0][2:]) / len(rows[0][2:])
    theory = (pp - 1) / (m + pp - 1) if schedule != "interleaved_1f1b" else (pp - 1) / (2 * m + pp - 1)
    return {"pp": pp, "schedule": schedule, "microbatches": m, "step_s": wall, "idle_per_process": idle,
            "bubble": sum(idle) / len(idle), "theory": theory, "oversubscribed": pp > (os.cpu_count() or 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--microbatches", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--corpus", default=None, help="a directory of text files [default: the benches' corpus]")
    ap.add_argument("--json")
    args = ap.parse_args()
    cache = tempfile.mkdtemp(prefix="bubble-cache-")
    args.corpus = args.corpus or str(corpus_dir())
    results = []
    print(f"{'pp':>3} {'schedule':<17} {'m':>3} {'step s':>8} {'bubble':>8} {'theory':>8}  idle per process")
    for pp in args.stages:
        for schedule in args.schedules:
            for m in args.microbatches:
                if schedule != "gpipe" and m < pp:
                    print(f"{pp:>3} {schedule:<17} {m:>3}  (skipped: {schedule} needs at least pp micro-batches)")
                    continue
                r = measure(pp, schedule, m, args.steps, args.corpus, cache)
                results.append(r)
                note = "  (more processes than cores)" if r["oversubscribed"] else ""
                print(f"{pp:>3} {schedule:<17} {m:>3} {r['step_s']:>8.3f} {r['bubble']:>8.1%} {r['theory']:>8.1%}  "
                      + " ".join(f"{x:.0%}" for x in r["idle_per_process"]) + note, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
