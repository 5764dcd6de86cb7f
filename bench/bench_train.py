"""Training throughput of the shared loop against independent peers, time to first step, peak memory.

    .venv/bin/python bench/bench_train.py                       # both pairs + time to first step, tables on stdout
    .venv/bin/python bench/bench_train.py --pairs llama --json  # one pair, as one JSON object
    .venv/bin/python bench/bench_train.py --size full ...       # the presets at full size (a GPU: bench/gpu_check.py)

1. Step throughput, side by side, like with like: one training step (forward, backward, clip, AdamW) driven by
   `archspec.train.loop.Trainer.train_step` against a peer model driven by a hand-written loop. Two pairs:
   - gpt2: the generated gpt2-small-like against bench/reference_nanogpt.py (after karpathy/nanoGPT's model.py);
   - llama: the generated llama-like against HF transformers' LlamaForCausalLM (eager attention path → SDPA).
   Same config, same batches (the same sampler), the same optimizer (archspec's `build_optimizer`: fused AdamW,
   decay on ≥2-D weights) on both sides, both compiled (ours per block, as the loop does; the peer whole, as
   nanoGPT does), fp32 on CPU and bf16 autocast on CUDA on both sides. `--size cpu` shrinks both presets to 6 layers,
   d_model 384, T 256; `--size full` runs gpt2-small-like (124M) and an 886M llama-like. Each side runs in its own
   process (clean memory figures) after two warm-up steps, and the median step counts; the sides alternate
   `--repeats` times and each keeps its best process, since load from other work only ever slows one down.
   MFU is training FLOPs per token × tokens/s ÷ the ceiling: on CPU the fp32 matmul rate measured in this run (the
   fraction of this machine's measured matmul rate), on a known GPU the datasheet bf16 peak. Two FLOP conventions:
   ours (exact matmuls, causal attention at (T+1)/2 keys) and 6N + 12·L·H·Q·T (PaLM, nanoGPT).
2. Time to first step: `archspec train specs/llama-like-tiny.yaml --steps 1` in fresh processes, first with a cold
   inductor cache, then warm: build + compile + first step (the corpus is tokenised beforehand, once per machine).
3. Peak memory of a step: the process's peak RSS over the measured steps (CPU), or peak allocated bytes (CUDA).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from archspec.accounting import account  # noqa: E402
from archspec.spec import load_spec  # noqa: E402
from archspec.cache import cache_dir  # noqa: E402
from archspec.train.data import WindowSampler, prepare_tokens  # noqa: E402
from archspec.train.throughput import cpu_name, measure_matmul_flops, palm_train_flops_per_token, peak_flops  # noqa: E402


# Overrides that make each pair's spec. cpu: small enough for 2 cores; full: the gpt2-small-like preset (124M) and an
# 886M-class llama-like (d_model 2048, 16 layers, GQA 16:4 of 128, SwiGLU 6656, vocab 32000 tied: 888M parameters).
SIZES = {
    ("gpt2", "cpu"): ["model.n_layers=6", "model.d_model=384", "model.attention.n_heads=6",
                      "model.attention.n_kv_heads=6", "model.ffn.hidden_dim=1536"],
    ("gpt2", "full"): [],
    ("llama", "cpu"): ["model.n_layers=6", "model.d_model=384", "model.attention.n_heads=6",
                       "model.attention.n_kv_heads=2", "model.ffn.hidden_dim=1024"],
    ("llama", "full"): ["model.n_layers=16", "model.d_model=2048", "model.attention.n_heads=16",
                        "model.attention.n_kv_heads=4", "model.attention.head_dim=128", "model.ffn.hidden_dim=6656",
                        "model.tie_embeddings=true"],
}
PRESET = {"gpt2": "gpt2-small-like.yaml", "llama": "llama-like.yaml"}
PEER = {"gpt2": "nanoGPT reference (bench/reference_nanogpt.py)", "llama": "HF LlamaForCausalLM"}


def bench_spec(pair: str, size: str, batch: int, vocab: int, seq_len: int):
    return load_spec(ROOT / "specs" / PRESET[pair], [
        *SIZES[(pair, size)], f"model.context_length={seq_len}", f"model.vocab_size={vocab}",
        f"train.seq_len={seq_len}", f"train.batch_size={batch}", "train.steps=1000", "train.warmup_steps=10",
        "train.lr=6e-4", "train.compile=per_block",
    ])


# ── memory ───────────────────────────────────────────────────────────────────────────────────────────────────────


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: resets VmHWM (peak RSS) to the current RSS


def peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return _status_kib("VmHWM") * 1024


# ── one side of the comparison, in its own process ──────────────────────────────────────────────────────────────


def ours_step(spec, device: torch.device):
    from archspec.train.loop import Trainer

    run_dir = tempfile.mkdtemp(prefix="bench-ours-")  # holds the generated module only: no checkpoint is saved
    atexit.register(shutil.rmtree, run_dir, ignore_errors=True)
    trainer = Trainer(spec, device=device.type, run_dir=run_dir, compile=True)
    return trainer.train_step, trainer.compile_s


def peer_model(pair: str, spec):
    m = spec.model
    if pair == "gpt2":
        sys.path.insert(0, str(ROOT / "bench"))
        from reference_nanogpt import GPT, GPTConfig

        return GPT(GPTConfig(block_size=m.context_length, vocab_size=m.vocab_size, n_layer=m.n_layers,
                             n_head=m.attention.n_heads, n_embd=m.d_model, dropout=m.dropout, bias=True))
    import transformers

    a = m.attention
    config = transformers.LlamaConfig(
        vocab_size=m.vocab_size, hidden_size=m.d_model, intermediate_size=m.ffn.hidden_dim, num_hidden_layers=m.n_layers,
        num_attention_heads=a.n_heads, num_key_value_heads=a.n_kv_heads, head_dim=a.head_dim,
        max_position_embeddings=m.context_length, rms_norm_eps=m.norm.eps, tie_word_embeddings=m.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": a.positional.theta}, attention_bias=False,
        mlp_bias=False, bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="sdpa")
    hf = transformers.LlamaForCausalLM(config)

    class Wrapped(torch.nn.Module):  # (idx, targets) → (logits, loss), the loss as ours computes it
        def __init__(self):
            super().__init__()
            self.hf = hf

        def forward(self, idx, targets):
            logits = self.hf(input_ids=idx).logits
            return logits, F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    return Wrapped()


def peer_step(pair: str, spec, device: torch.device):
    """The peer's loop, by hand: forward/backward, clip, AdamW step (archspec's, so the optimizer is the same),
    zero grads; the model compiled whole."""
    from archspec.train.optim import build_optimizer

    m, t = spec.model, spec.train
    torch.manual_seed(t.seed)
    with torch.device(device):
        model = peer_model(pair, spec)
    n_ours = account(spec).total
    n_peer = sum(p.numel() for p in model.parameters())
    if n_peer != n_ours:  # like with like: the same model, parameter for parameter
        raise SystemExit(f"{pair}: peer has {n_peer:,} parameters, ours {n_ours:,}")
    optimizer = build_optimizer(model, t, device)
    _, _, store = prepare_tokens(t.data, m.vocab_size, cache_dir())
    sampler = WindowSampler(store.train, t.seq_len, t.batch_size, t.seed)  # the same batches as ours
    compiled = torch.compile(model)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)

    def step() -> None:
        x, y = (b.to(device) for b in sampler.next_batch())
        with amp:
            _, loss = compiled(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    t0 = time.perf_counter()
    step()  # compiles
    return step, time.perf_counter() - t0


def measure_side(side: str, pair: str, size: str, batch: int, vocab: int, seq_len: int, steps: int) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    spec = bench_spec(pair, size, batch, vocab, seq_len)
    step, compile_s = ours_step(spec, device) if side == "ours" else peer_step(pair, spec, device)
    step()  # a second warm-up: allocator and caches settle
    reset_peak_memory(device)
    times, cpu_times = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    tokens = batch * spec.train.seq_len
    return {"side": side, "step_s": statistics.median(times), "step_times_s": times, "tokens_per_step": tokens,
            "tokens_per_s": tokens / statistics.median(times), "compile_s": compile_s,
            # CPU seconds of all the process's threads: barely moved by other work on a shared machine
            "step_cpu_s": statistics.median(cpu_times), "peak_mem_bytes": peak_memory(device)}


def run_side(side: str, pair: str, args) -> dict:
    out = subprocess.run([sys.executable, __file__, "--side", side, "--pairs", pair, "--size", args.size,
                          "--batch", str(args.batch), "--vocab", str(vocab_of(pair, args)), "--seq-len",
                          str(args.seq_len), "--steps", str(args.steps)], capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{side} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def ceiling_flops(device: torch.device, dtype: torch.dtype) -> tuple[float, str]:
    """The datasheet peak on a known GPU, else the matmul rate measured now (not the loop's cached figure)."""
    if device.type == "cuda":
        peak, source = peak_flops(device, dtype, cache_dir())
        if source.startswith("datasheet"):
            return peak, source
    return (measure_matmul_flops(device, dtype),
            "this machine's measured matmul rate: fp32 2048×2048, best of 10, measured before and after, the higher kept")


# ── time to first step ──────────────────────────────────────────────────────────────────────────────────────────


def time_to_first_step() -> dict:
    """`archspec train specs/llama-like-tiny.yaml --steps 1` twice in fresh processes sharing a new inductor cache:
    the first compiles cold (a new machine, a new spec), the second finds the compiled block in the cache."""
    spec = load_spec(ROOT / "specs" / "llama-like-tiny.yaml")
    prepare_tokens(spec.train.data, spec.model.vocab_size, cache_dir())  # tokenise once, outside the timing
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor")}
        for name in ("cold", "warm"):
            cmd = [sys.executable, "-m", "archspec", "train", "specs/llama-like-tiny.yaml", "--steps", "1",
                   "--set", "train.warmup_steps=1", "--json", "-q", "--run-dir", str(Path(tmp) / name),
                   "--registry", f"sqlite:///{tmp}/registry.db"]
            t0 = time.perf_counter()
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, check=False)
            wall = time.perf_counter() - t0
            if out.returncode:
                raise SystemExit(f"time to first step failed:\n{out.stderr[-4000:]}")
            result = json.loads(out.stdout)
            runs[name] = {"process_wall_s": wall, "time_to_first_step_s": result["time_to_first_step_s"],
                          "compile_s": result["compile_s"]}
    return {"command": "archspec train specs/llama-like-tiny.yaml --steps 1 --set train.warmup_steps=1", **runs}


# ── report ───────────────────────────────────────────────────────────────────────────────────────────────────────


def vocab_of(pair: str, args) -> int:
    return args.vocab or {"gpt2": 50304, "llama": 32000}[pair]


def compare_pair(pair: str, args, device: torch.device, dtype: torch.dtype) -> dict:
    spec = bench_spec(pair, args.size, args.batch, vocab_of(pair, args), args.seq_len)
    acc = account(spec, seq_len=spec.train.seq_len)
    a = spec.model.attention
    palm = palm_train_flops_per_token(acc, spec.model.n_layers, a.n_heads, a.head_dim)
    runs: dict[str, list[dict]] = {"ours": [], "peer": []}
    for _ in range(args.repeats):  # alternate, so drifting load on a shared machine hits both sides alike
        for side in runs:
            runs[side].append(run_side(side, pair, args))
            r = runs[side][-1]
            print(f"{pair} {side}: {r['tokens_per_s']:.0f} tok/s, step {r['step_s']:.3f} s, CPU {r['step_cpu_s']:.3f} s",
                  file=sys.stderr, flush=True)
    sides = {side: max(rs, key=lambda r: r["tokens_per_s"]) for side, rs in runs.items()}
    return {"pair": pair, "peer_name": PEER[pair], "params": acc.total,
            "config": f"{spec.name} {spec.model.n_layers}L d{spec.model.d_model} {a.n_heads}h/{a.n_kv_heads}kv "
                      f"T{spec.train.seq_len} vocab {spec.model.vocab_size}, batch {args.batch}",
            "flops_per_token_train": acc.flops_train, "flops_per_token_palm": palm,
            "ours": sides["ours"], "peer": sides["peer"],
            "ratio": sides["ours"]["tokens_per_s"] / sides["peer"]["tokens_per_s"],
            "ratio_cpu_time": sides["peer"]["step_cpu_s"] / sides["ours"]["step_cpu_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default="gpt2,llama", help="comma-separated: gpt2 (vs nanoGPT), llama (vs HF Llama)")
    parser.add_argument("--size", choices=["cpu", "full"], default="cpu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=0, help="default: 50304 for gpt2 (GPT-2's, padded), 32000 for llama")
    parser.add_argument("--steps", type=int, default=5, help="measured steps per side")
    parser.add_argument("--repeats", type=int, default=2, help="processes per side, alternating; the best counts")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--side", choices=["ours", "peer"], help=argparse.SUPPRESS)  # internal: one side
    parser.add_argument("--skip-first-step", action="store_true", help="skip the time-to-first-step measurement")
    args = parser.parse_args()
    if args.side:
        print(json.dumps(measure_side(args.side, args.pairs, args.size, args.batch, args.vocab, args.seq_len,
                                      args.steps)))
        return

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    ceiling, source = ceiling_flops(device, dtype)
    pairs = [compare_pair(p, args, device, dtype) for p in args.pairs.split(",")]
    ceiling = max(ceiling, ceiling_flops(device, dtype)[0])
    for p in pairs:
        for side in ("ours", "peer"):
            r = p[side]
            r["mfu"] = p["flops_per_token_train"] * r["tokens_per_s"] / ceiling
            if p["flops_per_token_palm"]:
                r["mfu_palm"] = p["flops_per_token_palm"] * r["tokens_per_s"] / ceiling
    report = {
        "machine": f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
                   + (f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(sys.argv),
        "precision": "bf16 autocast" if device.type == "cuda" else "fp32",
        "ceiling_flops": ceiling, "ceiling_source": source, "pairs": pairs, "load_average": os.getloadavg(),
    }
    if not args.skip_first_step:
        report["first_step"] = time_to_first_step()
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print_report(report)


def print_report(report: dict) -> None:
    print(f"machine: {report['machine']}, {report['precision']}; {report['date']}")
    print(f"ceiling: {report['ceiling_flops'] / 1e9:.1f} GFLOP/s ({report['ceiling_source']})")
    print("MFU conventions: ours = exact matmul FLOPs, causal attention at (T+1)/2 keys, train = 3 x forward; "
          "6N+12LHQT = PaLM/nanoGPT")
    head = f"{'':44} {'params':>8} {'tok/s':>9} {'step s':>8} {'CPU s':>7} {'MFU':>6} {'6N+12LHQT':>9} {'compile':>8} {'peak mem':>9}"
    for p in report["pairs"]:
        print(f"\n{p['config']}\n{head}")
        for side, label in (("ours", "archspec loop + generated model"), ("peer", p["peer_name"] + ", same loop")):
            r = p[side]
            print(f"{label:44} {p['params'] / 1e6:7.1f}M {r['tokens_per_s']:9.0f} {r['step_s']:8.3f} "
                  f"{r['step_cpu_s']:7.3f} {100 * r['mfu']:5.1f}% {100 * r.get('mfu_palm', float('nan')):8.1f}% "
                  f"{r['compile_s']:7.1f}s {r['peak_mem_bytes'] / 2**30:6.2f} GiB")
        print(f"ratio ours/peer: {p['ratio']:.3f}x by wall time, {p['ratio_cpu_time']:.3f}x by CPU time")
    print(f"load average {report['load_average'][0]:.2f}")
    for name, f in report.get("first_step", {}).items():
        if name != "command":
            print(f"time to first step, llama-like-tiny, {name} compile cache: {f['time_to_first_step_s']:.1f} s in "
                  f"the loop (compile {f['compile_s']:.1f} s), {f['process_wall_s']:.1f} s for the whole process")


if __name__ == "__main__":
    main()
