"""Generation: the generated module's KV cache against recomputing, against HF `generate`, cache bytes, speculative.

    .venv/bin/python bench/bench_generate.py                 # every measurement, tables on stdout
    .venv/bin/python bench/bench_generate.py --only hf --json

1. cache: greedy decoding of the llama-like preset (26M parameters, context 1024) from a 992-token prompt, 32 new
   tokens: `Model.generate` (prefill once, then one position per step through the KV cache) against recomputing the
   whole sequence every step (`model(seq)[:, -1].argmax()`). Both produce the same tokens (checked).
2. hf: the same architecture and weights in HF `LlamaForCausalLM` (weights copied as tests/test_hf_equivalence.py
   does; sdpa attention, HF's default), same prompt, greedy, both with a KV cache: archspec `Model.stream` against
   `hf.generate(..., do_sample=False, use_cache=True)`, min_new_tokens = max_new_tokens so that neither stops early.
   Time to first token: until the first new token exists (a streamer for HF). The sides alternate `--repeats` times
   in one process and each keeps its best, since load from other work only ever slows one down.
3. bytes: the KV cache one sequence of context_length needs, MHA vs GQA vs MQA (n_kv_heads 8, 2, 1 of llama-like),
   and window layers (rolling buffers: mistral-like, llama-like with odd layers windowed, longformer-like): what
   `Model.new_cache` allocates against `archspec.accounting.kv_cache_bytes`, fp32 and bf16.
4. speculative: a target (12 layers, d_model 256, 8.9M parameters) and a draft (2 layers, d_model 128, 0.4M) trained
   on the same corpus and byte tokenizer (`--train-steps` each, target at --target-lr 1e-3, draft at --draft-lr
   3e-3, through the shared loop; checkpoints kept in --work-dir per steps and lr, reused on the next run), over
   four code prompts, greedy and sampled (temperature 0.8):
   `archspec.sample.speculative_stream` against the target alone (`Model.stream`). Acceptance rate, tokens per target
   forward, speed-up; greedy outputs must be identical. Both models' validation loss is printed: a draft as good as
   its target (or a degenerate, repetitive output) makes acceptance meaningless.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from archspec.accounting import kv_cache_bytes  # noqa: E402
from archspec.codegen import generate  # noqa: E402
from archspec.spec import canonical_dict, load_spec, load_spec_dict  # noqa: E402

LLAMA = ROOT / "specs" / "llama-like.yaml"


def _model(spec, seed: int = 0):
    torch.manual_seed(seed)
    return generate(spec, write=False).Model().eval()


def _variant(spec, **attention):
    data = canonical_dict(spec)
    data["model"]["attention"].update(attention)
    return load_spec_dict(data)


def _prompt(length: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


# ── 1. cache vs recompute ────────────────────────────────────────────────────────────────────────────────────────


@torch.no_grad()
def bench_cache(new_tokens: int = 32) -> dict:
    spec = load_spec(LLAMA)
    model = _model(spec)
    prompt = _prompt(spec.model.context_length - new_tokens, spec.model.vocab_size)
    model.generate(prompt[:, :64], 4, temperature=0)  # warm-up
    t0 = time.perf_counter()
    cached = model.generate(prompt, new_tokens, temperature=0)
    t_cached = time.perf_counter() - t0
    seq = prompt
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    t_recompute = time.perf_counter() - t0
    return {"prompt_tokens": prompt.size(1), "new_tokens": new_tokens, "same_tokens": bool(torch.equal(cached, seq)),
            "cached_s": t_cached, "recompute_s": t_recompute,
            "cached_tok_s": new_tokens / t_cached, "recompute_tok_s": new_tokens / t_recompute,
            "speedup": t_recompute / t_cached}


# ── 2. against HF generate ───────────────────────────────────────────────────────────────────────────────────────


def _hf_llama(spec, ours):
    import transformers

    m, a = spec.model, spec.model.attention
    config = transformers.LlamaConfig(
        vocab_size=m.vocab_size, hidden_size=m.d_model, intermediate_size=m.ffn.hidden_dim,
        num_hidden_layers=m.n_layers, num_attention_heads=a.n_heads, num_key_value_heads=a.n_kv_heads,
        head_dim=a.head_dim, max_position_embeddings=m.context_length, rms_norm_eps=m.norm.eps,
        rope_parameters={"rope_type": "default", "rope_theta": a.positional.theta}, attention_bias=False,
        mlp_bias=False, tie_word_embeddings=m.tie_embeddings, hidden_act="silu", bos_token_id=None,
        eos_token_id=None, pad_token_id=0, attn_implementation="sdpa",
    )
    hf = transformers.LlamaForCausalLM(config).eval()
    s = ours.state_dict()
    state = {"model.embed_tokens.weight": s["tok_emb.weight"], "model.norm.weight": s["final_norm.weight"]}
    if not m.tie_embeddings:
        state["lm_head.weight"] = s["lm_head.weight"]
    for i in range(m.n_layers):
        o, h = f"blocks.{i}.", f"model.layers.{i}."
        q, k, v = s[o + "attn.qkv_proj.weight"].split([a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim,
                                                      a.n_kv_heads * a.head_dim])
        state |= {h + "self_attn.q_proj.weight": q, h + "self_attn.k_proj.weight": k,
                  h + "self_attn.v_proj.weight": v, h + "self_attn.o_proj.weight": s[o + "attn.o_proj.weight"],
                  h + "input_layernorm.weight": s[o + "attn_norm.weight"],
                  h + "post_attention_layernorm.weight": s[o + "ffn_norm.weight"]}
        for proj in ("gate_proj", "up_proj", "down_proj"):
            state[h + f"mlp.{proj}.weight"] = s[o + f"ffn.{proj}.weight"]
    missing, unexpected = hf.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if m.tie_embeddings else set()  # HF ties it to embed_tokens: loaded with it
    assert not unexpected and set(missing) <= tied, (missing, unexpected)
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr() or not m.tie_embeddings
    return hf


class _FirstToken:
    """An HF streamer that notes when the first new token arrives (its first `put` is the prompt)."""

    def __init__(self, t0: float):
        self.t0, self.calls, self.first = t0, 0, None

    def put(self, value):
        self.calls += 1
        if self.calls == 2:
            self.first = time.perf_counter() - self.t0

    def end(self):
        pass


@torch.no_grad()
def bench_hf(prompt_tokens: int = 128, new_tokens: int = 128, repeats: int = 3) -> dict:
    spec = load_spec(LLAMA)
    ours = _model(spec)
    hf = _hf_llama(spec, ours)
    prompt = _prompt(prompt_tokens, spec.model.vocab_size, seed=1)

    def run_ours():
        t0 = time.perf_counter()
        first, tokens = None, []
        for token in ours.stream(prompt, new_tokens, temperature=0):
            first = first if first is not None else time.perf_counter() - t0
            tokens.append(int(token))
        return time.perf_counter() - t0, first, tokens

    def run_hf():
        t0 = time.perf_counter()
        streamer = _FirstToken(t0)
        out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, use_cache=True, streamer=streamer)
        return time.perf_counter() - t0, streamer.first, out[0, prompt_tokens:].tolist()

    run_ours(), run_hf()  # warm-up
    best = {"archspec": None, "hf": None}
    for _ in range(repeats):
        for name, fn in (("archspec", run_ours), ("hf", run_hf)):
            result = fn()
            if best[name] is None or result[0] < best[name][0]:
                best[name] = result
    (t_a, ttft_a, tok_a), (t_h, ttft_h, tok_h) = best["archspec"], best["hf"]
    agree = next((i for i, (x, y) in enumerate(zip(tok_a, tok_h)) if x != y), len(tok_a))
    return {"prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "repeats": repeats,
            "archspec": {"s": t_a, "tok_s": new_tokens / t_a, "ttft_ms": 1000 * ttft_a},
            "hf": {"s": t_h, "tok_s": new_tokens / t_h, "ttft_ms": 1000 * ttft_h},
            "ratio": t_h / t_a, "tokens_agree_for": agree}


# ── 3. cache bytes ───────────────────────────────────────────────────────────────────────────────────────────────


def bench_bytes() -> list[dict]:
    base = load_spec(LLAMA)
    rows = []
    for label, kv in (("MHA", 8), ("GQA", 2), ("MQA", 1)):
        spec = _variant(base, n_kv_heads=kv)
        model = _model(spec)
        n = spec.model.context_length
        fp32 = sum(c.nbytes for c in model.new_cache(1, n))
        bf16 = sum(c.nbytes for c in model.new_cache(1, n, dtype=torch.bfloat16))
        rows.append({"layout": label, "n_kv_heads": kv, "positions": n,
                     "fp32": fp32, "fp32_accounting": kv_cache_bytes(spec.model, n, "fp32"),
                     "bf16": bf16, "bf16_accounting": kv_cache_bytes(spec.model, n, "bf16")})
    # Window layers keep a ring buffer of what their pattern reaches: every layer (mistral-like), every other layer
    # (llama-like with odd layers windowed, as GPT-3 alternates), a window plus global positions (longformer-like).
    mixed = canonical_dict(base)
    mixed["model"]["layers"] = {"banded": {"select": {"start": 1, "step": 2},
                                           "attention": {"sparsity": {"kind": "sliding_window", "window": 256}}}}
    for label, spec in (("window 256, every layer (mistral-like)", load_spec(ROOT / "specs" / "mistral-like.yaml")),
                        ("window 256, odd layers (llama-like GQA)", load_spec_dict(mixed)),
                        ("window 256 + 4 global (longformer-like, MHA)",
                         load_spec(ROOT / "specs" / "longformer-like.yaml"))):
        model = _model(spec)
        n = spec.model.context_length
        fp32 = sum(c.nbytes for c in model.new_cache(1, n))
        bf16 = sum(c.nbytes for c in model.new_cache(1, n, dtype=torch.bfloat16))
        rows.append({"layout": label, "n_kv_heads": spec.model.attention.n_kv_heads, "positions": n,
                     "fp32": fp32, "fp32_accounting": kv_cache_bytes(spec.model, n, "fp32"),
                     "bf16": bf16, "bf16_accounting": kv_cache_bytes(spec.model, n, "bf16")})
    return rows


# ── 4. speculative decoding ──────────────────────────────────────────────────────────────────────────────────────


def _trained(name: str, model: dict, steps: int, work: Path, lr: float):
    from archspec.sample import load_model
    from archspec.train.loop import train

    run_dir = work / f"{name}-{steps}-lr{lr:g}"  # per recipe: a rerun with other --train-steps or lr trains anew
    if not (run_dir / "checkpoint.pt").is_file():
        spec = load_spec_dict({"name": name, "model": model, "train": {
            "steps": steps, "batch_size": 8, "seq_len": 128, "lr": lr, "warmup_steps": 20, "eval_interval": steps,
            "compile": "none"}})
        train(spec, run_dir=run_dir, progress=True)
    return load_model(str(run_dir), device="cpu")


# Code to continue (the corpus is the Python standard library); none ends in whitespace, which a weak model continues
# with whitespace forever (and a draft then guesses every token).
SPECULATIVE_PROMPTS = ("import os\nimport sys\n\n\ndef main(argv):\n    parser = ",
                       "class Reader:\n    def __init__(self, path):\n        self.path = path\n\n    def read(self",
                       "    for name, value in sorted(items.items()):\n        if ",
                       "def _check_arg(value, name):\n    \"\"\"Raise TypeError")


def bench_speculative(work: Path, steps: int, k: int, new_tokens: int = 128, temperature: float = 0.8,
                      target_lr: float = 1e-3, draft_lr: float = 3e-3) -> dict:
    """Greedy and sampled (temperature, seed 0 per prompt), over SPECULATIVE_PROMPTS: the target alone
    (`Model.stream`) against `speculative_stream`, each prompt alone then speculative, back to back."""
    from archspec.sample import SpeculativeStats, encode_prompt, speculative_stream

    shape = {"vocab_size": 320, "context_length": 256, "norm": {"kind": "rmsnorm"}, "tie_embeddings": True}
    target = _trained("spec-target", {**shape, "d_model": 256, "n_layers": 12,
                                      "attention": {"n_heads": 4, "n_kv_heads": 2}}, steps, work, target_lr)
    draft = _trained("spec-draft", {**shape, "d_model": 128, "n_layers": 2,
                                    "attention": {"n_heads": 4, "n_kv_heads": 2}}, steps, work, draft_lr)
    list(target.model.stream(encode_prompt(target.tokenizer, "def"), 8, temperature=0))  # warm-up
    out = {"target_params": sum(p.numel() for p in target.model.parameters()),
           "draft_params": sum(p.numel() for p in draft.model.parameters()), "train_steps": steps, "k": k,
           "target_val_loss": _val_loss(target), "draft_val_loss": _val_loss(draft), "new_tokens": new_tokens,
           "prompts": len(SPECULATIVE_PROMPTS)}
    for mode, temp in (("greedy", 0.0), ("sampled", temperature)):
        t_alone = t_fast = 0.0
        stats = SpeculativeStats()
        identical, total, samples = True, 0, []
        for prompt_text in SPECULATIVE_PROMPTS:
            prompt = encode_prompt(target.tokenizer, prompt_text)
            n = min(new_tokens, 256 - prompt.size(1))
            t0 = time.perf_counter()
            gen = torch.Generator().manual_seed(0)
            alone = [int(t) for t in target.model.stream(prompt, n, temperature=temp, generator=gen)]
            t_alone += time.perf_counter() - t0
            t0 = time.perf_counter()
            gen = torch.Generator().manual_seed(0)
            fast = list(speculative_stream(target.model, draft.model, prompt, n, k=k, temperature=temp,
                                           generator=gen, stats=stats))
            t_fast += time.perf_counter() - t0
            identical &= fast == alone
            total += n
            samples.append(target.tokenizer.decode(fast[:60]))
        out[mode] = {"temperature": temp, "tokens": total, "acceptance_rate": stats.acceptance_rate,
                     "tokens_per_target_forward": total / stats.target_forwards, "alone_tok_s": total / t_alone,
                     "speculative_tok_s": total / t_fast, "speedup": t_alone / t_fast, "samples": samples,
                     # greedy must be identical; sampled draws differ (same distribution, other random stream)
                     "identical": identical}
    return out


@torch.no_grad()
def _val_loss(loaded, windows: int = 8, width: int = 128) -> float:
    """Mean next-token loss over the first windows of the corpus' last document (the same text for both models)."""
    from archspec.train.data import open_corpus

    *_, last = open_corpus(loaded.spec.train.data.corpus).documents()
    ids = loaded.tokenizer.encode_batch([last])[0][: windows * (width + 1)]
    batch = torch.tensor(ids, dtype=torch.long)[: (len(ids) // (width + 1)) * (width + 1)].view(-1, width + 1)
    _, loss = loaded.model(batch[:, :-1], batch[:, 1:])
    return float(loss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["cache", "hf", "bytes", "speculative"], action="append")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--train-steps", type=int, default=400)
    parser.add_argument("--draft-tokens", type=int, default=4)
    # The 12-layer target at the draft's 3e-3 ended 400 steps worse than the 2-layer draft (val loss 2.26 vs 1.91).
    parser.add_argument("--target-lr", type=float, default=1e-3)
    parser.add_argument("--draft-lr", type=float, default=3e-3)
    parser.add_argument("--work-dir", default=str(ROOT / ".cache" / "bench-generate"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    only = set(args.only or ["cache", "hf", "bytes", "speculative"])
    out = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": platform.processor() or
           platform.machine(), "cpus": os.cpu_count(), "threads": args.threads, "torch": torch.__version__,
           "load_average": os.getloadavg()[0]}
    if "bytes" in only:
        out["bytes"] = bench_bytes()
    if "cache" in only:
        out["cache"] = bench_cache()
    if "hf" in only:
        out["hf"] = bench_hf(repeats=args.repeats)
    if "speculative" in only:
        out["speculative"] = bench_speculative(Path(args.work_dir), args.train_steps, args.draft_tokens,
                                               target_lr=args.target_lr, draft_lr=args.draft_lr)
    out["load_average_after"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{out['date']} · {out['cpus']} CPUs, {args.threads} threads · torch {out['torch']} · "
          f"load {out['load_average']:.1f} → {out['load_average_after']:.1f}")
    if "bytes" in out:
        print("\n| layout | n_kv_heads | cache fp32 (new_cache) | accounting fp32 | cache bf16 | accounting bf16 |")
        print("|---|---|---|---|---|---|")
        for r in out["bytes"]:
            print(f"| {r['layout']} | {r['n_kv_heads']} | {r['fp32']:,} | {r['fp32_accounting']:,} | {r['bf16']:,} | "
                  f"{r['bf16_accounting']:,} |")
    if "cache" in out:
        c = out["cache"]
        print(f"\ncache vs recompute ({c['prompt_tokens']}-token prompt, {c['new_tokens']} new, greedy, same tokens: "
              f"{c['same_tokens']}): {c['cached_tok_s']:.1f} vs {c['recompute_tok_s']:.2f} tok/s = "
              f"**{c['speedup']:.1f}×** ({c['cached_s']:.2f} s vs {c['recompute_s']:.2f} s)")
    if "hf" in out:
        h = out["hf"]
        print(f"\narchspec vs HF generate ({h['prompt_tokens']}-token prompt, {h['new_tokens']} new, greedy, best of "
              f"{h['repeats']}; tokens agree for the first {h['tokens_agree_for']}):")
        print("| | tok/s | total | time to first token |\n|---|---|---|---|")
        for name in ("archspec", "hf"):
            print(f"| {name} | {h[name]['tok_s']:.1f} | {h[name]['s']:.2f} s | {h[name]['ttft_ms']:.0f} ms |")
        print(f"| ratio | **{h['ratio']:.2f}×** | | |")
    if "speculative" in out:
        s = out["speculative"]
        print(f"\nspeculative: target {s['target_params']:,} params (val loss {s['target_val_loss']:.3f}), draft "
              f"{s['draft_params']:,} (val loss {s['draft_val_loss']:.3f}), {s['train_steps']} steps each, k={s['k']}, "
              f"{s['prompts']} prompts × up to {s['new_tokens']} tokens")
        print("| decoding | acceptance | tokens per target forward | target alone tok/s | speculative tok/s | "
              "speed-up | identical to the target alone |\n|---|---|---|---|---|---|---|")
        for mode in ("greedy", "sampled"):
            r = s[mode]
            label = "greedy" if mode == "greedy" else f"sampled (T={r['temperature']})"
            same = str(r["identical"]) if mode == "greedy" else "n/a (other random draws)"
            print(f"| {label} | {100 * r['acceptance_rate']:.1f}% | {r['tokens_per_target_forward']:.2f} | "
                  f"{r['alone_tok_s']:.1f} | {r['speculative_tok_s']:.1f} | **{r['speedup']:.2f}×** | {same} |")
        for mode in ("greedy", "sampled"):
            print(f"{mode} samples: {s[mode]['samples']!r}")

if __name__ == "__main__":
    main()
