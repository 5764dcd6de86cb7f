"""Step time of a generated model before and after the runtime move (issue 23), side by side in one process.

    .venv/bin/python bench/bench_runtime_move.py [--before REV] [--presets mistral-like-tiny mixtral-like-tiny]

"Before" is `generated/<preset>.py` as committed at REV (the kernels rendered into the file); "after" is today's
rendering (the file imports archspec.runtime). Same spec, same seed-0 weights, same batch; eager forward + backward
+ AdamW step on CPU, the two alternating in rounds so that load on the machine falls on both alike. Prints one JSON
object: per preset, the median step of each and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BEFORE = "5475eb5"  # the last commit whose generated files carried the kernels


def _steps(model, idx, n: int, opt) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        _, loss = model(idx, idx)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    import torch

    from archspec.codegen import generate, import_source
    from archspec.spec import load_spec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE)
    parser.add_argument("--presets", nargs="+", default=["mistral-like-tiny", "mixtral-like-tiny"])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="steps per round")
    args = parser.parse_args()
    torch.set_num_threads(2)
    report = {"before": args.before, "torch": torch.__version__, "threads": torch.get_num_threads()}
    for preset in args.presets:
        spec = load_spec(str(ROOT / "specs" / f"{preset}.yaml"))
        old_text = subprocess.run(["git", "show", f"{args.before}:generated/{preset}.py"], cwd=ROOT, check=True,
                                  capture_output=True, text=True).stdout
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{preset.replace('-', '_')}_before.py"
            path.write_text(old_text)
            modules = {"before": import_source(path, old_text), "after": generate(spec, write=False).module}
        runs = {}
        idx = torch.randint(0, spec.model.vocab_size, (spec.train.batch_size, spec.train.seq_len),
                            generator=torch.Generator().manual_seed(0))
        for label, module in modules.items():
            torch.manual_seed(0)
            model = module.Model()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            _steps(model, idx, 3, opt)  # warm-up: allocator, caches, AdamW state
            runs[label] = (model, opt, [])
        for _ in range(args.rounds):
            for label, (model, opt, times) in runs.items():
                times += _steps(model, idx, args.steps, opt)
        medians = {label: statistics.median(times) for label, (_, _, times) in runs.items()}
        report[preset] = {"before_ms": 1000 * medians["before"], "after_ms": 1000 * medians["after"],
                          "after_over_before": medians["after"] / medians["before"],
                          "batch": [spec.train.batch_size, spec.train.seq_len]}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
