"""Linear-time token mixers against dense attention on the CPU, side by side in one run (issue 45): forward +
backward time of one layer at long sequence lengths, and decoding tokens/s at a short and a long context.

    python bench/linear_mixers.py [--lengths 2048,8192,16384] [--contexts 256,8192] [--width 256] [--threads 2]

Each mixer is a one-layer model of the same width built through the spec → generated module path (no FFN:
`ffn: {kind: none}`, so the layer is the mixer alone, its norm, the embedding and a small head), fp32, eager:
- train: `model(idx, targets)` then `loss.backward()` on one sequence of T tokens; the median of `--repeats` runs
  after one warm-up at the smallest T; mixers interleaved run by run so a neighbour's load falls on all alike;
- decode: a prefill of `context` tokens through the model's cache, then `--steps` single-token steps timed (tokens/s).
Also printed: each model's forward FLOPs per token at T (the accounting's; Mamba-2's are its chunked algorithm's)
and where the mixers' train times cross the attention's. No timing is asserted anywhere: figures for
docs/linear-mixers-mamba.md.

A mixer is one entry of MIXERS: a name → the `model:` fields that choose it (another linear mixer is one line).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from archspec.accounting import account  # noqa: E402
from archspec.codegen import generate  # noqa: E402
from archspec.spec import load_spec_dict  # noqa: E402

# name → the model fields choosing the layer's token mixer; width-dependent sizes are filled from --width below
MIXERS = {
    "attention (SDPA)": lambda d: {"attention": {"n_heads": d // 64, "n_kv_heads": d // 64, "head_dim": 64}},
    "mamba2": lambda d: {"mixer": {"kind": "mamba2", "expand": 2, "head_dim": 64, "d_state": 64, "chunk_size": 256}},
}


def build(name: str, width: int, context: int, vocab: int):
    model = {"vocab_size": vocab, "context_length": context, "d_model": width, "n_layers": 1,
             "ffn": {"kind": "none"}, **MIXERS[name](width)}
    spec = load_spec_dict({"name": "bench-" + "".join(c for c in name.split()[0].lower() if c.isalnum()),
                           "model": model})
    torch.manual_seed(0)
    return spec, generate(spec, write=False).Model()


def train_seconds(model, T: int, vocab: int) -> float:
    idx = torch.randint(0, vocab, (1, T + 1), generator=torch.Generator().manual_seed(T))
    t0 = time.perf_counter()
    _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    seconds = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    return seconds


@torch.no_grad()
def decode_tokens_per_s(model, context: int, steps: int, vocab: int) -> float:
    model.eval()
    idx = torch.randint(0, vocab, (1, context + steps), generator=torch.Generator().manual_seed(context))
    cache = model.new_cache(1, context + steps)
    model(idx[:, :context], cache=cache)  # the prefill: fills the KV cache, or carries the state to `context`
    t0 = time.perf_counter()
    for t in range(context, context + steps):
        model(idx[:, t : t + 1], cache=cache)
    seconds = time.perf_counter() - t0
    model.train()
    return steps / seconds


def crossing(lengths: list[int], ours: list[float], attention: list[float]) -> str:
    """Where `ours` stops being slower than attention (linear interpolation of the ratio in log T), in words."""
    ratio = [o / a for o, a in zip(ours, attention)]
    if all(r <= 1 for r in ratio):
        return f"faster than attention already at T={lengths[0]}"
    if all(r > 1 for r in ratio):
        return f"slower than attention up to T={lengths[-1]} (ratio {ratio[-1]:.2f} there)"
    for (t0, r0), (t1, r1) in zip(zip(lengths, ratio), zip(lengths[1:], ratio[1:])):
        if r0 > 1 >= r1:
            import math

            f = (math.log(r0)) / (math.log(r0) - math.log(r1)) if r0 != r1 else 0
            return f"crosses attention near T≈{round(t0 * (t1 / t0) ** f)} (between {t0} and {t1})"
    return "no single crossing"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="2048,8192,16384")
    ap.add_argument("--contexts", default="256,8192")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=32, help="decoding steps timed at each context")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mixers", default=",".join(MIXERS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lengths = [int(x) for x in args.lengths.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    names = args.mixers.split(",")
    context = max(lengths + [c + args.steps for c in contexts])
    built = {n: build(n, args.width, context, args.vocab) for n in names}

    for n in names:  # one warm-up each (allocator, first-call costs)
        train_seconds(built[n][1], lengths[0], args.vocab)
    times: dict[str, dict[int, list[float]]] = {n: {T: [] for T in lengths} for n in names}
    for T in lengths:
        for _ in range(args.repeats):
            for n in names:  # interleaved
                times[n][T].append(train_seconds(built[n][1], T, args.vocab))
    decode = {n: {c: decode_tokens_per_s(built[n][1], c, args.steps, args.vocab) for c in contexts} for n in names}

    rows = []
    for n in names:
        spec = built[n][0]
        rows.append({
            "mixer": n, "params": account(spec).total,
            "train_s": {T: statistics.median(times[n][T]) for T in lengths},
            "fwd_flops_per_token": {T: account(spec, seq_len=T).flops_forward for T in lengths},
            "decode_tok_s": decode[n],
        })
    attention = next((r for r in rows if r["mixer"].startswith("attention")), None)
    for r in rows:
        if attention is not None and r is not attention:
            r["vs_attention"] = crossing(lengths, [r["train_s"][T] for T in lengths],
                                         [attention["train_s"][T] for T in lengths])
    if args.json:
        print(json.dumps({"width": args.width, "threads": args.threads, "torch": torch.__version__, "rows": rows}))
        return
    print(f"one layer, width {args.width}, no FFN; fp32 CPU, {args.threads} threads, torch {torch.__version__}; "
          f"train = forward + backward of one sequence (median of {args.repeats}); decode = {args.steps} steps")
    head = " | ".join([f"train T={T} (s)" for T in lengths] + [f"fwd MFLOP/tok T={T}" for T in lengths]
                      + [f"decode tok/s @{c}" for c in contexts])
    print(f"| mixer | params | {head} |")
    print("|---|---:|" + "---:|" * (2 * len(lengths) + len(contexts)))
    for r in rows:
        cells = ([f"{r['train_s'][T]:.2f}" for T in lengths]
                 + [f"{r['fwd_flops_per_token'][T] / 1e6:.2f}" for T in lengths]
                 + [f"{r['decode_tok_s'][c]:.1f}" for c in contexts])
        print(f"| {r['mixer']} | {r['params']:,} | " + " | ".join(cells) + " |")
    for r in rows:
        if "vs_attention" in r:
            print(f"{r['mixer']}: {r['vs_attention']}")


if __name__ == "__main__":
    main()
