"""Quantization and low-precision training on the CPU: what `archspec quantize` gives, and fp16 with loss scaling.

    ARCHSPEC_HOME=/tmp/q-home ARCHSPEC_CACHE=/tmp/q-cache ARCHSPEC_REGISTRY=sqlite:////tmp/q.db \
        .venv/bin/python bench/quantize.py --steps 200 --moe-steps 100 --work-dir /tmp/q-bench [--json]

1. size/loss: llama-like-tiny and mixtral-like-tiny trained `--steps` (`--moe-steps`) through the shared loop (`archspec train`,
   their own recipes otherwise), then `archspec quantize --scheme int8` and `--scheme int4` (default group size;
   mixtral-like-tiny's expert width 176 takes none of 128/64/32, so its int4 is at --group-size 16): the model's
   bytes before/after (its whole stored state: the fp32 embedding and head are kept) and over the quantized weights
   alone, and the validation loss before/after on the run's own validation set. The seed's claim: 4× smaller, 2–3%
   worse.
2. decode: greedy KV-cached generation (`Model.stream`) of `--new-tokens` tokens from a 16-token prompt, fp32 vs int8
   vs int4 of the same trained llama-like-tiny, at 1 and 2 threads, best of `--repeats`.
3. fp16: llama-like-tiny trained `--fp16-steps` steps at precision fp32 and fp16 (autocast fp16 + GradScaler on the
   CPU), same seed and batches: per-step loss difference, final validation losses, skipped steps.
Runs are reused from --work-dir when they exist (the training is the slow part).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PY = sys.executable


def cli(*args: str) -> dict:
    out = subprocess.run([PY, "-m", "archspec", *args], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode != 0:
        raise SystemExit(f"archspec {' '.join(args)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def trained(spec: str, steps: int, work: Path, *sets: str) -> tuple[str, Path]:
    run_dir = work / f"{spec}-{steps}{''.join(s.replace('=', '_').replace('train.', '-') for s in sets)}"
    if (run_dir / "run.json").is_file():
        info = json.loads((run_dir / "run.json").read_text())
        return info["run_id"], run_dir
    args = ["train", str(ROOT / "specs" / f"{spec}.yaml"), "--steps", str(steps), "--no-compile", "--json", "-q",
            "--device", "cpu", "--run-dir", str(run_dir)]
    for s in sets:
        args += ["--set", s]
    info = cli(*args)
    (run_dir / "run.json").write_text(json.dumps(info))
    return info["run_id"], run_dir


def size_and_loss(steps: int, moe_steps: int, work: Path) -> list[dict]:
    rows = []
    for spec, int4_group in (("llama-like-tiny", None), ("mixtral-like-tiny", 16)):
        steps = moe_steps if spec.startswith("mixtral") else steps
        run_id, run_dir = trained(spec, steps, work)
        for scheme in ("int8", "int4"):
            args = ["quantize", run_id, "--scheme", scheme, "--json"]
            if scheme == "int4" and int4_group:
                args += ["--group-size", str(int4_group)]
            d = cli(*args)
            rows.append({"spec": spec, "steps": steps, "scheme": scheme, "group_size": d["group_size"],
                         "quantized_weights": len(d["quantized_modules"]),
                         "model_ratio": d["weight_bytes_before"] / d["weight_bytes_after"],
                         "quantized_ratio": d["quantized_bytes_before"] / d["quantized_bytes_after"],
                         "val_loss": d["val_loss_before"], "val_loss_after": d["val_loss_after"],
                         "delta": d["val_loss_delta"], "delta_pct": 100 * d["val_loss_delta"] / d["val_loss_before"],
                         "checkpoint": d["checkpoint"]})
    return rows


def decode(run_dir: Path, quantized: dict[str, str], new_tokens: int, repeats: int) -> list[dict]:
    from archspec.sample import load_model

    rows = []
    prompt = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    models = {"fp32": load_model(str(run_dir / "checkpoint.pt")).model}
    for scheme, path in quantized.items():
        models[scheme] = load_model(path).model
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for scheme, model in models.items():
            list(model.stream(prompt, 4, 0.0))  # warm-up (the int4 kernel's layout is made on first use)
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                n = sum(1 for _ in model.stream(prompt, new_tokens, 0.0))
                best = min(best, time.perf_counter() - t0)
            rows.append({"scheme": scheme, "threads": threads, "tokens": n, "tok_per_s": n / best})
    return rows


def fp16_vs_fp32(steps: int, work: Path) -> dict:
    out = {}
    for precision in ("fp32", "fp16"):
        run_id, run_dir = trained("llama-like-tiny", steps, work, f"train.precision={precision}",
                                  "train.batch_size=4", "train.seq_len=64", f"train.eval_interval={steps}")
        from archspec.registry import Registry, default_url

        with Registry(default_url()) as reg:
            history = reg.metric_history(run_id, "train_loss")
            run = reg.get_run(run_id)
            skipped = reg.metric_history(run_id, "skipped_steps") if precision == "fp16" else []
            scale = reg.metric_history(run_id, "loss_scale") if precision == "fp16" else []
        out[precision] = {"losses": [p.value for p in history], "val_loss": run.metrics["val_loss"],
                          "tokens_per_s": run.summary.get("tokens_per_s"),
                          "skipped_steps": skipped[-1].value if skipped else 0,
                          "final_scale": scale[-1].value if scale else None}
    diffs = [abs(a - b) for a, b in zip(out["fp32"]["losses"], out["fp16"]["losses"])]
    out["max_step_loss_diff"] = max(diffs)
    out["mean_step_loss_diff"] = sum(diffs) / len(diffs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--moe-steps", type=int, default=None, help="mixtral-like-tiny's steps [default: --steps]")
    ap.add_argument("--fp16-steps", type=int, default=30)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/archspec-bench-quantize"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    report = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": platform.processor()
              or platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__}
    report["size_loss"] = rows = size_and_loss(args.steps, args.moe_steps or args.steps, args.work_dir)
    llama = {r["scheme"]: r["checkpoint"] for r in rows if r["spec"] == "llama-like-tiny"}
    run_dir = Path(llama["int8"]).parent
    report["decode"] = decode(run_dir, llama, args.new_tokens, args.repeats)
    report["fp16"] = fp16_vs_fp32(args.fp16_steps, args.work_dir)
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"{report['date']} · {report['machine']} · {report['cpus']} CPUs · torch {report['torch']}")
    print("\nspec               scheme group weights  model×  quantized×  val loss  → after   delta (%)")
    for r in rows:
        print(f"{r['spec']:<18} {r['scheme']:<6} {str(r['group_size'] or '-'):>5} {r['quantized_weights']:>7}  "
              f"{r['model_ratio']:5.2f}  {r['quantized_ratio']:9.2f}   {r['val_loss']:.4f}  {r['val_loss_after']:.4f}"
              f"  {r['delta']:+.4f} ({r['delta_pct']:+.2f}%)")
    print("\ndecode (greedy, KV cache, llama-like-tiny)")
    for r in report["decode"]:
        print(f"  {r['scheme']:<5} {r['threads']} thread{'s' * (r['threads'] > 1)}: {r['tok_per_s']:8.1f} tok/s")
    f = report["fp16"]
    print(f"\nfp16 + loss scaling vs fp32, {args.fp16_steps} steps: per-step train loss |Δ| max "
          f"{f['max_step_loss_diff']:.4f}, mean {f['mean_step_loss_diff']:.4f}; val loss fp32 {f['fp32']['val_loss']:.4f}"
          f", fp16 {f['fp16']['val_loss']:.4f}; skipped steps {f['fp16']['skipped_steps']:.0f}, final scale "
          f"{f['fp16']['final_scale']}; tok/s fp32 {f['fp32']['tokens_per_s']:.0f}, fp16 {f['fp16']['tokens_per_s']:.0f}")


if __name__ == "__main__":
    main()
