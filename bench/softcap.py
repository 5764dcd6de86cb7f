"""Soft-capping's cost (issue 26) on each attention path, side by side with capping off (and ALiBi's, the other score
change that takes the same paths):

- dense: forward + backward of one attention op, q, k, v (B=1, 8 heads of 64, fp32) → y. Off: SDPA
  (`is_causal=True`, the CPU flash kernel); capped: `score_mod_attention` (scores materialised: SDPA cannot cap).
- sparse: the same through `sparse_attention` with a sliding window of 256 (on CPU the blockwise Function), cap off
  and on (its tiles cap in forward and differentiate the cap in backward).
- decode: a generated model (4 layers, d_model 256, 4 heads, dense and window-256 variants) generating 128 tokens
  greedily after a 64-token prompt through its KV cache, ms per token.

    .venv/bin/python bench/softcap.py                    # T = 1024 2048, a table
    .venv/bin/python bench/softcap.py --T 512 --json     # one JSON object

Best of `--repeats` runs (the machine is shared: load only slows a run, so the minimum is the figure and the ratios,
measured side by side in one run, are what to read).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from archspec.codegen import generate  # noqa: E402
from archspec.runtime import sparse  # noqa: E402
from archspec.runtime.scores import score_mod_attention  # noqa: E402
from archspec.spec import load_spec_dict  # noqa: E402

CAP = 50.0  # Gemma 2's attention cap
HEADS, HEAD_DIM, WINDOW = 8, 64, 256


def _best(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _slopes(n: int) -> torch.Tensor:
    return 2.0 ** (-8.0 * torch.arange(1, n + 1) / n)  # a power of two heads: ALiBi's slopes


def attention_op(T: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, T, HEAD_DIM, generator=g).requires_grad_() for _ in range(3))
    dy = torch.randn(1, HEADS, T, HEAD_DIM, generator=g)
    spec = load_spec_dict({"name": "b", "model": {"vocab_size": 64, "context_length": T, "d_model": HEADS * HEAD_DIM,
                                                  "n_layers": 1, "attention": {"n_heads": HEADS, "sparsity": {
                                                      "kind": "sliding_window", "window": WINDOW}}}})
    pattern = generate(spec, write=False).module.SLIDING_WINDOW
    alibi = _slopes(HEADS)
    runs = {
        "dense off (SDPA)": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "dense capped": lambda: score_mod_attention(q, k, v, softcap=CAP),
        "dense alibi": lambda: score_mod_attention(q, k, v, alibi=alibi),
        "sparse off": lambda: sparse.sparse_attention(q, k, v, pattern),
        "sparse capped": lambda: sparse.sparse_attention(q, k, v, pattern, softcap=CAP),
        "sparse alibi": lambda: sparse.sparse_attention(q, k, v, pattern, alibi=alibi),
    }
    return {name: round(1e3 * _best(lambda: torch.autograd.grad(run(), (q, k, v), dy), repeats), 2)
            for name, run in runs.items()}


def decode(repeats: int, new: int = 128) -> dict:
    out = {}
    for label, attention in (("dense", {}), ("window", {"sparsity": {"kind": "sliding_window", "window": WINDOW}})):
        for cap in (None, CAP):
            spec = load_spec_dict({"name": "d", "model": {"vocab_size": 320, "context_length": 256, "d_model": 256,
                                                          "n_layers": 4, "attention": {"n_heads": 4, **attention,
                                                                                       **({"softcap": cap} if cap else {})}}})
            torch.manual_seed(0)
            model = generate(spec, write=False).Model().eval()
            prompt = torch.randint(0, 320, (1, 64), generator=torch.Generator().manual_seed(1))
            t = _best(lambda: model.generate(prompt, new, temperature=0), repeats)
            out[f"decode {label} {'capped' if cap else 'off'}"] = round(1e3 * t / new, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--T", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = {"threads": torch.get_num_threads(), "torch": torch.__version__,
              "fwd_bwd_ms": {T: attention_op(T, args.repeats) for T in args.T},
              "decode_ms_per_token": decode(args.repeats)}
    if args.json:
        print(json.dumps(result))
        return
    names = list(next(iter(result["fwd_bwd_ms"].values())))
    print(f"{'forward+backward, ms':<22}" + "".join(f"{n:>18}" for n in names))
    for T, row in result["fwd_bwd_ms"].items():
        print(f"{'T = ' + str(T):<22}" + "".join(f"{row[n]:>18}" for n in names))
    for name, ms in result["decode_ms_per_token"].items():
        print(f"{name:<28}{ms:>10} ms/token")


if __name__ == "__main__":
    main()
