"""One command for a CUDA machine: do the MoE and sparse-attention CUDA paths work, and how fast are they?

    python bench/gpu_moe_sparse.py --out DIR      # from the repository root; archspec importable (PYTHONPATH=.)

Stages, each in its own process with its own time limit, each writing DIR/<stage>.json (or .log) as it ends, so a
stage that fails or runs out of time costs only itself:
1. `check`: the CUDA paths against the paths CPU tests pin down. Sparse: each pattern's `sparse_attention` on CUDA
   (FlexAttention, compiled) against a dense masked reference (SDPA with the pattern's T×T mask), fp32, forward and
   q/k/v gradients, T not a multiple of any block, GQA. MoE: the generated FFN under bf16 autocast (grouped_mm)
   against the same module forced onto its padded path, forward and gradients.
2. `sparse`: bench/bench_sparse.py --device cuda (bf16; ours = FlexAttention vs SDPA flash), window 1024, 16 heads
   of 128, T = 8k–64k (the issue's GPU comparison), then global_local and block_sparse at 32k.
3. `moe`: bench/bench_moe.py --device cuda --size gpu (bf16 autocast, eager): MoE vs dense-active vs HF Mixtral's
   experts implementations and HF dense.
4. `train`: `archspec train` through the CLI on the GPU, 40 steps each of mixtral-like-tiny and mistral-like-tiny
   (per-block compile, bf16): status and final loss.
5. `moe_compiled`: bench_moe.py --compile --device cuda --size gpu: MoE vs dense, both compiled per block.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def check(dev: str) -> dict:
    sys.path.insert(0, str(ROOT))
    import torch
    import torch.nn.functional as F

    from archspec.codegen import generate
    from archspec.runtime import sparse as runtime_sparse
    from archspec.spec import load_spec_dict

    out: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if dev == "cuda" else dev}
    patterns = {"sliding_window": ({"kind": "sliding_window", "window": 100}, "SLIDING_WINDOW"),
                "global_local": ({"kind": "global_local", "window": 64, "n_global": 5}, "GLOBAL_LOCAL"),
                "block_sparse": ({"kind": "block_sparse", "block_size": 48, "n_blocks_back": 2}, "BLOCK_SPARSE")}
    T = 333
    for name, (fields, const) in patterns.items():
        spec = load_spec_dict({"name": f"gpu-{name}", "model": {
            "vocab_size": 64, "context_length": 512, "d_model": 256, "n_layers": 1,
            "attention": {"n_heads": 4, "n_kv_heads": 2, "sparsity": fields}}})
        module = generate(spec, write=False).module
        pat = getattr(module, const)
        g = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(2, 4, T, 64, device=dev, generator=g, requires_grad=True)
        k, v = (torch.randn(2, 2, T, 64, device=dev, generator=g, requires_grad=True) for _ in range(2))
        gy = torch.randn(2, 4, T, 64, device=dev, generator=g)
        got = module.sparse_attention(q, k, v, pat)
        got_grads = torch.autograd.grad(got, (q, k, v), gy)
        i = torch.arange(T, device=dev)
        mask = pat.mask_mod(None, None, i[:, None], i[None, :])
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        want_grads = torch.autograd.grad(want, (q, k, v), gy)
        out[f"sparse.{name}"] = {
            "path": "flex" if dev == "cuda" and runtime_sparse.flex_attention is not None else "blockwise",
            "max_abs_err": float((got - want).abs().max()),
            "max_abs_grad_err": max(float((a - b).abs().max()) for a, b in zip(got_grads, want_grads))}

    for hidden, label in ((256, "grouped"), (196, "padded (hidden not a multiple of 8)")):
        spec = load_spec_dict({"name": "gpu-moe", "model": {
            "vocab_size": 64, "context_length": 256, "d_model": 256, "n_layers": 1,
            "ffn": {"kind": "moe", "n_experts": 8, "top_k": 2, "expert": {"kind": "glu", "hidden_dim": hidden}}}})
        module = generate(spec, write=False).module
        torch.manual_seed(0)
        ffn = module.FeedForward().to(dev)
        ffn.reset_parameters()
        x = torch.randn(4, 256, 256, device=dev, requires_grad=True)
        params = [x, *ffn.parameters()]
        results = []
        for force_padded in (False, True):
            if force_padded:
                module.grouped_mm_usable = lambda device, dtype: False
            with torch.autocast("cuda", torch.bfloat16, enabled=dev == "cuda"):
                y = ffn(x)
            grads = torch.autograd.grad(y.float().square().sum(), params)
            results.append((y.float(), grads, float(ffn.router_stats[-1])))
        (y0, g0, pad0), (y1, g1, pad1) = results
        rel = lambda a, b: float((a - b).norm() / b.norm().clamp_min(1e-30))  # noqa: E731
        out[f"moe.{label}"] = {"padding_default_path": pad0, "padding_forced_padded": pad1,
                               "rel_err_forward": rel(y0, y1),
                               "rel_err_grads_max": max(rel(a.float(), b.float()) for a, b in zip(g0, g1))}
    return out


DEADLINE = [float("inf")]


def run_stage(cmd: list[str], limit: float, log: Path) -> tuple[int, str]:
    t0 = time.time()
    limit = min(limit, DEADLINE[0] - t0)
    if limit < 20:
        print(f"skipped (out of time): {' '.join(cmd[1:4])}", flush=True)
        return 125, ""
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=limit)
        rc, stdout, stderr = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, stdout = 124, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    log.write_text(f"$ {' '.join(cmd)}\nrc={rc} in {time.time() - t0:.0f} s\n--- stderr (tail)\n{stderr[-6000:]}\n")
    print(f"[{time.time() - t0:5.0f} s] rc={rc} {' '.join(cmd[1:4])}", flush=True)
    return rc, stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--stages", nargs="+", default=["check", "sparse", "moe", "train", "moe_compiled"])
    ap.add_argument("--budget", type=float, default=520, help="seconds for all stages; stages past it are skipped")
    ap.add_argument("--smoke", action="store_true", help="the plumbing on CPU at toy sizes (no figures)")
    ap.add_argument("--stage-check", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    dev = "cpu" if args.smoke else "cuda"
    if args.stage_check:
        print(json.dumps(check(dev)))
        return 0
    DEADLINE[0] = time.time() + args.budget
    args.out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    summary: dict = {}

    def save(name: str, rc: int, stdout: str) -> None:
        try:
            summary[name] = json.loads(stdout) if stdout.strip() else {"rc": rc}
        except json.JSONDecodeError:
            summary[name] = {"rc": rc, "stdout_tail": stdout[-3000:]}
        summary[name + ".rc"] = rc
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))

    for stage in args.stages:
        if stage == "check":
            save(stage, *run_stage([py, __file__, "--out", str(args.out), "--stage-check"]
                                   + (["--smoke"] if args.smoke else []), 100, args.out / "check.log"))
        elif stage == "sparse":
            big = ["8192", "16384", "32768", "65536"] if not args.smoke else ["1024"]
            for name, extra, limit in (
                    ("sparse", ["--T", *big, "--patterns", "dense", "sliding_window"], 160),
                    ("sparse_other", ["--T", big[-2 if not args.smoke else -1], "--patterns", "global_local",
                                      "block_sparse"], 60)):
                save(name, *run_stage([py, "bench/bench_sparse.py", "--device", dev, "--heads", "16",
                                       "--head-dim", "128", "--window", "1024" if not args.smoke else "128",
                                       "--repeats", "5" if not args.smoke else "1", "--json", *extra],
                                      limit, args.out / f"{name}.log"))
        elif stage == "moe":
            save(stage, *run_stage([py, "bench/bench_moe.py", "--device", dev, "--size", "gpu" if not args.smoke
                                    else "cpu", "--rounds", "3" if not args.smoke else "1", "--steps", "3" if not
                                    args.smoke else "1", "--json"] + (["--skip-hf"] if args.smoke else []), 120,
                                   args.out / "moe.log"))
        elif stage == "moe_compiled":
            save(stage, *run_stage([py, "bench/bench_moe.py", "--device", dev, "--size", "gpu" if not args.smoke
                                    else "cpu", "--compile", "--skip-hf", "--rounds", "3", "--steps", "3", "--json"],
                                   100, args.out / "moe_compiled.log"))
        elif stage == "train":
            with tempfile.TemporaryDirectory() as tmp:
                for spec in ("mixtral-like-tiny", "mistral-like-tiny"):
                    save(f"train.{spec}", *run_stage(
                        [py, "-m", "archspec", "train", f"specs/{spec}.yaml", "--steps",
                         "40" if not args.smoke else "3", "--device", dev, "--json", "-q", "--run-dir",
                         f"{tmp}/{spec}", "--registry", f"sqlite:///{tmp}/registry.db"], 60,
                        args.out / f"train.{spec}.log"))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
