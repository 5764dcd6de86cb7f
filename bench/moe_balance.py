"""Expert-load balance over training: softmax + load-balancing loss vs sigmoid + bias balancing (issue 25).

    PYTHONPATH=. python -m archspec ablate specs/ablations/routing.yaml --registry sqlite:///reg.db --no-compile
    PYTHONPATH=. python bench/moe_balance.py --registry sqlite:///reg.db [--sweep routing] [--out docs/ablations]

Reads the sweep's runs from the registry (nothing is trained here: the ablation's own runs are the measurement) and,
at each evaluation, the router statistics the loop records for every MoE model: `moe.max_load` and `moe.min_load`
(the busiest and idlest expert's share of the routed assignments in any layer: 1/n_experts is perfect balance),
`moe.entropy` (mean router entropy, nats; over the normalised scores for sigmoid routers) and `moe.bias_spread`
(max − min of the selection bias, where there is one). Prints, per variant, the mean over seeds at each evaluation
step (± the std over seeds), and writes `routing-balance.png` (one panel per statistic: the seeds' mean, their range
shaded) and `routing-balance.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATS = ("moe.max_load", "moe.min_load", "moe.entropy", "moe.bias_spread", "val_loss")


def collect(registry_url: str, sweep: str) -> dict[str, dict[str, dict[int, list[float]]]]:
    """variant label → statistic → eval step → the seeds' values."""
    from archspec.registry import Registry

    registry = Registry(registry_url)
    out: dict[str, dict[str, dict[int, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    runs = [r for r in registry.runs() if sweep in r.memberships and r.status == "FINISHED"]
    if not runs:
        sys.exit(f"no finished run of sweep {sweep!r} in {registry_url}")
    for run in runs:
        m = run.memberships[sweep]
        label = f"v{m.variant}"
        for key in STATS:
            for point in registry.metric_history(run.id, key):
                out[label][key][point.step].append(point.value)
    return out


def table(data) -> list[str]:
    lines = ["| variant | step | " + " | ".join(k.removeprefix("moe.") for k in STATS) + " |",
             "|---|---:|" + "---:|" * len(STATS)]
    for label in sorted(data):
        steps = sorted({s for key in STATS for s in data[label][key]})
        for step in steps:
            cells = []
            for key in STATS:
                values = data[label][key].get(step, [])
                if not values:
                    cells.append("–")
                elif len(values) == 1:
                    cells.append(f"{values[0]:.4f}")
                else:
                    cells.append(f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}")
            lines.append(f"| {label} | {step} | " + " | ".join(cells) + " |")
    return lines


def plot(data, path: Path, names: dict[str, str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in STATS if any(data[v][k] for v in data)]
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.4))
    colour = {label: f"C{i}" for i, label in enumerate(sorted(data))}  # one colour per variant in every panel
    for ax, key in zip(axes, keys):
        for label in sorted(data):
            points = sorted(data[label][key].items())
            if not points:
                continue
            steps = [s for s, _ in points]
            means = [statistics.mean(v) for _, v in points]
            lo = [min(v) for _, v in points]
            hi = [max(v) for _, v in points]
            ax.plot(steps, means, marker="o", color=colour[label], label=names.get(label, label))
            ax.fill_between(steps, lo, hi, color=colour[label], alpha=0.2)
        ax.set_title(key)
        ax.set_xlabel("step")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", required=True)
    parser.add_argument("--sweep", default="routing")
    parser.add_argument("--out", default=str(ROOT / "docs" / "ablations"))
    parser.add_argument("--names", default="v0=softmax + aux loss,v1=sigmoid + bias balancing",
                        help="variant=label pairs for the figure's legend")
    args = parser.parse_args(argv)
    data = collect(args.registry, args.sweep)
    names = dict(pair.split("=", 1) for pair in args.names.split(",") if "=" in pair)
    print("\n".join(table(data)))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot(data, out / "routing-balance.png", names)
    (out / "routing-balance.json").write_text(json.dumps(
        {label: {key: {str(s): v for s, v in sorted(points.items())} for key, points in stats.items()}
         for label, stats in data.items()}, indent=1, sort_keys=True))
    print(f"wrote {out / 'routing-balance.png'} and {out / 'routing-balance.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
