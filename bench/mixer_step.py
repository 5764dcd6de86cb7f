"""Training step time of token mixers side by side on the CPU (issue 43): llama-like-tiny (attention in both
layers), mixtral-like-tiny (attention, MoE) and lfm2-like-tiny (gated short convs in 3 of 4 layers, attention in 1),
plus each spec's accounting (params, train FLOPs per token) so the times can be read per FLOP.

    python bench/mixer_step.py [--steps 20] [--batch 8] [--seq 128] [--threads 2]

Each preset's generated module, built once from specs/ (seed 0), trained with AdamW on random tokens at the preset's
vocabulary: `--warmup` steps, then the median of `--steps` timed steps (forward, backward, optimizer), fp32, eager.
The presets are interleaved round by round so that a neighbour's load falls on all of them alike. Prints one row per
preset. No timing is asserted anywhere: these are figures for docs/mixers.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from archspec.accounting import account  # noqa: E402
from archspec.codegen import generate  # noqa: E402
from archspec.spec import load_spec  # noqa: E402

PRESETS = ["llama-like-tiny", "mixtral-like-tiny", "lfm2-like-tiny"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--presets", default=",".join(PRESETS))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    runs = {}
    for name in args.presets.split(","):
        spec = load_spec(ROOT / "specs" / f"{name}.yaml")
        torch.manual_seed(0)
        model = generate(spec, write=False).Model().train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1)
        idx = torch.randint(0, spec.model.vocab_size, (args.batch, args.seq + 1), generator=g)
        runs[name] = (spec, model, opt, idx, [])

    def step(model, opt, idx) -> None:
        _, loss = model(idx[:, :-1], idx[:, 1:])
        aux = getattr(model, "auxiliary_losses", None)
        if aux is not None:
            extra = aux()
            loss = loss + (sum(extra.values()) if isinstance(extra, dict) else extra)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for i in range(args.warmup + args.steps):
        for name, (spec, model, opt, idx, times) in runs.items():
            t0 = time.perf_counter()
            step(model, opt, idx)
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
    tokens = args.batch * args.seq
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch} x {args.seq} tokens, "
          f"median of {args.steps} steps after {args.warmup} warm-up")
    print(f"{'preset':<20} {'params':>9} {'train GFLOP/step':>17} {'ms/step':>9} {'tok/s':>9} {'GFLOP/s':>8}")
    for name, (spec, model, opt, idx, times) in runs.items():
        acc = account(spec, seq_len=args.seq)
        median = statistics.median(times)
        gflop = acc.flops_train * tokens / 1e9
        print(f"{name:<20} {acc.total:>9,} {gflop:>17.3f} {median * 1e3:>9.1f} {tokens / median:>9,.0f} "
              f"{gflop / median:>8.1f}")


if __name__ == "__main__":
    main()
