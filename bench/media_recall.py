"""media_recall (issue 46) through the shared loop: does a tiny model with gated cross-attention learn key/value pairs
that only the media holds, where the same language model without it stays at chance? Each variant is one
`archspec train` of a spec on the media_recall corpus (archspec/data/corpus/media_recall.py), recorded in a
registry; its curve is the run's `probe.accuracy` (argmax on the answers of the task's fixed validation examples) at
each evaluation. Then the step time of flamingo-like-tiny against the same model without cross-attention.

    PYTHONPATH=. python bench/media_recall.py [--steps 200] [--every 25] [--registry sqlite:////tmp/recall.db]

Variants: text-only (the same spec without model.media), cross-attention in front of every block (media tokens = the
pairs), the same with a Perceiver resampler (4 features per item in, 4 tokens out). flamingo-like-tiny's train step
time: batch 8 × 128 tokens, 2 items × 32 features per sequence, beside the same spec without model.media. One CPU
thread; one run each.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import time
from pathlib import Path

import torch
import yaml

from archspec.cli import main
from archspec.codegen import generate
from archspec.registry import Registry
from archspec.spec import load_spec, load_spec_dict

ROOT = Path(__file__).resolve().parent.parent
TASK = {"kind": "media_recall", "pairs": 4, "keys": 16, "values": 16, "width": 32, "val_examples": 512}
LM = {"vocab_size": 320, "context_length": 16, "d_model": 64, "n_layers": 2, "attention": {"n_heads": 4},
      "ffn": {"kind": "glu", "hidden_dim": 128}}


def variants() -> dict[str, dict | None]:
    media = {"width": TASK["width"], "tokens": TASK["pairs"], "max_items": 1, "marker_id": 257,
             "cross_attention": {"every": 1, "n_heads": 4, "ffn_hidden": 128}}
    return {"text-only": None, "cross-attention": media,
            "cross-attention + resampler": {**media, "resampler": {"depth": 1, "n_heads": 4, "head_dim": 16,
                                                                   "max_input_tokens": TASK["pairs"]}}}


def recall(steps: int, every: int, registry: str) -> None:
    print(f"media_recall: {TASK['pairs']} pairs per item, {TASK['keys']} keys, {TASK['values']} values (chance "
          f"{1 / TASK['values']:.4f}), media width {TASK['width']}; d_model 64, 2 layers; AdamW 3e-3, batch 32, "
          f"{steps} steps; `archspec train`, registry {registry}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, media in variants().items():
            spec = {"name": "recall-" + name.replace(" + ", "-").replace(" ", "-"),
                    "model": {**LM, **({"media": media} if media else {})},
                    "train": {"steps": steps, "batch_size": 32, "seq_len": 16, "lr": 3.0e-3, "warmup_steps": 10,
                              "eval_interval": every, "compile": "none", "data": {"corpus": TASK}}}
            path = Path(tmp) / f"{spec['name']}.yaml"
            path.write_text(yaml.safe_dump(spec))
            t0 = time.perf_counter()
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = main(["train", str(path), "--device", "cpu", "-q", "--json", "--registry", registry,
                           "--run-dir", str(Path(tmp) / spec["name"])])
            assert rc == 0, f"{name}: archspec train exited {rc}"
            run_id = json.loads(out.getvalue().strip().splitlines()[-1])["run_id"]
            with Registry(registry) as reg:
                curve = reg.metric_history(run_id, "probe.accuracy")
            params = sum(p.numel() for p in generate(load_spec_dict(spec), write=False).Model().parameters())
            print(f"{name:28s} {params:>8,} params  run {run_id[:8]}  "
                  + "  ".join(f"{p.step}:{p.value:.3f}" for p in curve) + f"  ({time.perf_counter() - t0:.0f} s)")


def step_time(repeats: int = 20) -> None:
    spec = load_spec(ROOT / "specs" / "flamingo-like-tiny.yaml")
    plain = load_spec_dict({"name": "plain", "model": {k: v for k, v in spec.model.model_dump(mode="json").items()
                                                       if k != "media"}})
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 256, (8, 128), generator=g)
    idx[:, [0, 64]] = spec.model.media.marker_id
    media = torch.randn(8, 2, 32, spec.model.media.width, generator=g)
    for name, s, kwargs in (("flamingo-like-tiny", spec, {"media": media}), ("without cross-attention", plain, {})):
        torch.manual_seed(0)
        model = generate(s, write=False).Model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        times = []
        for i in range(repeats + 3):
            t0 = time.perf_counter()
            _, loss = model(idx, idx, **kwargs)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i >= 3:
                times.append(time.perf_counter() - t0)
        times.sort()
        print(f"{name:26s} median train step {1000 * times[len(times) // 2]:.1f} ms (batch 8 x 128 tokens"
              + (", 2 items x 32 features -> 2 x 8 media tokens" if kwargs else "") + ")")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--registry", default="sqlite:////tmp/media_recall_bench.db")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    recall(args.steps, args.every, args.registry)
    step_time()
