"""Multi-token prediction (issue 47; docs/mtp.md): what the MTP ablation's runs learned, and self-speculative decoding.

For each finished run of a sweep (default: `mtp`, specs/ablations/mtp.yaml) it loads the run's checkpoint and, on the
run's own validation windows, measures the main model's mean cross-entropy and next-token accuracy (argmax = the next
token) and the depth-1 module's accuracy on the token after it; then it decodes `--tokens` tokens greedily after a
prompt from the validation text twice — with the model's own stream() and with `mtp_speculative_stream` (the MTP
modules draft, `archspec sample --draft mtp`) — checks the two outputs are equal, and reports the acceptance rate,
tokens per model forward and the wall-clock speed-up (best of `--repeats`, side by side: the machine is shared; one
torch thread unless `--threads`).

    ARCHSPEC_REGISTRY=sqlite:///... .venv/bin/python bench/mtp.py [--sweep mtp] [--tokens 96] [--json]
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


def evaluate(model, batches) -> dict[str, float]:
    """Mean main cross-entropy, next-token accuracy, and the depth-1 module's accuracy (token t + 2)."""
    loss_sum = correct = total = mtp_correct = mtp_total = 0.0
    with torch.no_grad():
        for x, y in batches:
            model.eval()
            h = model.hidden_states(x)
            logits, loss = model.head(h, y)
            loss_sum += loss.item() * y.numel()
            correct += (logits.argmax(-1) == y).sum().item()
            total += y.numel()
            if getattr(model, "mtp", None) is not None:
                T = y.size(1) - 1
                _, lg = model.mtp_forward(1, model.final_norm(h)[:, :T], y[:, :T])
                mtp_correct += (lg.argmax(-1) == y[:, 1:]).sum().item()
                mtp_total += y[:, 1:].numel()
    out = {"val_loss": loss_sum / total, "next_token_accuracy": correct / total}
    if mtp_total:
        out["mtp1_accuracy"] = mtp_correct / mtp_total
    return out


def decode(model, prompt: torch.Tensor, tokens: int, repeats: int) -> dict[str, float]:
    from archspec.sample import SpeculativeStats, mtp_speculative_stream

    model.eval()
    plain_s, spec_s = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        want = [int(t) for t in model.stream(prompt, tokens, temperature=0)]
        plain_s.append(time.perf_counter() - t0)
        stats = SpeculativeStats()
        t0 = time.perf_counter()
        got = list(mtp_speculative_stream(model, prompt, tokens, stats=stats))
        spec_s.append(time.perf_counter() - t0)
        assert got == want, "self-speculative output differs from greedy decoding"
    return {"tokens": tokens, "acceptance_rate": stats.acceptance_rate, "accepted": stats.accepted,
            "drafted": stats.drafted, "model_forwards": stats.target_forwards,
            "tokens_per_forward": tokens / stats.target_forwards, "greedy_s": min(plain_s),
            "self_speculative_s": min(spec_s), "speedup": min(plain_s) / min(spec_s)}


SUMMARY_METRICS = ("val_loss", "next_token_accuracy", "mtp1_accuracy", "acceptance_rate", "tokens_per_forward", "speedup")


def summarize(rows: list[dict]) -> list[dict]:
    """Per variant (its `mtp` setting and step count): each metric's mean, std and seeds, and its difference from the
    λ = 0 variant at the same steps with the Welch 95% interval (archspec.ablate.stats, what `ablate`'s report uses)."""
    from statistics import fmean, stdev

    from archspec.ablate.stats import welch

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((json.dumps(r["mtp"], sort_keys=True), r["steps"]), []).append(r)

    def is_baseline(key: tuple) -> bool:
        mtp = json.loads(key[0])
        return mtp is None or mtp.get("weight") == 0.0

    out = []
    for key, group in groups.items():
        base = next((g for k, g in groups.items() if k[1] == key[1] and is_baseline(k)), None)
        entry = {"mtp": json.loads(key[0]), "steps": key[1], "seeds": sorted(r["seed"] for r in group)}
        for metric in SUMMARY_METRICS:
            values = [r[metric] for r in group if metric in r]
            if not values:
                continue
            stat = {"mean": fmean(values), "std": stdev(values) if len(values) > 1 else None, "n": len(values)}
            base_values = [r[metric] for r in base if metric in r] if base is not None and base is not group else []
            if base_values:
                iv = welch(values, base_values)
                stat["delta"] = iv.estimate
                stat["ci95"] = [iv.low, iv.high] if iv.known else None
            entry[metric] = stat
        out.append(entry)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", default="mtp")
    parser.add_argument("--registry", default=None)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: on a shared, loaded CPU a 2-thread GEMM of a few rows waits on the other "
                             "thread, and decoding's timings swing by several times)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from archspec.registry import Registry, default_url
    from archspec.sample import load_model
    from archspec.cache import cache_dir
    from archspec.train.data import build_data

    torch.set_num_threads(args.threads)
    url = args.registry or default_url()
    with Registry(url) as reg:
        runs = list(reg.runs(where=f"sweep = '{args.sweep}' and status = 'FINISHED'"))
    rows = []
    for run in runs:
        loaded = load_model(run.id, registry_url=url)
        spec = loaded.spec
        data = build_data(spec, cache_dir(None))
        row = {"run": run.id, "mtp": spec.model.mtp.model_dump() if spec.model.mtp else None, "seed": spec.train.seed,
               "steps": spec.train.steps, **evaluate(loaded.model, data.val_batches)}
        if spec.model.mtp is not None:
            prompt = data.val_batches[0][0][:1, : args.prompt_tokens]
            row.update(decode(loaded.model, prompt, args.tokens, args.repeats))
        rows.append(row)
    summary = summarize(rows)
    if args.json:
        print(json.dumps({"runs": rows, "summary": summary}, indent=1))
        return
    for r in rows:
        line = (f"{r['run']}  mtp={r['mtp']}  seed {r['seed']}  val_loss {r['val_loss']:.4f}  next-token acc "
                f"{r['next_token_accuracy']:.4f}")
        if "mtp1_accuracy" in r:
            line += f"  depth-1 acc {r['mtp1_accuracy']:.4f}"
        if "speedup" in r:
            line += (f"  | --draft mtp: acceptance {100 * r['acceptance_rate']:.1f}% ({r['accepted']}/{r['drafted']}), "
                     f"{r['tokens_per_forward']:.2f} tokens/forward, {r['greedy_s']:.3f} s → {r['self_speculative_s']:.3f} s "
                     f"(×{r['speedup']:.2f})")
        print(line)
    for entry in summary:
        print(f"mtp={entry['mtp']}  {entry['steps']} steps  seeds {entry['seeds']}")
        for metric in SUMMARY_METRICS:
            if metric not in entry:
                continue
            st = entry[metric]
            line = f"  {metric:20s} {st['mean']:.4f}" + (f" ± {st['std']:.4f}" if st["std"] is not None else "")
            if "delta" in st:
                ci = st["ci95"]
                line += f"   Δ {st['delta']:+.4f}" + (f"  95% CI [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "  (no interval)")
            print(line)


if __name__ == "__main__":
    main()
