"""MoE training-step cost: archspec's MoE against a dense model of the same active parameters, its own dispatch
candidates, and HF transformers' MixtralForCausalLM with every experts implementation it offers.

    .venv/bin/python bench/bench_moe.py                 # a table on stdout (eager, fp32, this CPU)
    .venv/bin/python bench/bench_moe.py --json          # the same as one JSON object
    .venv/bin/python bench/bench_moe.py --compile       # archspec MoE vs dense, both compiled per block (as the loop)
    python bench/bench_moe.py --device cuda --size gpu  # a GPU: bf16 autocast on every side, d1024 × 8 layers

Shapes (issue 13, `--size cpu`): d_model 256, 2 layers, 4 heads of 64 (2 K/V heads), RoPE θ 1e6, RMSNorm, untied
head, vocab 320, batch 8 × 256 tokens. MoE: 8 SwiGLU experts of hidden 512, top-2, renormalised, dropless, α = 0.02
(the auxiliary loss is part of the step on both sides). Dense-active: SwiGLU hidden 1024 (= 2 experts' hidden), all
else equal. `--size gpu`: d_model 1024, 8 layers, 16 heads of 64 (4 K/V heads), vocab 32768, experts of hidden
1024 (dense-active 2048), batch 8 × 1024 (`--size smoke`: tiny dims, that the script runs). One step = forward, backward, AdamW step, zero_grad; fp32 on CPU, bf16
autocast (fp32 weights) on CUDA.

Variants of archspec's MoE dispatch (same module; routing, gates, scatter-back and losses shared): `generated`
(the generated code: sorted rows through F.grouped_mm, on CPU via archspec's op wrapper so it compiles; each
expert's count on the device), `bincount` (the same file with the dispatch as it was before issue 48: the counts by
torch.bincount, whose length torch reads on the host), `padded` (the fallback: one batched matmul per projection
over a buffer padded to the busiest expert), `segment` (split the sorted rows per expert and loop over the experts:
E matmuls), and two anchors: `all-experts` (every expert on every sorted row, then each row's own picked) and
`per-token` (the tests' naive reference: a Python loop over assignments). The candidates replace the experts'
forward (`Experts.forward(xs, counts)`: rows sorted by expert → their outputs and the padding factor). HF: MixtralForCausalLM with each `experts_implementation`, its default named, and HF's dense model of
the same active FFN (MistralForCausalLM, intermediate = 2 experts' hidden) as the anchor that bounds what any MoE
of these dims can reach.

Protocol: every variant is built once, warmed by one step, then the variants take turns (`--rounds` rounds of
`--steps` timed steps each, each round starting one variant later) and each reports its median step. Interleaving
spreads load from other work evenly. The JSON (and the table's heading) carries the load average at the start and
the end: on a shared machine read the ratios, and compare only figures of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import types
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from archspec.accounting import account  # noqa: E402
from archspec.codegen import generate  # noqa: E402
from archspec.spec import load_spec_dict  # noqa: E402

SIZES = {"cpu": dict(D=256, LAYERS=2, HEADS=4, KV=2, VOCAB=320, E=8, K=2, H=512, BATCH=8, T=256),
         "gpu": dict(D=1024, LAYERS=8, HEADS=16, KV=4, VOCAB=32768, E=8, K=2, H=1024, BATCH=8, T=1024),
         # bench/gpu_check.py --smoke: that the script runs, in seconds; its figures mean nothing
         "smoke": dict(D=32, LAYERS=1, HEADS=2, KV=1, VOCAB=64, E=4, K=2, H=32, BATCH=2, T=16)}
D, LAYERS, HEADS, KV, VOCAB, E, K, H, BATCH, T = SIZES["cpu"].values()
DEVICE = "cpu"


def set_size(name: str) -> None:
    global D, LAYERS, HEADS, KV, VOCAB, E, K, H, BATCH, T, MOE, DENSE
    D, LAYERS, HEADS, KV, VOCAB, E, K, H, BATCH, T = SIZES[name].values()
    MOE = {**MOE, "n_experts": E, "top_k": K, "expert": {"kind": "glu", "hidden_dim": H}}
    DENSE = {"kind": "glu", "hidden_dim": K * H}


def spec_dict(ffn: dict, variant: str = "") -> dict:
    # The name is in the generated text, so each variant imports its own module (generated modules are cached by
    # content): patching one variant's module must not change another's path.
    return {"name": f"bench-moe-{variant}" if variant else "bench-moe", "model": {
        "vocab_size": VOCAB, "context_length": T, "d_model": D, "n_layers": LAYERS, "tie_embeddings": False,
        "norm": {"kind": "rmsnorm", "eps": 1e-5},
        "attention": {"n_heads": HEADS, "n_kv_heads": KV, "positional": {"kind": "rope", "theta": 1e6}},
        "ffn": ffn}}


MOE = {"kind": "moe", "n_experts": E, "top_k": K, "expert": {"kind": "glu", "hidden_dim": H},
       "aux_loss_coef": 0.02}
DENSE = {"kind": "glu", "hidden_dim": K * H}
DENSE_NAME, OURS = "archspec dense-active", "archspec MoE (generated: grouped_mm)"
BEFORE = "archspec MoE, issue 48's before: counts by bincount"


# ── dispatch candidates: drop-in replacements of Experts.forward (dropless, SwiGLU, no bias) ─────────────────────


def _expert_of(counts, rows: int):
    return torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts, output_size=rows)


def _segment(self, xs, counts):
    outs = [(F.silu(xe @ g.T) * (xe @ u.T)) @ d.T
            for xe, g, u, d in zip(xs.split(counts.tolist()), self.gate_proj.unbind(0), self.up_proj.unbind(0),
                                   self.down_proj.unbind(0))]
    return torch.cat(outs), torch.ones((), device=xs.device)


def _all_experts(self, xs, counts):
    h = F.silu(torch.einsum("md,ehd->emh", xs, self.gate_proj)) * torch.einsum("md,ehd->emh", xs, self.up_proj)
    y = torch.einsum("emh,edh->emd", h, self.down_proj)  # (E, M, D): every expert on every sorted row
    rows = xs.shape[0]
    return y[_expert_of(counts, rows), torch.arange(rows, device=xs.device)], torch.full((), float(E), device=xs.device)


def _per_token(self, xs, counts):
    rows = [(F.silu(self.gate_proj[e] @ x) * (self.up_proj[e] @ x)) @ self.down_proj[e].T
            for x, e in zip(xs, _expert_of(counts, xs.shape[0]).tolist())]
    return torch.stack(rows), torch.ones((), device=xs.device)


CANDIDATES = {"generated": None, "bincount": None, "padded": None, "segment": _segment, "all-experts": _all_experts,
              "per-token": _per_token}  # `padded` forces the padded path; the last three replace Experts.forward
COUNTS_LINE = "scatter_add_(0, flat_e, torch.ones_like(flat_e))"  # the generated dispatch's device-side count


def _bincount_module(gen):
    """The generated module with its dispatch as before issue 48: each expert's count by torch.bincount."""
    from archspec.codegen import import_source

    line = next(ln for ln in gen.source.splitlines() if COUNTS_LINE in ln)
    return import_source(gen.path.with_name(gen.path.stem + "-bincount.py"), gen.source.replace(
        line, "        counts = torch.bincount(flat_e, minlength=MOE_N_EXPERTS)  # (MOE_N_EXPERTS,)"))


# ── the steps ────────────────────────────────────────────────────────────────────────────────────────────────────


def archspec_step(ffn: dict, dispatch: str | None = None, compile_blocks: bool = False):
    spec = load_spec_dict(spec_dict(ffn, f"{dispatch or 'dense'}{'-compiled' if compile_blocks else ''}"))
    torch.manual_seed(0)
    gen = generate(spec, write=False)
    module = _bincount_module(gen) if dispatch == "bincount" else gen.module
    if dispatch == "padded":
        module.grouped_mm_usable = lambda device, dtype: False  # this module's forward takes its padded path
    model = module.Model().to(DEVICE)
    if dispatch and CANDIDATES[dispatch] is not None:
        for block in model.blocks:
            block.ffn.experts.forward = types.MethodType(CANDIDATES[dispatch], block.ffn.experts)
    if compile_blocks:
        for block in model.blocks:
            block.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=DEVICE == "cuda")

    def step(idx, targets):
        with torch.autocast("cuda", torch.bfloat16, enabled=DEVICE == "cuda"):
            _, loss = model(idx, targets)
            aux = model.auxiliary_losses() if hasattr(model, "auxiliary_losses") else {}
        (loss + sum(aux.values())).backward() if aux else loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step, account(spec, seq_len=T)


def hf_step(implementation: str):
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(vocab_size=VOCAB, hidden_size=D, intermediate_size=H, num_hidden_layers=LAYERS,
                        num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=D // HEADS,
                        max_position_embeddings=T, rope_theta=1e6, num_local_experts=E, num_experts_per_tok=K,
                        router_aux_loss_coef=0.02, output_router_logits=True, tie_word_embeddings=False,
                        rms_norm_eps=1e-5, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = MixtralForCausalLM(cfg).to(DEVICE)
    model.set_experts_implementation(implementation)
    return _hf_train_step(model)


def hf_dense_step():
    """HF's dense model of the same active FFN (Mistral = Mixtral without experts): the anchor HF's MoE is bounded by."""
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=D, intermediate_size=K * H, num_hidden_layers=LAYERS,
                        num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=D // HEADS,
                        max_position_embeddings=T, rope_theta=1e6, tie_word_embeddings=False, rms_norm_eps=1e-5,
                        sliding_window=None, attn_implementation="sdpa")
    torch.manual_seed(0)
    return _hf_train_step(MistralForCausalLM(cfg).to(DEVICE))


def _hf_train_step(model):
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=DEVICE == "cuda")

    def step(idx, targets):
        with torch.autocast("cuda", torch.bfloat16, enabled=DEVICE == "cuda"):
            out = model(input_ids=idx, labels=targets)  # Mixtral: the loss includes router_aux_loss_coef · aux
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss

    return step


def main(argv=None) -> int:
    global DEVICE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per variant per round")
    ap.add_argument("--compile", action="store_true", help="archspec MoE vs dense only, both compiled per block")
    ap.add_argument("--skip-before", action="store_true", help="without the bincount (before issue 48) variant")
    ap.add_argument("--padded-only", action="store_true", help="eager: of the other dispatch candidates, padded only")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--size", default=None, choices=list(SIZES), help="dims [default: the device's]")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--per-token", action="store_true", help="also the per-token loop anchor (minutes per step)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    DEVICE = args.device
    set_size(args.size or args.device)
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_moe: --device cuda but no CUDA device here")

    load_start = os.getloadavg()  # the machine may be shared: the load beside each figure
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, VOCAB, (BATCH, T), generator=g).to(DEVICE)
    targets = torch.randint(0, VOCAB, (BATCH, T), generator=g).to(DEVICE)

    variants: dict[str, object] = {}
    notes: dict[str, str] = {}
    dense_step, dense_acc = archspec_step(DENSE, compile_blocks=args.compile)
    moe_step, moe_acc = archspec_step(MOE, "generated", compile_blocks=args.compile)
    variants[DENSE_NAME] = dense_step
    variants[OURS] = moe_step
    if not args.skip_before:
        variants[BEFORE + (" (compiled)" if args.compile else "")] = archspec_step(MOE, "bincount",
                                                                               compile_blocks=args.compile)[0]
    if args.compile:
        variants["archspec MoE dispatch: padded (compiled)"] = archspec_step(MOE, "padded", compile_blocks=True)[0]
    else:
        names = ["padded"] + ([] if args.padded_only else ["segment"] + (["all-experts"] if DEVICE == "cpu" else [])
                              + (["per-token"] if args.per_token else []))
        for name in names:
            variants[f"archspec MoE dispatch: {name}"] = archspec_step(MOE, name)[0]
    if not args.skip_hf:
        from transformers import MixtralConfig, MixtralForCausalLM

        try:
            from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
            impls = ["eager", *ALL_EXPERTS_FUNCTIONS.keys()]
        except ImportError as e:
            impls, notes["HF experts implementations"] = ["eager"], f"only eager: {e}"
        for impl in impls:
            try:
                step = hf_step(impl)
                step(idx[:1, :16], targets[:1, :16])
                variants[f"HF Mixtral experts_implementation={impl}"] = step
            except Exception as e:  # noqa: BLE001 (reported: e.g. CUDA-only kernels)
                notes[f"HF Mixtral experts_implementation={impl}"] = f"unavailable: {type(e).__name__}: " \
                                                                     f"{str(e).splitlines()[0][:120]}"
        variants["HF Mistral dense-active (anchor)"] = hf_dense_step()
        # HF's default when none is requested
        default = MixtralForCausalLM(MixtralConfig(vocab_size=VOCAB, hidden_size=D, intermediate_size=H,
                                                   num_hidden_layers=1, num_attention_heads=HEADS,
                                                   num_key_value_heads=KV, num_local_experts=E))
        notes["HF default experts_implementation"] = str(getattr(default.config, "_experts_implementation", "?"))

    def timed(step) -> float:
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(idx, targets)
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {name: [] for name in variants}
    warm_s: dict[str, float] = {}
    for name, step in list(variants.items()):
        try:
            warm_s[name] = timed(step)  # warm-up (and compile)
            if DEVICE == "cuda":
                timed(step)  # a second warm-up: autotuning, allocator
        except (RuntimeError, MemoryError) as e:  # e.g. HF batched_mm's (B·T·K, 2H, D) weight gather: out of memory
            if name in (DENSE_NAME, OURS):
                raise
            notes[name] = f"failed at full batch: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            del variants[name], times[name]
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
            continue
        print(f"warm {name}: {warm_s[name]:.1f} s", file=sys.stderr, flush=True)
    names = list(variants)
    for r in range(args.rounds):
        # each round starts one variant later: none always runs right after the same neighbour
        for name in names[r % len(names):] + names[:r % len(names)]:
            step = variants[name]
            n = 1 if warm_s[name] > 5 * max(warm_s[OURS], 1e-3) and not args.compile else args.steps  # slow anchors
            for _ in range(n):
                times[name].append(timed(step))
            print(f"{name}: {times[name][-1]:.2f} s", file=sys.stderr, flush=True)

    median = {name: statistics.median(ts) for name, ts in times.items()}
    dense, ours = median[DENSE_NAME], median[OURS]
    machine = torch.cuda.get_device_name() if DEVICE == "cuda" else \
        f"{platform.machine()}, {torch.get_num_threads()} torch threads"
    result = {
        "machine": f"{machine}, torch {torch.__version__}", "device": DEVICE,
        "precision": "bf16 autocast" if DEVICE == "cuda" else "fp32",
        "dims": SIZES[args.size or args.device],
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "compile": args.compile,
        "load_average_1_5_15": {"start": [round(v, 2) for v in load_start],
                                "end": [round(v, 2) for v in os.getloadavg()]},
        "params": {"moe_total": moe_acc.total, "moe_active": moe_acc.active, "dense_total": dense_acc.total},
        "median_step_s": median, "warmup_s": warm_s, "notes": notes,
        "ratio_to_dense": {n: m / dense for n, m in median.items()},
        "speedup_of_archspec_moe": {n: m / ours for n, m in median.items()},
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{result['machine']} · {result['date']} · {'compiled per block' if args.compile else 'eager'} · {result['precision']} · "
          f"batch {BATCH}×{T} · load average {load_start[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    print(f"MoE {moe_acc.total:,} params ({moe_acc.active:,} active) · dense-active {dense_acc.total:,}")
    print(f"| variant | median step | ÷ dense-active | archspec MoE faster by |")
    print("|---|---|---|---|")
    for name, m in median.items():
        print(f"| {name} | {m * 1000:.0f} ms | {m / dense:.2f}× | {m / ours:.2f}× |")
    for name, note in notes.items():
        print(f"- {name}: {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
