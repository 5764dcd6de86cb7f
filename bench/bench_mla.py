"""Multi-head latent attention: KV bytes at the DeepSeek-V3 shape, a training step against GQA of equal parameters, and
decode speed against transformers' DeepseekV3ForCausalLM of the same weights.

    .venv/bin/python bench/bench_mla.py                       # all three, tables on stdout
    .venv/bin/python bench/bench_mla.py --only kv --json

1. kv: KV-cache bytes per token (bf16) of a 61-layer model of DeepSeek-V3's attention shape (d_model 7168, 128 heads):
   MLA (kv_lora_rank 512 + qk_rope_head_dim 64 per layer), GQA with 8 K/V heads of 128 and MHA (128 of 128), from
   `archspec.accounting` and from what the generated model's `new_cache` allocates (built on the meta device: no
   weights are allocated), and the ratios.
2. train: one optimizer step (forward, backward, AdamW) of the two variants of specs/ablations/mla-vs-gqa.yaml
   (llama-like-tiny with GQA 4/2, or MLA of exactly equal parameters) at batch 8 × 128 tokens, fp32 on the CPU, the
   sides alternating; median of --steps steps after 3 warm-up steps.
3. decode: a tiny deepseek_v3 (d_model 128, 4 layers, query latent 48, KV latent 64, dense FFN) imported into archspec
   with its weights; greedy decoding of --new tokens after a 16-token prompt, batch 1, both with a KV cache:
   archspec `Model.generate` against `hf.generate(do_sample=False, min_new_tokens=new)` (sdpa). Tokens must be
   equal (checked). Best of --repeats, alternating.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from archspec.accounting import account, kv_cache_bytes  # noqa: E402
from archspec.codegen import generate  # noqa: E402
from archspec.spec import load_spec, load_spec_dict  # noqa: E402

V3_ATTENTION = {
    "MLA": {"kind": "mla", "n_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128},
    "GQA": {"n_heads": 128, "n_kv_heads": 8, "head_dim": 128},
    "MHA": {"n_heads": 128, "n_kv_heads": 128, "head_dim": 128},
}


def kv() -> dict:
    out = {}
    for name, attention in V3_ATTENTION.items():
        spec = load_spec_dict({"name": "v3-kv", "model": {
            "vocab_size": 129280, "context_length": 4096, "d_model": 7168, "n_layers": 61, "norm": {"eps": 1e-6},
            "attention": attention, "ffn": {"kind": "glu", "hidden_dim": 18432}, "tie_embeddings": False}})
        with torch.device("meta"):
            model = generate(spec, write=False).Model()
        L = 1024
        allocated = sum(c.nbytes for c in model.new_cache(1, L, dtype=torch.bfloat16)) // L
        out[name] = {"accounting": account(spec).kv_cache_bytes_per_token, "new_cache": allocated,
                     "per_sequence_4096_MiB": kv_cache_bytes(spec.model, 4096, "bf16") / 2**20}
    for name in ("GQA", "MHA"):
        out[name]["ratio_to_mla"] = out[name]["accounting"] / out["MLA"]["accounting"]
    return out


def _variants() -> dict:
    import yaml

    sweep = yaml.safe_load((ROOT / "specs/ablations/mla-vs-gqa.yaml").read_text())
    base = yaml.safe_load((ROOT / "specs/llama-like-tiny.yaml").read_text())
    out = {}
    for attention in sweep["grid"]["model.attention"]:
        data = json.loads(json.dumps(base))
        data["model"]["attention"] = attention
        out[attention["kind"].upper()] = load_spec_dict(data)
    return out


def train(steps: int) -> dict:
    specs = _variants()
    runs = {}
    for name, spec in specs.items():
        torch.manual_seed(0)
        model = generate(spec, write=False).Model().train()
        runs[name] = (spec, model, torch.optim.AdamW(model.parameters(), lr=1e-3), [])
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 320, (8, 129), generator=g)
    for i in range(steps + 3):
        for name, (spec, model, opt, times) in runs.items():
            t = time.perf_counter()
            _, loss = model(idx[:, :-1], idx[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i >= 3:
                times.append(time.perf_counter() - t)
    return {name: {"params": sum(p.numel() for p in model.parameters()),
                   "kv_bytes_per_token_bf16": account(spec).kv_cache_bytes_per_token,
                   "flops_train_per_token": account(spec).flops_train,
                   "step_ms_median": 1000 * statistics.median(times),
                   "tokens_per_s": 8 * 128 / statistics.median(times)}
            for name, (spec, model, _, times) in runs.items()}


def decode(new: int, repeats: int) -> dict:
    import transformers

    from archspec.cli import main

    config = transformers.DeepseekV3Config(
        vocab_size=320, max_position_embeddings=256, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=64, qk_nope_head_dim=32,
        qk_rope_head_dim=16, v_head_dim=32, first_k_dense_replace=4, rope_interleave=False, bos_token_id=None,
        eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(f"{tmp}/hf")
        assert main(["import-hf", f"{tmp}/hf", "-o", f"{tmp}/v3.yaml", "--checkpoint", f"{tmp}/v3.pt"]) == 0
        spec = load_spec(f"{tmp}/v3.yaml")
        ours = generate(spec, write=False).Model().eval()
        ours.load_state_dict(torch.load(f"{tmp}/v3.pt", weights_only=True)["model"])
    prompt = torch.randint(0, 320, (1, 16), generator=torch.Generator().manual_seed(1))
    best = {"archspec": float("inf"), "hf": float("inf")}
    for _ in range(repeats):
        t = time.perf_counter()
        a = ours.generate(prompt, new, temperature=0)
        best["archspec"] = min(best["archspec"], time.perf_counter() - t)
        t = time.perf_counter()
        with torch.no_grad():
            b = hf.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                            attention_mask=torch.ones_like(prompt))
        best["hf"] = min(best["hf"], time.perf_counter() - t)
        assert torch.equal(a, b), "greedy tokens differ"
    return {k: {"seconds": v, "tokens_per_s": new / v} for k, v in best.items()} | {
        "speedup": best["hf"] / best["archspec"], "params": sum(p.numel() for p in ours.parameters())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["kv", "train", "decode"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = {"machine": f"{platform.node()} {platform.processor() or platform.machine()}, "
                      f"{torch.get_num_threads()} threads, torch {torch.__version__}",
           "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    if args.only in (None, "kv"):
        out["kv"] = kv()
    if args.only in (None, "train"):
        out["train"] = train(args.steps)
    if args.only in (None, "decode"):
        out["decode"] = decode(args.new, args.repeats)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
