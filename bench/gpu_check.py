"""One command for a CUDA machine: does the GPU path work, and how fast is it against peers?

    python bench/gpu_check.py            # from the repository root, with archspec and transformers installed

1. `archspec train specs/llama-like.yaml --steps 150 --device cuda` through the CLI (bf16 autocast, per-block
   compile, the registry in a temporary directory): status, final val loss, tokens/s, MFU.
2. bench/bench_train.py --size full on the GPU, bf16 autocast on both sides, the same fused AdamW:
   an 886M-class llama-like against HF LlamaForCausalLM (compiled), and gpt2-small-like (124M) against the
   nanoGPT-style reference (compiled).
Prints one table; `--json` prints the figures as one object. Exits 1 if there is no CUDA device or a step fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(cmd: list[str]) -> str:
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{out.stderr[-4000:]}")
    return out.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="training steps of llama-like through the CLI")
    parser.add_argument("--batch", type=int, default=8, help="batch size of the throughput comparison")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device here; run it on a GPU machine")
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        trained = json.loads(run([py, "-m", "archspec", "train", "specs/llama-like.yaml", "--steps", str(args.steps),
                                  "--device", "cuda", "--json", "-q", "--run-dir", f"{tmp}/run",
                                  "--registry", f"sqlite:///{tmp}/registry.db"]))
    bench = json.loads(run([py, "bench/bench_train.py", "--size", "full", "--pairs", "llama,gpt2", "--batch",
                            str(args.batch), "--seq-len", str(args.seq_len), "--skip-first-step", "--json"]))
    if args.json:
        print(json.dumps({"train": trained, "bench": bench}, indent=2))
        return

    print(f"{bench['machine']}, torch {torch.__version__}, {bench['precision']}, {bench['date']}")
    print(f"ceiling: {bench['ceiling_flops'] / 1e12:.1f} TFLOP/s ({bench['ceiling_source']}); MFU by our FLOP "
          "convention (causal (T+1)/2 keys), 6N+12LHQT beside it")
    print(f"{'what':58} {'params':>8} {'tok/s':>10} {'MFU':>6} {'6N+12LHQT':>9} {'vs peer':>8}")
    mfu_palm = trained.get("mfu_palm", float("nan"))
    print(f"{'llama-like, archspec train ' + str(args.steps) + ' steps (' + trained['status'] + ', val loss ' + format(trained.get('val_loss', float('nan')), '.3f') + ')':58} "
          f"{trained.get('params', 0) / 1e6:7.1f}M {trained['tokens_per_s']:10.0f} {100 * trained['mfu']:5.1f}% "
          f"{100 * mfu_palm:8.1f}% {'':>8}")
    for p in bench["pairs"]:
        for side, label in (("ours", f"{p['config'].split()[0]}: archspec loop"), ("peer", p["peer_name"])):
            r = p[side]
            ratio = f"{p['ratio']:.2f}x" if side == "ours" else ""
            print(f"{label:58} {p['params'] / 1e6:7.1f}M {r['tokens_per_s']:10.0f} {100 * r['mfu']:5.1f}% "
                  f"{100 * r.get('mfu_palm', float('nan')):8.1f}% {ratio:>8}")
    if trained["status"] != "FINISHED":
        raise SystemExit(1)


if __name__ == "__main__":
    main()
