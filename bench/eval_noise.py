"""How large must the validation set be? Evaluation noise against seed noise at an ablation preset's size.

    PYTHONPATH=. python bench/eval_noise.py                              # llama-like-tiny, 400k tokens, seeds 0,1,2
    PYTHONPATH=. python bench/eval_noise.py --seeds 0,1 --tokens 100000 --json
    PYTHONPATH=. python bench/eval_noise.py --runs runs/sparsity-v0-*        # trained runs' checkpoints, no training

Trains the spec once per seed (the presets' budget, no compile, nothing recorded), then computes the loss of every
validation window of the split (the whole split: the largest evaluation possible). Two spreads come out:

- seed noise: the std over seeds of the whole-split val loss (what an ablation's interval is made of);
- evaluation noise at a size of T tokens: the std of the mean loss over disjoint subsets of T tokens' worth of
  windows, each spread over the split the way `train.eval_tokens` picks them (interleaved: subset k holds windows
  k, k + K, k + 2K, ...), averaged over the seeds' models. This is the error a T-token validation set adds to one
  run's val loss.

The default `train.eval_tokens` is chosen from this table (docs/ABLATIONS.md says which size and why).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
SIZES = [4_096, 8_192, 16_384, 32_768, 65_536]


def window_losses(model, tokens, seq_len: int, batch: int = 64) -> np.ndarray:
    """Mean next-token loss of every validation window of the split, in order."""
    from archspec.train.data import _gather, window_count

    n = window_count(len(tokens), seq_len)
    out = []
    model = model.eval()
    with torch.no_grad():
        for start in range(0, n, batch):
            idx = np.arange(start, min(n, start + batch))
            x, y = _gather(tokens, idx, seq_len)
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
            out.append(loss.view(len(idx), -1).mean(1).numpy())
    return np.concatenate(out)


def subset_std(losses: np.ndarray, windows: int) -> tuple[float, int]:
    """Std of the mean over K disjoint interleaved subsets of `windows` windows each (K = n // windows)."""
    k = len(losses) // windows
    means = [losses[i::k][:windows].mean() for i in range(k)]
    return (statistics.stdev(means) if k > 1 else float("nan")), k


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", default=str(ROOT / "specs" / "llama-like-tiny.yaml"))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--tokens", type=int, default=400_000, help="training budget per seed (the presets')")
    parser.add_argument("--runs", nargs="+", help="run directories (checkpoint.pt inside) of one spec at several seeds: "
                        "evaluate them instead of training")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)  # a shared machine: one thread does not fight the others' for cores

    from archspec.ablate.sweep import Budget, steps_for_budget
    from archspec.spec import load_spec
    from archspec.train.logger import NullLogger
    from archspec.train.loop import Trainer, with_steps

    per_seed, t0 = [], time.perf_counter()
    if args.runs:
        from archspec.codegen import generate
        from archspec.spec import parse_spec
        from archspec.cache import cache_dir
        from archspec.train.checkpoint import load_checkpoint
        from archspec.train.data import build_data

        for run in args.runs:
            state = load_checkpoint(Path(run) / "checkpoint.pt")
            spec = parse_spec(state["spec"])
            model = generate(spec, write=False).Model()
            model.load_state_dict(state["model"])
            losses = window_losses(model, build_data(spec, cache_dir(None)).store.val, spec.train.seq_len)
            per_seed.append(losses)
            print(f"{run} (seed {spec.train.seed}, step {state['step']}): whole-split val loss {losses.mean():.4f} "
                  f"over {len(losses)} windows", file=sys.stderr)
        args.spec, args.tokens, args.seeds = ", ".join(args.runs), None, "of the runs"
    else:
        spec = load_spec(args.spec)
        spec = with_steps(spec, steps_for_budget(spec, Budget(tokens=args.tokens)))
        for seed in (int(s) for s in args.seeds.split(",")):
            s = spec.model_copy(deep=True)
            s.train.seed = seed
            with tempfile.TemporaryDirectory() as tmp:
                trainer = Trainer(s, device="cpu", logger=NullLogger(), run_dir=tmp, compile=False)
                trainer.run()
                losses = window_losses(trainer.model, trainer.data.store.val, s.train.seq_len)
            per_seed.append(losses)
            print(f"seed {seed}: whole-split val loss {losses.mean():.4f} over {len(losses)} windows "
                  f"({len(losses) * s.train.seq_len:,} target tokens)", file=sys.stderr)
    seq_len = spec.train.seq_len
    whole = [float(x.mean()) for x in per_seed]
    result = {"spec": args.spec, "train_tokens": args.tokens, "steps": spec.train.steps, "seq_len": seq_len,
              "val_windows": int(len(per_seed[0])), "whole_split_val_loss": whole,
              "seed_std": statistics.stdev(whole) if len(whole) > 1 else None, "eval_std": {},
              "seconds": round(time.perf_counter() - t0, 1)}
    for size in SIZES:
        windows = math.ceil(size / seq_len)
        if len(per_seed[0]) // windows < 2:
            continue
        stds = [subset_std(x, windows) for x in per_seed]
        result["eval_std"][size] = {"std": statistics.fmean(s for s, _ in stds), "subsets": stds[0][1]}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{args.spec}: {spec.train.steps} steps × {spec.train.batch_size}×{seq_len}, seeds {args.seeds}, "
          f"{result['seconds']} s")
    seed_std = result["seed_std"]
    print(f"seed noise (std over seeds of the whole-split val loss): {seed_std:.4f}" if seed_std else "one seed")
    print(f"{'eval tokens':>12} {'subsets':>8} {'eval std':>9} {'eval/seed':>10}")
    for size, row in result["eval_std"].items():
        ratio = f"{row['std'] / seed_std:.2f}" if seed_std else "-"
        print(f"{size:>12,} {row['subsets']:>8} {row['std']:>9.4f} {ratio:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
