"""media_recall (issue 46): does a tiny model with gated cross-attention learn key/value pairs that only the media
holds, where the same language model without it stays at chance? And the step time of flamingo-like-tiny against the
same model without cross-attention.

    PYTHONPATH=. python bench/media_recall.py [--steps 200] [--every 25]

Prints the accuracy curves (probe: 512 fresh examples, argmax on the answers) of: text-only, cross-attention every
layer (media tokens = the pairs), the same with a Perceiver resampler (8 features per item in, `pairs` tokens out);
then flamingo-like-tiny's train step time (batch 8 × 128 tokens, 2 items × 32 features per sequence) beside
llama-like-tiny's layers at the same depth (the same spec without model.media). One CPU thread; one run each.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from archspec.codegen import generate
from archspec.data.corpus.media_recall import MediaRecall, train_media_recall
from archspec.spec import load_spec, load_spec_dict

ROOT = Path(__file__).resolve().parent.parent
MARK = 3
LM = {"vocab_size": 64, "context_length": 16, "d_model": 64, "n_layers": 2, "attention": {"n_heads": 4},
      "ffn": {"kind": "glu", "hidden_dim": 128}}


def variants(task: MediaRecall) -> dict[str, dict | None]:
    media = {"width": task.width, "tokens": task.pairs, "max_items": 1, "marker_id": MARK,
             "cross_attention": {"every": 1, "n_heads": 4, "ffn_hidden": 128}}
    return {"text-only": None, "cross-attention": media,
            "cross-attention + resampler": {**media, "resampler": {"depth": 1, "n_heads": 4, "head_dim": 16,
                                                                   "max_input_tokens": task.pairs}}}


def recall(steps: int, every: int) -> None:
    task = MediaRecall()
    print(f"media_recall: {task.pairs} pairs per item, {task.keys} keys, {task.values} values (chance "
          f"{task.chance:.4f}), media width {task.width}; d_model 64, 2 layers; AdamW 3e-3, batch 32, {steps} steps")
    for name, media in variants(task).items():
        spec = load_spec_dict({"name": "recall", "model": {**LM, **({"media": media} if media else {})}})
        torch.manual_seed(0)
        model = generate(spec, write=False).Model()
        t0 = time.perf_counter()
        curve = train_media_recall(model, task, MARK, steps, media=media is not None, every=every)
        params = sum(p.numel() for p in model.parameters())
        print(f"{name:28s} {params:>8,} params  " + "  ".join(f"{s}:{a:.3f}" for s, a in curve)
              + f"  ({time.perf_counter() - t0:.0f} s)")


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
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    recall(args.steps, args.every)
    step_time()
