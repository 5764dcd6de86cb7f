"""One prepared command for a CUDA machine: everything issue 48 asks to measure, side by side, in one call of at most
8 minutes, written as one JSON.

    python bench/gpu_check.py                      # a GPU: the figures, $OUT/gpu_check.json (else ./gpu_check.json)
    python bench/gpu_check.py --smoke --json X     # any machine, CPU, tiny sizes: that the script runs (tests do)
    python bench/gpu_check.py --only packed,sigterm --budget-s 300

Sections, each run by the bench script that owns it (a subprocess; nothing measured twice in two places), in order
of what a cut-short run should keep; each starts only while its minimum fits in what is left of --budget-s, and the
JSON is rewritten after each, so a run stopped by a time limit keeps what it measured (a section skipped for time
is named in the JSON; `--only` runs it in a second call):

- `packed`: `archspec ablate` of llama-like 26M (batch 8 × 1024, compile auto) with `--jobs-per-device 1` (seed 0,
  trained in the command's process) and `--jobs-per-device 4` (seeds 0-3, four processes on the GPU): the sum of the
  runs' recorded tokens/s (each run's steady rate; the four overlap) against the one run's, and the sweep's tokens
  over its wall time (start-up and compile included). Target: four jobs ≥ 2.5 × one.
- `llama_compile`: bench/compile_modes.py, llama-like 26M, compile auto / per_block / whole: tokens/s, MFU, compile
  seconds. Targets: auto ≥ 1.5M tok/s; whole not slower than per_block.
- `moe_eager`, `moe_compiled`: bench/bench_moe.py --size gpu (d 1024 × 8 layers, 8 experts top-2) eager and compiled
  per block (the compiled one runs last): the generated MoE's step ÷ its dense-active model's. Target: ≤ 1.5
  both. The eager section also times the dispatch as it was before issue 48 (counts by bincount, a host read per
  layer) beside it: `median_step_s` holds both.
- `sigterm`: `archspec train` of llama-like with compile auto; SIGTERM 5 s after its memory plan line
  (the first step's compile and CUDA-graph capture follow it): seconds to exit, exit code, the run's status.
  Target: ≤ 30 s, KILLED.
- `gpt2_vs_nanogpt`: bench/compile_modes.py, gpt2-small-like 124M compile auto beside bench/reference_nanogpt.py
  compiled whole (nanoGPT's compile=True) at the same batch, sequence, optimizer and bf16. Target: ≥ 1.15×.

`--smoke`: the same sections at tiny sizes on the CPU (eager where compiling would take minutes): its figures mean
nothing, its point is that the script cannot rot (tests/test_gpu_check.py). Not here: the 558M bf16/fp8 row and HF
Llama beside the 886M llama-like (bench/bench_train.py --size full) would not fit the 8
minutes beside the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

# Each size: what every section runs at. `gpu` is issue 48's table; `smoke` proves the plumbing on a CPU.
SIZES = {
    "gpu": {
        "device": "cuda", "spec": "specs/llama-like.yaml", "set": ["train.batch_size=8", "train.seq_len=1024"],
        "packed_steps": 300, "packed_jobs": 4, "packed_compile": [], "eval_tokens": 8192,
        "compile_size": "gpu", "compile_steps": 10, "llama_modes": "auto,per_block,whole", "gpt2_modes": "auto",
        "moe": ["--device", "cuda", "--size", "gpu", "--skip-hf", "--rounds", "3", "--steps", "3"],
        "sigterm_compile": [], "sigterm_after_s": 5.0, "sigterm_steps": 5000,
    },
    "smoke": {
        "device": "cpu", "spec": "specs/llama-like-tiny.yaml",
        "set": ["train.batch_size=2", "train.seq_len=32", "model.n_layers=1"],
        "packed_steps": 3, "packed_jobs": 2, "packed_compile": ["--no-compile"], "eval_tokens": 64,
        "compile_size": "smoke", "compile_steps": 1, "llama_modes": "none", "gpt2_modes": "none",
        "moe": ["--device", "cpu", "--size", "smoke", "--skip-hf", "--rounds", "1", "--steps", "1"],
        "sigterm_compile": ["--no-compile"], "sigterm_after_s": 0.0, "sigterm_steps": 100_000,
    },
}
# section: (minimum seconds it needs, at most seconds it may take) on a GPU; smoke's are small anyway
SECTIONS = {"packed": (120, 200), "llama_compile": (90, 170), "moe_eager": (40, 80), "sigterm": (45, 70),
            "gpt2_vs_nanogpt": (90, 150), "moe_compiled": (60, 110)}
TARGETS = {"llama_auto_tok_s": 1.5e6, "gpt2_vs_nanogpt": 1.15, "moe_ratio": 1.5, "packed_speedup": 2.5,
           "sigterm_stop_s": 30.0}


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def run(cmd: list[str], timeout: float, cwd: Path = ROOT) -> tuple[int, str, str]:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env(), check=False)
    except subprocess.TimeoutExpired as e:
        return 124, _text(e.stdout), _text(e.stderr) + f"\n(over {timeout:.0f} s)"
    return out.returncode, out.stdout, out.stderr


def _text(raw) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else (raw or "")


def tail(text: str, n: int = 400) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][-n:] if lines else ""


# ── sections ────────────────────────────────────────────────────────────────────────────────────────────────────


def packed(size: dict, tmp: Path, timeout: float) -> dict:
    """One job alone vs N at once on the device: the same sweep file at seed 0 vs seeds 0..N-1, each into its own
    registry."""
    import yaml

    from archspec.registry import Registry

    out: dict = {"jobs_per_device": size["packed_jobs"]}
    deadline = time.monotonic() + timeout
    for label, jobs, seeds in (("one", 1, [0]), ("packed", size["packed_jobs"], list(range(size["packed_jobs"])))):
        sweep = tmp / f"packed-{label}.yaml"
        sweep.write_text(yaml.safe_dump({"name": f"gpu-check-{label}", "base": str(ROOT / size["spec"]),
                                         "seeds": seeds, "budget": {"steps": size["packed_steps"]}}))
        url = f"sqlite:///{tmp / f'packed-{label}.db'}"
        cmd = [PY, "-m", "archspec", "ablate", str(sweep), "--registry", url, "--device", size["device"], "--json",
               "--jobs-per-device", str(jobs), "--eval-tokens", str(size["eval_tokens"]), *size["packed_compile"],
               *(a for s in size["set"] for a in ("--set", s))]
        began = time.monotonic()
        code, stdout, stderr = run(cmd, max(10.0, deadline - time.monotonic()), cwd=tmp)
        wall = time.monotonic() - began
        if code:
            out[label] = {"error": f"exit {code}: {tail(stderr)}"}
            continue
        rows = Registry(url).runs(where=f"sweep = 'gpu-check-{label}'")
        rates = [r.summary.get("tokens_per_s") for r in rows]
        tokens = sum(r.summary.get("tokens", 0) for r in rows)
        out[label] = {"runs": len(rows), "statuses": sorted({r.status for r in rows}), "wall_s": wall,
                      "tokens_per_s_each": rates, "sum_tokens_per_s": sum(x for x in rates if x),
                      "wall_tokens_per_s": tokens / wall if wall else None,
                      "note": next((line for line in stderr.splitlines() if "--jobs-per-device" in line), "")}
    one, many = out.get("one", {}), out.get("packed", {})
    if "error" not in one and "error" not in many and one.get("runs") and many.get("runs"):
        mean_one = one["sum_tokens_per_s"] / one["runs"]  # one job's rate, alone on the device
        out["speedup_steady"] = many["sum_tokens_per_s"] / mean_one if mean_one else None
        out["speedup_wall"] = (many["wall_tokens_per_s"] / one["wall_tokens_per_s"]
                               if one["wall_tokens_per_s"] else None)
    return out


def compile_modes(size: dict, tmp: Path, timeout: float, only: str, modes: str) -> dict:
    report = tmp / f"compile-{only}.json"
    code, stdout, stderr = run([PY, "bench/compile_modes.py", "--size", size["compile_size"], "--only", only,
                                "--modes", modes, "--steps", str(size["compile_steps"]), "--cache", "warm",
                                "--budget-s", str(max(30, timeout - 15)), "--json", str(report)], timeout)
    if not report.exists():
        return {"error": f"exit {code}: {tail(stderr) or tail(stdout)}"}
    data = json.loads(report.read_text())
    by_mode = {r["mode"]: r for r in data["results"]}
    keep = ("used", "reason", "tokens_per_s", "mfu", "compile_s", "first_step_s", "step_s", "params", "error")
    return {"machine": data["machine"], "precision": data["precision"],
            "modes": {m: {k: r[k] for k in keep if k in r} for m, r in by_mode.items()}}


def llama_compile(size: dict, tmp: Path, timeout: float) -> dict:
    name = "llama-26M" if size["compile_size"] == "gpu" else "llama-tiny"
    out = compile_modes(size, tmp, timeout, name, size["llama_modes"])
    modes = out.get("modes", {})
    rate = {m: r.get("tokens_per_s") for m, r in modes.items()}
    if rate.get("whole") and rate.get("per_block"):
        out["whole_vs_per_block"] = rate["whole"] / rate["per_block"]
    return out


def gpt2_vs_nanogpt(size: dict, tmp: Path, timeout: float) -> dict:
    name = "gpt2-124M" if size["compile_size"] == "gpu" else "gpt2-tiny"
    if size["compile_size"] == "smoke":  # nanoGPT compiles whole: minutes on a CPU; the smoke runs archspec's side
        out = compile_modes(size, tmp, timeout, "llama-tiny", size["gpt2_modes"])
        out["note"] = "smoke: nanoGPT's compiled peer is left out (compiling on a CPU takes minutes)"
        return out
    out = compile_modes(size, tmp, timeout, name, size["gpt2_modes"])
    modes = out.get("modes", {})
    ours, peer = modes.get(size["gpt2_modes"], {}).get("tokens_per_s"), modes.get("nanogpt", {}).get("tokens_per_s")
    if ours and peer:
        out["vs_nanogpt"] = ours / peer
    return out


def moe(size: dict, tmp: Path, timeout: float, compiled: bool) -> dict:
    if compiled and size["compile_size"] == "smoke":
        return {"note": "smoke: left out (compiling on a CPU takes most of a minute); the GPU size runs it"}
    # compiled: without bench_moe's `before` variant (bincount), one compile fewer within the section's budget
    code, stdout, stderr = run([PY, "bench/bench_moe.py", *size["moe"], "--json",
                                *(["--compile", "--skip-before"] if compiled else [])], timeout)
    if code:
        return {"error": f"exit {code}: {tail(stderr)}"}
    data = json.loads(stdout)
    ratio = data["ratio_to_dense"]
    return {"machine": data["machine"], "precision": data["precision"], "dims": data["dims"],
            "median_step_s": data["median_step_s"], "ratio_to_dense": ratio,
            "generated_vs_dense": ratio.get("archspec MoE (generated: grouped_mm)"), "notes": data["notes"]}


def sigterm(size: dict, tmp: Path, timeout: float) -> dict:
    """SIGTERM into `archspec train` once its memory plan is printed (+ sigterm_after_s): the first step's compile
    (and CUDA-graph capture) comes next on a GPU. The seconds from the signal to the process's end."""
    from archspec.registry import Registry

    url = f"sqlite:///{tmp / 'sigterm.db'}"
    cmd = [PY, "-m", "archspec", "train", str(ROOT / size["spec"]), "--device", size["device"], "--steps",
           str(size["sigterm_steps"]), "--registry", url, "--run-dir", str(tmp / "sigterm-run"),
           *size["sigterm_compile"], *(a for s in size["set"] for a in ("--set", s))]
    proc = subprocess.Popen(cmd, cwd=tmp, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    began, seen, lines = time.monotonic(), None, []
    assert proc.stderr is not None
    while time.monotonic() - began < timeout - 40:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line.rstrip())
        if line.startswith("memory plan"):
            seen = time.monotonic()
            break
    if seen is None:
        proc.kill()
        return {"error": "no memory plan line: " + (lines[-1][-300:] if lines else f"exit {proc.wait()}")}
    time.sleep(size["sigterm_after_s"])
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rest, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        rest, _ = proc.communicate()
        return {"error": "still running 60 s after SIGTERM: killed", "target_s": TARGETS["sigterm_stop_s"]}
    stop_s = time.monotonic() - sent
    stepped = any(line.startswith("step ") for line in (rest or "").splitlines())
    runs = Registry(url).runs()
    return {"stop_s": stop_s, "exit_code": proc.returncode, "status": runs[0].status if runs else None,
            "signal_after_plan_s": sent - seen, "a_step_was_logged": stepped,
            "last_line": tail(rest, 300)}


# ── the call ────────────────────────────────────────────────────────────────────────────────────────────────────


def verdicts(report: dict, smoke: bool) -> dict:
    """Each target of issue 48 against what was measured: true/false, or null when not measured (or a smoke run,
    whose sizes are not the issue's)."""
    s = report["sections"]

    def get(*path):
        node = s
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        return node

    def check(value, ok) -> dict:
        return {"value": value, "met": None if smoke or value is None else bool(ok(value))}

    return {
        "llama_26M_auto_tok_s >= 1.5M": check(get("llama_compile", "modes", "auto", "tokens_per_s"),
                                              lambda v: v >= TARGETS["llama_auto_tok_s"]),
        "whole / per_block >= 1": check(get("llama_compile", "whole_vs_per_block"), lambda v: v >= 1.0),
        "gpt2 / nanoGPT >= 1.15": check(get("gpt2_vs_nanogpt", "vs_nanogpt"), lambda v: v >= TARGETS["gpt2_vs_nanogpt"]),
        "MoE / dense-active eager <= 1.5": check(get("moe_eager", "generated_vs_dense"),
                                                 lambda v: v <= TARGETS["moe_ratio"]),
        "MoE / dense-active compiled <= 1.5": check(get("moe_compiled", "generated_vs_dense"),
                                                    lambda v: v <= TARGETS["moe_ratio"]),
        "4 jobs / 1 job tok/s >= 2.5 (steady)": check(get("packed", "speedup_steady"),
                                                       lambda v: v >= TARGETS["packed_speedup"]),
        "SIGTERM during compile: stop <= 30 s": check(get("sigterm", "stop_s"), lambda v: v <= TARGETS["sigterm_stop_s"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU: that the script runs")
    parser.add_argument("--json", type=Path, help="where the JSON goes [default: $OUT/gpu_check.json, else "
                                                  "./gpu_check.json]")
    parser.add_argument("--budget-s", type=float, default=460.0, help="start no section past this (8 minutes in all)")
    parser.add_argument("--only", default="", help=f"comma-separated sections: {', '.join(SECTIONS)}")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import torch

    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device here; run it on a GPU machine (or --smoke on any machine)")
    size = SIZES["smoke" if args.smoke else "gpu"]
    target = args.json or (Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT")
                           else Path("gpu_check.json"))
    chosen = [s for s in SECTIONS if not args.only or s in args.only.split(",")]
    report = {"size": "smoke" if args.smoke else "gpu", "command": " ".join([Path(PY).name, *sys.argv]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{platform.node()}, {os.cpu_count()} CPUs, torch {torch.__version__}"
                         + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""),
              "targets": TARGETS, "sections": {}}
    started = time.monotonic()
    runners = {"packed": packed, "llama_compile": llama_compile, "gpt2_vs_nanogpt": gpt2_vs_nanogpt,
               "moe_eager": lambda z, t, s: moe(z, t, s, False), "moe_compiled": lambda z, t, s: moe(z, t, s, True),
               "sigterm": sigterm}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(tmp) / "inductor"))  # one warm cache for all
        for name in chosen:
            least, most = SECTIONS[name]
            left = args.budget_s - (time.monotonic() - started)
            if not args.smoke and left < least:
                report["sections"][name] = {"error": f"skipped: {left:.0f} s left of the budget, it needs {least}"}
                continue
            began = time.monotonic()
            try:
                result = runners[name](size, Path(tmp), min(most, left) if not args.smoke else most)
            except Exception as e:  # noqa: BLE001 - one section's failure is reported, the others still run
                result = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            result["section_s"] = time.monotonic() - began
            report["sections"][name] = result
            report["verdicts"] = verdicts(report, args.smoke)
            report["wall_s"] = time.monotonic() - started
            target.write_text(json.dumps(report, indent=1))
            print(f"{name}: {time.monotonic() - began:.0f} s" + (f" ERROR {result['error']}" if "error" in result
                                                                   else ""), file=sys.stderr, flush=True)
    report["verdicts"] = verdicts(report, args.smoke)
    target.write_text(json.dumps(report, indent=1))
    print(json.dumps(report["verdicts"], indent=1))
    print(f"wrote {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
