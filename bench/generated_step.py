"""Training step time of generated models before/after a change of the generated code, side by side in one process
(issues 43/44: the generated files lost their parallel code and gained one class per part; nothing may get slower).

    python bench/generated_step.py --before c4d4276 [--presets llama-like-tiny,mixtral-like-tiny] [--steps 20]

"after" is the file this tree renders from specs/; "before" is generated/<preset>.py as committed at `--before`
(git show), run against this tree's archspec.runtime. Names that runtime no longer has (the MoE's old parallel hooks
`ONE_PROCESS`, `local_tensor`) are taken from archspec/runtime/experts.py at `--before`. The same weights (seed 0)
and the same random tokens for both; AdamW, fp32, eager, CPU; `--warmup` steps, then the median of `--steps` timed
steps, the four runs interleaved step by step so that a neighbour's load falls on all alike. No timing is asserted
anywhere: these are figures for a closing note.
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from archspec import runtime  # noqa: E402
from archspec.codegen import generate, import_source  # noqa: E402
from archspec.spec import load_spec  # noqa: E402


def _git_show(rev: str, path: str) -> str:
    return subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def _before(rev: str, preset: str):
    """The Model class of generated/<preset>.py at `rev`, importable against today's runtime."""
    text = _git_show(rev, f"generated/{preset}.py")
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.ImportFrom) and n.module == "archspec.runtime")
    names = [alias.name for alias in node.names]
    gone = [n for n in names if not hasattr(runtime, n)]
    if gone:
        old = types.ModuleType("_archspec_runtime_before")
        exec(compile(_git_show(rev, "archspec/runtime/experts.py"), "experts.py", "exec"), old.__dict__)  # noqa: S102
        sys.modules[old.__name__] = old
        lines = text.split("\n")
        kept = [n for n in names if n not in gone]
        lines[node.lineno - 1:node.end_lineno] = [f"from archspec.runtime import {', '.join(kept)}",
                                                  f"from {old.__name__} import {', '.join(gone)}"]
        text = "\n".join(lines)
    return import_source(Path(f"<{preset} at {rev}>"), text).Model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the git revision whose generated/ is 'before'")
    ap.add_argument("--presets", default="llama-like-tiny,mixtral-like-tiny")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    runs = {}
    for preset in args.presets.split(","):
        spec = load_spec(ROOT / "specs" / f"{preset}.yaml")
        idx = torch.randint(0, spec.model.vocab_size, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(1))
        for label, make in (("before", _before(args.before, preset)), ("after", generate(spec, write=False).Model)):
            torch.manual_seed(0)
            model = make().train()
            runs[(preset, label)] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3), idx, [])
        a, b = (runs[(preset, lbl)][0] for lbl in ("before", "after"))
        assert a.state_dict().keys() == b.state_dict().keys()
        b.load_state_dict(a.state_dict())  # the same weights for both

    def step(model, opt, idx) -> float:
        _, loss = model(idx[:, :-1], idx[:, 1:])
        loss = loss + sum(model.auxiliary_losses().values()) if hasattr(model, "auxiliary_losses") else loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss)

    losses = {}
    for i in range(args.warmup + args.steps):
        for key, (model, opt, idx, times) in runs.items():
            t0 = time.perf_counter()
            losses[key] = step(model, opt, idx)
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch} x {args.seq}, median of "
          f"{args.steps} steps after {args.warmup}; load average {os.getloadavg()[0]:.2f} at the end")
    print(f"{'preset':<20} {'before ms':>10} {'after ms':>10} {'after/before':>13} {'fastest step b/a ms':>20} "
          f"{'last loss before/after':>24}")
    for preset in args.presets.split(","):
        mb, ma = (statistics.median(runs[(preset, lbl)][3]) for lbl in ("before", "after"))
        fb, fa = (min(runs[(preset, lbl)][3]) for lbl in ("before", "after"))
        print(f"{preset:<20} {mb * 1e3:>10.1f} {ma * 1e3:>10.1f} {ma / mb:>13.3f} {fb * 1e3:>9.1f}/{fa * 1e3:<9.1f} "
              f"{losses[(preset, 'before')]:>11.5f}/{losses[(preset, 'after')]:.5f}")


if __name__ == "__main__":
    main()
