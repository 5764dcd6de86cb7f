"""Compiled decode (`archspec sample --compile`): tokens/s of eager decode against the compiled single-token step.

    .venv/bin/python bench/decode_compile.py                  # CPU: llama-like-tiny, gpt2-tiny; none vs whole
    .venv/bin/python bench/decode_compile.py --device cuda    # + llama-like (26M), gpt2-small-like; + cudagraphs
    .venv/bin/python bench/decode_compile.py --json out.json  # also the rows as JSON

Each spec gets random weights (seed 0), one prompt of `--prompt-len` random tokens (batch 1), greedy decoding of
`--new-tokens` tokens through `archspec.runtime.stream`, with `decode=None` (eager: the model's forward each step) or a
`DecodeStep` (archspec.runtime.decode) of each mode. Per mode, `--repeats` + 1 generations in one process: the first
carries the compile (its seconds are reported: dynamo trace + inductor compile with a fresh inductor cache, i.e. cold),
the rest are timed, and the best counts (load from other work only ever slows one down). Decode tok/s counts the
tokens after the first (the first comes from the prefill, which is eager in every mode) over the time from the first
token to the last. Every mode's tokens are checked equal to eager's (fp32 on CPU; on CUDA bf16, where a compiled
kernel's rounding may in principle flip a near-tie: reported, not asserted).

cudagraphs (CUDA only): CUDA graph trees record one graph per distinct cache length (the attended length grows each
step, archspec.runtime.decode), so generation 1 warms up, generation 2 records and generation 3 on replays: the
script reports generation 2 and the best of the rest separately.
Everything is printed as it is measured, so a run cut short keeps what it did.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

# A cold inductor cache, so that the compile seconds are a new spec's on a new machine (read when torch imports).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="decode-compile-inductor-"))

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from archspec import codegen  # noqa: E402
from archspec.runtime import DecodeStep, stream  # noqa: E402
from archspec.spec import load_spec  # noqa: E402
from archspec.train.throughput import cpu_name  # noqa: E402

SPECS = {"cpu": ["llama-like-tiny", "gpt2-tiny"],
         "cuda": ["llama-like-tiny", "gpt2-tiny", "llama-like", "gpt2-small-like"]}
MODES = {"cpu": ["none", "whole"], "cuda": ["none", "whole", "cudagraphs"]}


def generation(model, idx, new_tokens: int, decode, device) -> tuple[torch.Tensor, float, float]:
    """One greedy generation: (tokens (1, new_tokens), seconds in all, seconds from the first token to the last)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    tokens, first = [], 0.0
    for token in stream(model, idx, new_tokens, temperature=0, context_length=None, decode=decode):
        tokens.append(token)
        if len(tokens) == 1:
            sync()
            first = time.perf_counter()
    sync()
    end = time.perf_counter()
    return torch.cat(tokens, dim=1), end - t0, end - first


def measure(name: str, mode: str, args, device, dtype) -> dict:
    spec = load_spec(ROOT / "specs" / f"{name}.yaml")
    torch.manual_seed(0)
    model = codegen.generate(spec, write=False).Model().to(device=device, dtype=dtype).eval()
    idx = torch.randint(0, spec.model.vocab_size, (1, args.prompt_len), generator=torch.Generator().manual_seed(0))
    idx = idx.to(device)
    decode = None if mode == "none" else DecodeStep(model, mode)
    runs = [generation(model, idx, args.new_tokens, decode, device) for _ in range(args.repeats + 1)]
    rates = [(args.new_tokens - 1) / r[2] for r in runs]
    row = {"spec": name, "mode": mode, "params": sum(p.numel() for p in model.parameters()),
           "first_generation_s": runs[0][1], "compile_s": decode.compile_s if decode else 0.0,
           "decode_tok_s": max(rates[1:]), "tokens": runs[-1][0][0].tolist()}
    if mode == "cudagraphs":  # generation 2 records, 3 on replay (see the docstring)
        row["recording_generation_tok_s"] = rates[1]
        row["decode_tok_s"] = max(rates[2:]) if len(rates) > 2 else rates[1]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--specs", nargs="+", default=None, help="spec names under specs/ (default: per device)")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3, help="timed generations after the first, per mode")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (decode's tiny ops: one is fastest)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    machine = torch.cuda.get_device_name() if device.type == "cuda" else f"{cpu_name()}, {args.threads} thread(s)"
    print(f"# {machine} · torch {torch.__version__} · {str(dtype).removeprefix('torch.')} · batch 1 · prompt "
          f"{args.prompt_len} · {args.new_tokens} new tokens, greedy · best of {args.repeats} after the first",
          flush=True)
    print(f"{'spec':<18}{'params':>12}{'mode':>12}{'decode tok/s':>14}{'× eager':>9}{'compile s':>11}"
          f"{'1st gen s':>11}  tokens", flush=True)
    rows = []
    for name in args.specs or SPECS[device.type]:
        eager = None
        for mode in MODES[device.type]:
            row = measure(name, mode, args, device, dtype)
            eager = eager or row
            row["vs_eager"] = row["decode_tok_s"] / eager["decode_tok_s"]
            row["same_tokens"] = row["tokens"] == eager["tokens"]
            rows.append(row)
            extra = (f" (recording generation {row['recording_generation_tok_s']:,.0f} tok/s)"
                     if "recording_generation_tok_s" in row else "")
            print(f"{name:<18}{row['params']:>12,}{mode:>12}{row['decode_tok_s']:>14,.0f}{row['vs_eager']:>8.2f}×"
                  f"{row['compile_s']:>11.1f}{row['first_generation_s']:>11.2f}  "
                  f"{'same as eager' if row['same_tokens'] else 'DIFFER from eager'}{extra}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
