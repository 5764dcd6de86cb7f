"""Gated DeltaNet against dense attention on the CPU (issue 45): one layer's forward + backward at long sequences,
and decode tokens/s at a short and a long context, side by side in one run.

    python bench/gdn_scaling.py [--lengths 2048,8192,16384] [--d-model 256] [--heads 4] [--contexts 256,8192]

Both layers are the generated modules of a one-layer spec of width `--d-model` (archspec's codegen, seed 0): a
`gated_deltanet` mixer (`--heads` value heads = q/k heads, head dims d/heads, conv 4, chunk `--chunk`) and a dense
GQA attention of as many heads with no positional encoding (SDPA; positions would add the same elementwise work to
both). Forward + backward of the mixer alone on (1, T, d) random inputs, fp32, eager, min of `--repeats` after one
warm-up (the shared machine's load inflates every figure; the minimum is the least disturbed). The lengths are
interleaved so a neighbour's load falls on both alike. Decode: a prefill of `context` positions, then `--steps`
one-position steps through the layer's cache (the attention's KV cache, the GDN's fixed state), tokens/s of the steps.
Each row also gives the accounting's forward FLOPs per token at that length. No timing is asserted anywhere: these are
figures for docs/linear-mixers-gdn.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from archspec.codegen import generate  # noqa: E402
from archspec.spec import load_spec_dict  # noqa: E402


def layers(d: int, heads: int, chunk: int, context: int):
    base = {"vocab_size": 64, "context_length": context, "d_model": d, "n_layers": 1}
    gdn = {**base, "mixer": {"kind": "gated_deltanet", "n_heads": heads, "n_k_heads": heads, "chunk_size": chunk}}
    att = {**base, "attention": {"n_heads": heads, "positional": {"kind": "none"}}}
    out = {}
    for name, model in (("gated_deltanet", gdn), ("attention (SDPA)", att)):
        spec = load_spec_dict({"name": name.split()[0], "model": model})
        torch.manual_seed(0)
        block = generate(spec, write=False).Model().blocks[0]
        out[name] = (spec, getattr(block, type(spec.model.blocks()[0].token_mixer).attribute))
    return out


def fwd_bwd(layer, x) -> float:
    t0 = time.perf_counter()
    layer(x).sum().backward()
    return time.perf_counter() - t0


def decode(layer, d: int, context: int, steps: int) -> float:
    with torch.no_grad():
        cache = layer.new_cache(1, context + steps + 8, dtype=torch.float32)
        layer(torch.randn(1, context, d), cache=cache)
        xs = torch.randn(steps, 1, 1, d)
        for x in xs[:8]:  # warm-up: oneDNN builds its kernels for the new shapes on the first calls
            layer(x, cache=cache)
        t0 = time.perf_counter()
        for x in xs:
            layer(x, cache=cache)
        return steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="2048,8192,16384")
    ap.add_argument("--contexts", default="256,8192")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lengths = [int(t) for t in args.lengths.split(",")]
    contexts = [int(t) for t in args.contexts.split(",")]
    d = args.d_model
    mixers = layers(d, args.heads, args.chunk, max(lengths + contexts) + args.steps + 8)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, d_model {d}, {args.heads} heads, "
          f"chunk {args.chunk}; one layer, batch 1, fp32, min of {args.repeats} after a warm-up")
    times: dict[tuple[str, int], float] = {}
    for T in lengths:
        x = torch.randn(1, T, d, requires_grad=True)
        for name, (_, layer) in mixers.items():
            fwd_bwd(layer, x[:, : min(T, 512)])  # warm-up
            times[name, T] = min(fwd_bwd(layer, x) for _ in range(args.repeats))
    print(f"{'mixer':<18} {'T':>6} {'fwd+bwd s':>10} {'ms/1k tok':>10} {'fwd GFLOP':>10}")
    for name, (spec, _) in mixers.items():
        unit = spec.model.blocks()[0].token_mixer
        for T in lengths:
            gflop = sum(unit.mixer_flops(spec.model, T, full_attention=False).values()) * T / 1e9
            print(f"{name:<18} {T:>6} {times[name, T]:>10.3f} {1e3 * times[name, T] / (T / 1000):>10.1f} "
                  f"{gflop:>10.2f}")
    print(f"\ndecode, {args.steps} one-position steps after a prefill of `context`")
    print(f"{'mixer':<18} {'context':>8} {'tok/s':>9} {'state bytes':>12}")
    for name, (spec, layer) in mixers.items():
        unit = spec.model.blocks()[0].token_mixer
        for context in contexts:
            rate = decode(layer, d, context, args.steps)
            state = unit.state_bytes_per_sequence(spec.model, context + args.steps, 4)
            print(f"{name:<18} {context:>8} {rate:>9,.0f} {state:>12,}")


if __name__ == "__main__":
    main()
