"""What the stability metrics (issue 34; archspec.train.metrics.StabilityProbe) cost a run, at the ablation presets.

    PYTHONPATH=. python bench/stability_overhead.py [--spec specs/llama-like-tiny.yaml] [--steps 391] [--repeats 5]

The probes run at two places: the step before each evaluation (per-layer gradient norms, a copy of the parameters,
the update's norms) and the first validation batch of each evaluation (a forward hook per block, one masked q·kᵀ per
layer). Measured here, on one Trainer with the preset's recipe (the ablation presets: 8 × 128 tokens a step,
eval_tokens 65,536, ten evaluations a run): the median time of a plain training step, of the step probes alone, and
of an evaluation with and without the forward probes, `--repeats` times each, interleaved. The overhead is the probes'
extra time per evaluation interval over that interval's plain time (steps + one evaluation), and also over the steps
alone. Data: the spec's own (the presets: the standard library's source, tokenised once into the cache).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "specs" / "llama-like-tiny.yaml"))
    ap.add_argument("--steps", type=int, default=391, help="the run's steps (the presets: 400k tokens = 391 steps)")
    ap.add_argument("--eval-points", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--set", action="append", default=[], help="spec overrides K=V")
    args = ap.parse_args()

    import torch

    from archspec.spec import load_spec
    from archspec.train.loop import Trainer

    interval = math.ceil(args.steps / args.eval_points)
    overrides = [f"train.steps={args.steps}", f"train.eval_interval={interval}", "train.compile=none",
                 "train.stability=true", *args.set]
    spec = load_spec(args.spec, overrides)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(spec, device=args.device, run_dir=Path(tmp) / "run")
        probe = trainer.stability
        for _ in range(3):  # warm-up: allocators, first-call costs
            trainer.train_step()
        trainer.evaluate()

        def sync():
            if trainer.device.type == "cuda":
                torch.cuda.synchronize()

        def timed(fn):
            """(wall seconds, CPU seconds of this process, all threads): under load from other work the CPU
            seconds move least (docs/BENCHMARKS.md)."""
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            sync()
            return time.perf_counter() - t0, time.process_time() - c0

        def plain_eval():
            saved = probe.recording
            probe.recording = contextlib.nullcontext  # the forward probes off; nothing else changes
            try:
                trainer.evaluate()
            finally:
                probe.recording = saved

        def step_probes():
            # after a backward (gradients present), what the probed step adds: norms, a parameter copy, update norms
            trainer.optimizer.zero_grad(set_to_none=True)
            trainer._forward_backward(1, True)
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            probe.before_update()
            probe.after_update()
            sync()
            probe.norms.clear()
            return time.perf_counter() - t0, time.process_time() - c0

        steps, probes, evals, evals_plain = [], [], [], []
        trainer.evaluates_at = lambda step: False  # plain steps: no probe inside them
        for _ in range(args.repeats):
            steps += [timed(trainer.train_step) for _ in range(5)]
            probes.append(step_probes())
            evals.append(timed(trainer.evaluate))
            evals_plain.append(timed(plain_eval))
        trainer.optimizer.zero_grad(set_to_none=True)

    print(f"machine: {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads), device {trainer.device}, load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"spec {spec.name} ({trainer.build.accounting.total:,} params), {spec.train.batch_size} × {spec.train.seq_len} "
          f"tokens a step, eval every {interval} steps on {trainer.eval_tokens:,} tokens; medians of {args.repeats} "
          "repeats (steps: 5 per repeat)")
    for which, column in (("wall", 0), ("CPU", 1)):
        step = statistics.median(x[column] for x in steps)
        probe_s = statistics.median(x[column] for x in probes)
        ev = statistics.median(x[column] for x in evals)
        ev_plain = statistics.median(x[column] for x in evals_plain)
        extra = probe_s + max(0.0, ev - ev_plain)
        base = interval * step + ev_plain
        print(f"{which:>4}: plain step {step * 1e3:.2f} ms · step probes {probe_s * 1e3:.2f} ms · eval "
              f"{ev_plain * 1e3:.1f} ms plain, {ev * 1e3:.1f} ms probed (+{(ev - ev_plain) * 1e3:.2f} ms) · overhead "
              f"per evaluation interval ({interval} steps + 1 eval) {100 * extra / base:.2f}% "
              f"({100 * extra / (interval * step):.2f}% of the steps alone)")


if __name__ == "__main__":
    main()
