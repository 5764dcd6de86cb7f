"""How the shared loop compiles a model (`train.compile`), decided in one place: `resolve_compile`.

    mode, reason = resolve_compile(spec.train.compile, spec, torch.device("cuda"))

Modes: `none` (eager), `per_block` (each block compiled; identical blocks share one graph, so compile time does not
grow with depth, and the output head apart), `whole` (the whole model one graph, `dynamic=False`: the loop's batches
all have one shape), `cudagraphs` (whole, `mode="reduce-overhead"`: the graph replayed as CUDA graphs, launch overhead
gone; the optimizer step stays outside), `auto` (one of those, picked below by device and size from measurements).
A mode that cannot serve the run falls back, and the reason is returned: the loop prints it and records the mode
used as the run's `compile` tag. None of this is part of a run's identity (archspec.train.logger.NOT_IDENTITY).
"""

from __future__ import annotations

import math
import shutil

import torch

from archspec.accounting import account
from archspec.spec import Spec
from archspec.recipe import RecipeView

# ── what `auto` picks, and the measurements behind it ───────────────────────────────────────────────────────────
#
# CUDA (H200, torch 2.11, bf16 autocast, llama-like 26M, batch 8 × 1024, model-level step; issue 32): per-block
# 422k tokens/s, whole-model 815k, whole-model with CUDA graphs (mode="reduce-overhead") 1,234k. So on CUDA auto is
# cudagraphs where the model can be graphed, else whole. Under FSDP auto keeps per_block (torchtitan's order: each
# block compiled before fully_shard), the mode measured at 886M (53% MFU); whole under FSDP is unmeasured on a GPU.
#
# CPU: compiling pays for itself only over enough steps. Measured by bench/compile_modes.py --size cpu on the shared
# 2-core AMD EPYC (torch 2.13, fp32; docs/BENCHMARKS.md, "Compile modes", 2026-12-02, load average 4-9): compile
# seconds with a cold inductor cache, and the fastest steady step of each mode over every process of three passes
# (the load only ever slows a step down), at llama-like-tiny (0.41M, 2 layers, batch 8 × 128) and a 4-layer
# llama-like (9.44M, d_model 384, batch 4 × 256). auto predicts the run's eager seconds from its training FLOPs at the
# eager rate measured at the nearer size, and picks the mode with the least compile + training seconds.
CPU_MEASURED = {
    # params and layers of the measured spec; compile seconds per mode (cold cache); fastest step ÷ eager's fastest
    # per mode; the eager rate in training FLOP/s (exact training FLOPs per token × tokens/s at the fastest step)
    "tiny": {"params": 410_240, "n_layers": 2, "compile_s": {"per_block": 65.6, "whole": 95.4},
             "step_ratio": {"per_block": 0.128, "whole": 0.131}, "eager_flops": 9.0e9},
    "small": {"params": 9_440_640, "n_layers": 4, "compile_s": {"per_block": 71.6, "whole": 116.7},
              "step_ratio": {"per_block": 0.991, "whole": 0.81}, "eager_flops": 9.42e10},
}


def graph_refusals(spec: Spec, device_type: str) -> list[str]:
    """Why this model cannot be captured as CUDA graphs, one reason per unit that says so (empty: it can)."""
    m = spec.model
    out: list[str] = []
    for unit in m.units():
        why = unit.cuda_graph_refusal(m, device_type)
        if why and why not in out:
            out.append(why)
    return out


def has_cxx() -> bool:
    return bool(shutil.which("c++") or shutil.which("g++"))


def _cpu_auto(spec: Spec) -> tuple[str, str]:
    """The CPU rule: the least predicted compile + training seconds. Step ratios and the eager rate from the measured
    size nearer in parameters; whole-model compile seconds grow with depth (one graph holds every layer), so they
    are drawn through the two measurements by layer count, while per-block compile seconds do not (one graph per
    block class), so they are the nearer measurement's, once per distinct block configuration."""
    t, m = spec.train, spec.model
    params = account(spec).total
    near = min(CPU_MEASURED.values(), key=lambda r: abs(math.log(max(params, 1)) - math.log(max(r["params"], 1))))
    flops = account(spec, seq_len=t.seq_len).flops_train * RecipeView.of(t).tokens_per_replica_step * t.steps
    eager_s = flops / near["eager_flops"]
    compile_s = {"per_block": near["compile_s"]["per_block"] * len(m.block_groups()),
                 "whole": _whole_compile_s(m.n_layers)}
    cost = {"none": eager_s, **{k: compile_s[k] + eager_s * near["step_ratio"][k] for k in compile_s}}
    best = min(cost, key=cost.get)
    shown = ", ".join(f"{k} {cost[k]:,.0f} s" for k in ("none", "per_block", "whole"))
    return best, (f"auto on cpu: predicted compile + {t.steps} steps: {shown} (from figures measured at "
                  f"{near['params'] / 1e6:.1f}M params by bench/compile_modes.py, docs/BENCHMARKS.md)")


def _whole_compile_s(n_layers: int) -> float:
    (l0, c0), (l1, c1) = sorted((r["n_layers"], r["compile_s"]["whole"]) for r in CPU_MEASURED.values())
    per_layer = max(0.0, (c1 - c0) / (l1 - l0)) if l1 != l0 else 0.0
    return max(c0, c0 + per_layer * (n_layers - l0))


def resolve_compile(mode: str, spec: Spec, device: torch.device, *, fsdp: bool = False,
                    processes: int = 1) -> tuple[str, str]:
    """The mode this run compiles with, and why (a fallback names what refused the asked mode). `fsdp`: the model is
    sharded with FSDP2; `processes`: how many train it together."""
    if mode == "none":
        return "none", "train.compile: none"
    if device.type == "cpu" and not has_cxx():
        return "none", "no C++ compiler found: torch.compile needs one on CPU; running eager"
    asked, why = mode, f"train.compile: {mode}"
    if mode == "auto":
        if device.type == "cuda":
            mode = "per_block" if fsdp else "cudagraphs"
            why = ("auto on cuda: " + ("FSDP compiles per block, before sharding" if fsdp else
                   "H200 at 26M: cudagraphs 1,234k tok/s, whole 815k, per_block 422k (issue 32)"))
        else:
            mode, why = _cpu_auto(spec)
    if mode == "cudagraphs":
        refusals = [] if device.type == "cuda" else [f"CUDA graphs need a CUDA device (this run is on {device.type})"]
        refusals += graph_refusals(spec, device.type)
        if processes > 1:
            refusals.append(f"not measured under {processes} processes (DDP's all-reduce hooks run outside the graph)")
        if refusals:
            mode = "whole"
            asked_as = "auto: " if asked == "auto" else "train.compile: "
            why = f"{asked_as}cudagraphs refused: {'; '.join(refusals)}; using whole"
    if mode == "whole" and fsdp:  # tried on CPU (gloo, 2 processes): equal losses, 3 graphs for 2 blocks
        why += "; under FSDP compiled after fully_shard, the graph split at its hooks"
    return mode, why


def compile_whole(model: torch.nn.Module, mode: str) -> None:
    """Compile `model` in place as one graph (`nn.Module.compile`: the module and its state_dict keys stay as they
    are). Shapes are static: the loop's micro-batches are all batch_size × seq_len. cudagraphs: mode="reduce-overhead"
    (CUDA graph trees), the optimizer step outside the graph: fused AdamW is a handful of launches per step already,
    and capturing it would need capturable state and a tensor learning rate (not measured)."""
    if mode == "cudagraphs":
        model.compile(mode="reduce-overhead", dynamic=False)
    else:
        model.compile(dynamic=False)


def requested_compile(requested: bool | str | None, build, world, layout) -> tuple[str, str]:
    """The compile mode of a run and why (`resolve_compile`). `requested` (the Trainer's `compile=` argument)
    replaces train.compile (the recipe view's): True is per_block, False none (`--no-compile`)."""
    from archspec.errors import UserError, printable
    from archspec.spec.train import COMPILE_MODES
    from archspec.train.build import uses_fsdp

    if requested is None:
        wanted = build.view.compile
    elif isinstance(requested, bool):
        wanted = "per_block" if requested else "none"
    elif requested not in COMPILE_MODES:
        raise UserError(f"train.compile: expected one of {' | '.join(COMPILE_MODES)}, got "
                        f"{printable(repr(requested), 40)}")
    else:
        wanted = requested
    mode, why = resolve_compile(wanted, build.spec, world.device, fsdp=uses_fsdp(build, world), processes=world.size)
    if mode in ("whole", "cudagraphs") and not layout.trivial:
        return "per_block", (f"{mode} refused: a model split over a mesh ({layout.describe()}) compiles per "
                             f"block (whole-model graphs across tp/ep are not built); per_block")
    return mode, why
