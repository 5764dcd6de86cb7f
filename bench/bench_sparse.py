"""Sparse attention against dense causal SDPA: forward + backward time and peak memory of one attention op.

    .venv/bin/python bench/bench_sparse.py                          # T = 2048 … 16384, every pattern, table
    .venv/bin/python bench/bench_sparse.py --T 2048 4096 --json     # fewer lengths, one JSON object
    python bench/bench_sparse.py --device cuda --T 8192 16384 32768 65536 --heads 16 --head-dim 128 --window 1024
        # a GPU: bf16, our path (FlexAttention, compiled) vs SDPA (flash); not yet run (no GPU was lent)

Like with like: the same q, k, v (B=1, 8 heads of 64, float32, MHA so both sides run their native kernels, no K/V
copies), the same upstream gradient, q, k, v → y → backward. Dense is `F.scaled_dot_product_attention(is_causal=True)`
(PyTorch's CPU flash kernel, which skips the masked half). Each sparse pattern is the generated module's own
`sparse_attention` (on CPU: the blockwise path), taken from a spec built by archspec. Patterns: sliding_window 256,
global_local (window 256 + 4 global), block_sparse (blocks of 64, 3 back, plus the first block: ≈ the same number of
keys per query as the window).

Each (pattern, T) runs in its own process: the first forward+backward there gives the peak memory (the process's peak
RSS above its RSS just before, with the kernel's peak counter reset), then the best of `--repeats` timed runs. The
machine is shared: load from other work only ever slows a run down, so the minimum is the figure, and the ratios
(measured side by side, in the same run) are what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PATTERNS = {
    "dense": None,
    "sliding_window": ({"kind": "sliding_window", "window": 256}, "SLIDING_WINDOW"),
    "global_local": ({"kind": "global_local", "window": 256, "n_global": 4}, "GLOBAL_LOCAL"),
    "block_sparse": ({"kind": "block_sparse", "block_size": 64, "n_blocks_back": 3}, "BLOCK_SPARSE"),
}
HEADS, HEAD_DIM = 8, 64  # --heads / --head-dim change them (passed to the children through the environment)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def child(pattern: str, T: int, repeats: int) -> dict:
    """One (pattern, T) in this process: peak memory of the first fwd+bwd, then the best of `repeats`."""
    sys.path.insert(0, str(ROOT))
    import torch
    import torch.nn.functional as F

    heads, head_dim = int(os.environ["BENCH_HEADS"]), int(os.environ["BENCH_HEAD_DIM"])
    window, device = int(os.environ["BENCH_WINDOW"]), os.environ["BENCH_DEVICE"]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    if PATTERNS[pattern] is None:
        def attend(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        keys = (T + 1) / 2
    else:
        from archspec.codegen import generate
        from archspec.spec import load_spec_dict

        fields, const = PATTERNS[pattern]
        fields = {**fields, **({"window": window} if "window" in fields else {})}
        spec = load_spec_dict({"name": "bench-sparse", "model": {
            "vocab_size": 64, "context_length": T, "d_model": heads * head_dim, "n_layers": 1,
            "attention": {"n_heads": heads, "sparsity": fields}}})
        module = generate(spec, write=False).module
        pat = getattr(module, const)
        keys = float(spec.model.attention.sparsity.keys(T))

        def attend(q, k, v):
            return module.sparse_attention(q, k, v, pat)

    q, k, v = (torch.randn(1, heads, T, head_dim, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    gy = torch.randn(1, heads, T, head_dim, device=device, dtype=dtype)

    def step():
        q.grad = k.grad = v.grad = None
        attend(q, k, v).backward(gy)
        if device == "cuda":
            torch.cuda.synchronize()

    if device == "cuda":
        step()  # compiles FlexAttention and builds the block mask: not what is measured
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        peak_mib = (torch.cuda.max_memory_allocated() - before) / 2**20
    else:
        with open("/proc/self/clear_refs", "w") as fh:  # reset the peak-RSS counter
            fh.write("5")
        before = _status_kib("VmRSS")
        step()
        peak_mib = (_status_kib("VmHWM") - before) / 1024
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"pattern": pattern, "T": T, "seconds": min(times), "peak_mib": peak_mib, "keys_per_query": keys}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    ap.add_argument("--patterns", nargs="+", default=list(PATTERNS), choices=list(PATTERNS))
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per (pattern, T); dense at T ≥ 8192: 1")
    ap.add_argument("--heads", type=int, default=HEADS)
    ap.add_argument("--head-dim", type=int, default=HEAD_DIM)
    ap.add_argument("--window", type=int, default=256, help="window of sliding_window and global_local")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", nargs=3, metavar=("PATTERN", "T", "REPEATS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), int(args.child[2]))))
        return

    import torch

    started = time.time()
    rows, failed = [], []
    for T in args.T:
        for pattern in args.patterns:
            # a dense run at T ≥ 8192 takes minutes on CPU
            repeats = 1 if pattern == "dense" and T >= 8192 and args.device == "cpu" else args.repeats
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), "BENCH_HEADS": str(args.heads),
                   "BENCH_HEAD_DIM": str(args.head_dim), "BENCH_WINDOW": str(args.window), "BENCH_DEVICE": args.device}
            out = subprocess.run([sys.executable, __file__, "--child", pattern, str(T), str(repeats)],
                                 capture_output=True, text=True, env=env)
            if out.returncode:
                print(f"  {pattern} T={T} failed (rc {out.returncode}):\n{out.stderr[-3000:]}", file=sys.stderr)
                failed.append({"pattern": pattern, "T": T, "rc": out.returncode, "stderr_tail": out.stderr[-1500:]})
                continue
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"  {pattern} T={T}: {rows[-1]['seconds']:.3f} s, {rows[-1]['peak_mib']:.0f} MiB", file=sys.stderr)
    dense = {r["T"]: r for r in rows if r["pattern"] == "dense"}
    for r in rows:
        d = dense.get(r["T"])
        r["speedup_vs_dense"] = d["seconds"] / r["seconds"] if d else None
        r["memory_vs_dense"] = r["peak_mib"] / d["peak_mib"] if d and d["peak_mib"] > 0 else None
    machine = f"{os.uname().machine}, {os.cpu_count()} cores, torch {torch.__version__}, " \
              f"{torch.get_num_threads()} threads"
    if args.device == "cuda":
        machine = f"{torch.cuda.get_device_name()}, {machine}"
    meta = {"machine": machine, "load_average": os.getloadavg(), "failed": failed,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "wall_seconds": round(time.time() - started),
            "heads": args.heads, "head_dim": args.head_dim, "window": args.window, "device": args.device}
    if args.json:
        print(json.dumps({**meta, "rows": rows}))
        raise SystemExit(1 if failed else 0)
    print(f"{meta['machine']}; load average {', '.join(f'{x:.1f}' for x in meta['load_average'])}; {meta['date']}")
    print("| pattern | T | keys/query | fwd+bwd s | vs dense | peak MiB | vs dense | s per 1k tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (list(PATTERNS).index(r["pattern"]), r["T"])):
        speed = f"{r['speedup_vs_dense']:.1f}× faster" if r["speedup_vs_dense"] else ""
        mem = f"{r['memory_vs_dense']:.2f}×" if r["memory_vs_dense"] else ""
        print(f"| {r['pattern']} | {r['T']} | {r['keys_per_query']:.1f} | {r['seconds']:.3f} | {speed} | "
              f"{r['peak_mib']:.0f} | {mem} | {1000 * r['seconds'] / r['T']:.4f} |")
    for f in failed:
        print(f"- {f['pattern']} T={f['T']}: FAILED (rc {f['rc']}; its stderr is above)")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
