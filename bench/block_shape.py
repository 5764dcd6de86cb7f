"""A training step of sequential vs parallel blocks (issue 26), side by side on the CPU.

    PYTHONPATH=. python bench/block_shape.py [--d-model 256] [--layers 4] [--batch 8] [--seq 128] [--steps 20]

Builds the same model (llama-like-tiny's recipe at the given width: RMSNorm, SwiGLU at 2.75·d, RoPE, GQA 2:1) in
each block shape — sequential pre-norm, parallel with a norm per sublayer (GPT-NeoX), parallel with one shared norm
(GPT-J) — from the same seed, then times forward + backward + an AdamW step of each in turn, round-robin (A B C A B C
...), so load from other work falls on every shape alike. fp32, eager (no compile). Prints the median step time of
each and its ratio to the sequential block. The FLOPs are equal by construction (the accounting says so: printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from archspec.accounting import account
from archspec.codegen import generate
from archspec.spec import load_spec_dict

SHAPES = {"sequential": {}, "parallel": {"parallel": True}, "parallel-shared-norm": {"parallel": True,
                                                                                     "shared_norm": True}}


def build(shape: dict, args) -> tuple:
    d = args.d_model
    spec = load_spec_dict({"name": "bench-block", "model": {
        "vocab_size": 320, "context_length": args.seq, "d_model": d, "n_layers": args.layers,
        "norm": {"kind": "rmsnorm"}, "attention": {"n_heads": d // 32, "n_kv_heads": max(1, d // 64)},
        "ffn": {"kind": "glu", "activation": "silu", "hidden_dim": 11 * d // 4}, "block": shape}})
    torch.manual_seed(0)
    model = generate(spec, write=False).Model()
    return spec, model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    built = {name: build(shape, args) for name, shape in SHAPES.items()}
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 320, (args.batch, args.seq + 1), generator=g)
    x, y = idx[:, :-1], idx[:, 1:]
    times: dict[str, list[float]] = {name: [] for name in SHAPES}
    for step in range(args.warmup + args.steps):
        for name, (_, model, opt) in built.items():
            t0 = time.perf_counter()
            _, loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step >= args.warmup:
                times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["sequential"])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}; d_model "
          f"{args.d_model}, {args.layers} layers, batch {args.batch} × {args.seq}, {args.steps} timed steps each")
    print(f"{'block':<22} {'params':>10} {'train GFLOP/step':>17} {'median ms':>10} {'min ms':>8} {'/ sequential':>13}")
    for name, (spec, model, _) in built.items():
        acc = account(spec, args.seq)
        med = statistics.median(times[name])
        print(f"{name:<22} {acc.total:>10,} {acc.flops_train * args.batch * args.seq / 1e9:>17.2f} "
              f"{med * 1e3:>10.1f} {min(times[name]) * 1e3:>8.1f} {med / base:>13.3f}")


if __name__ == "__main__":
    main()
