"""Training throughput of the shared loop against a hand-written nanoGPT loop, time to first step, peak memory.

    .venv/bin/python bench/bench_train.py                   # all three measurements, a table on stdout
    .venv/bin/python bench/bench_train.py --json            # the same as one JSON object

1. Step throughput: one training step (forward, backward, clip, AdamW) of the generated gpt2-small-like model shrunk
   to CPU size (6 layers, d_model 384, 6 heads, T 256), driven by `archspec.train.loop.Trainer.train_step`, against
   bench/reference_nanogpt.py driven by a hand-written nanoGPT loop: same config, same batches, same optimizer
   settings, both compiled (ours per block, as the loop does; the reference whole, as nanoGPT does). Each side runs in
   its own process (clean memory figures) after two warm-up steps, and the median step counts; the sides alternate
   `--repeats` times and each keeps its best process, since load from other work only ever slows one down.
   MFU is the accounting's training FLOPs per token × tokens/s ÷ the measured fp32 matmul rate (the CPU "ceiling").
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from archspec.accounting import account  # noqa: E402
from archspec.spec import load_spec  # noqa: E402
from archspec.train.cache import cache_dir  # noqa: E402
from archspec.train.data import WindowSampler, prepare_tokens  # noqa: E402
from archspec.train.throughput import cpu_name, measure_matmul_flops, peak_flops  # noqa: E402


def cpu_spec(batch: int, vocab: int):
    """gpt2-small-like at CPU size: 6 layers, d_model 384, 6 heads of 64, T 256, MLP 4·d."""
    return load_spec(ROOT / "specs" / "gpt2-small-like.yaml", [
        "model.n_layers=6", "model.d_model=384", "model.attention.n_heads=6", "model.attention.n_kv_heads=6",
        "model.context_length=256",
        "model.ffn.hidden_dim=1536", f"model.vocab_size={vocab}", "train.seq_len=256", f"train.batch_size={batch}",
        "train.steps=1000", "train.warmup_steps=10", "train.lr=6e-4", "train.compile=true",
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


def reference_step(spec, device: torch.device):
    """nanoGPT's loop, by hand: micro-batch forward/backward, clip, AdamW step, zero grads."""
    sys.path.insert(0, str(ROOT / "bench"))
    from reference_nanogpt import GPT, GPTConfig

    m, t = spec.model, spec.train
    torch.manual_seed(t.seed)
    with torch.device(device):
        model = GPT(GPTConfig(block_size=m.context_length, vocab_size=m.vocab_size, n_layer=m.n_layers,
                              n_head=m.attention.n_heads, n_embd=m.d_model, dropout=m.dropout, bias=True))
    optimizer = model.configure_optimizer(t.weight_decay, t.lr, (t.beta1, t.beta2), device.type)
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


def measure_side(side: str, batch: int, vocab: int, steps: int) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    spec = cpu_spec(batch, vocab)
    step, compile_s = (ours_step if side == "ours" else reference_step)(spec, device)
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


def run_side(side: str, args) -> dict:
    out = subprocess.run([sys.executable, __file__, "--side", side, "--batch", str(args.batch), "--vocab",
                          str(args.vocab), "--steps", str(args.steps)], capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{side} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def ceiling_flops(device: torch.device, dtype: torch.dtype) -> tuple[float, str]:
    """The datasheet peak on a known GPU, else the matmul rate measured now (not the loop's cached figure)."""
    if device.type == "cuda":
        peak, source = peak_flops(device, dtype, cache_dir())
        if source.startswith("datasheet"):
            return peak, source
    return measure_matmul_flops(device, dtype), "fp32 2048×2048 matmul, best of 10, measured before and after"


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
            cmd = [sys.executable, "-m", "archspec.cli", "train", "specs/llama-like-tiny.yaml", "--steps", "1",
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=50304, help="gpt2-small-like's padded GPT-2 vocabulary")
    parser.add_argument("--steps", type=int, default=5, help="measured steps per side")
    parser.add_argument("--repeats", type=int, default=2, help="processes per side, alternating; the best counts")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--side", choices=["ours", "reference"], help=argparse.SUPPRESS)  # internal: one side
    parser.add_argument("--skip-first-step", action="store_true", help="skip the time-to-first-step measurement")
    args = parser.parse_args()
    if args.side:
        print(json.dumps(measure_side(args.side, args.batch, args.vocab, args.steps)))
        return

    spec = cpu_spec(args.batch, args.vocab)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    ceiling, source = ceiling_flops(device, dtype)
    flops_per_token = account(spec, seq_len=spec.train.seq_len).flops_train
    runs: dict[str, list[dict]] = {"ours": [], "reference": []}
    for _ in range(args.repeats):  # alternate, so drifting load on a shared machine hits both sides alike
        for side in runs:
            runs[side].append(run_side(side, args))
            r = runs[side][-1]
            print(f"{side}: {r['tokens_per_s']:.0f} tok/s, step {r['step_s']:.3f} s, CPU {r['step_cpu_s']:.3f} s",
                  file=sys.stderr, flush=True)
    ceiling = max(ceiling, ceiling_flops(device, dtype)[0])
    sides = {side: max(rs, key=lambda r: r["tokens_per_s"]) for side, rs in runs.items()}
    for r in sides.values():
        r["mfu"] = flops_per_token * r["tokens_per_s"] / ceiling
    report = {
        "machine": f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
                   + (f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""),
        "config": f"gpt2-small-like 6L d384 6h T{spec.train.seq_len} vocab {args.vocab}, batch {args.batch}, fp32",
        "ceiling_flops": ceiling, "ceiling_source": source, "flops_per_token_train": flops_per_token,
        "ours": sides["ours"], "reference": sides["reference"],
        "ratio": sides["ours"]["tokens_per_s"] / sides["reference"]["tokens_per_s"],
        "ratio_cpu_time": sides["reference"]["step_cpu_s"] / sides["ours"]["step_cpu_s"],
        "load_average": os.getloadavg(),
    }
    if not args.skip_first_step:
        report["first_step"] = time_to_first_step()
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"machine: {report['machine']}\nconfig:  {report['config']}")
    print(f"ceiling: {ceiling / 1e9:.1f} GFLOP/s ({source})")
    print(f"{'':10} {'tok/s':>9} {'step s':>8} {'step CPU s':>11} {'MFU':>6} {'compile s':>10} {'peak RSS':>9}")
    for name in ("ours", "reference"):
        r = sides[name]
        print(f"{name:10} {r['tokens_per_s']:9.0f} {r['step_s']:8.3f} {r['step_cpu_s']:11.3f} {100 * r['mfu']:5.1f}% "
              f"{r['compile_s']:10.1f} {r['peak_mem_bytes'] / 2**30:7.2f} GiB")
    print(f"ratio ours/reference: {report['ratio']:.3f}× by wall time, {report['ratio_cpu_time']:.3f}× by CPU time "
          f"(load average {report['load_average'][0]:.2f})")
    for name, f in report.get("first_step", {}).items():
        if name != "command":
            print(f"time to first step, llama-like-tiny, {name} compile cache: {f['time_to_first_step_s']:.1f} s in "
                  f"the loop (compile {f['compile_s']:.1f} s), {f['process_wall_s']:.1f} s for the whole process")


if __name__ == "__main__":
    main()
