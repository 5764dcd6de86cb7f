"""Mixture of experts (Shazeer et al., 2017; Switch, GShard, Mixtral, DeepSeek-MoE, Qwen2-MoE).

Each token's FFN output is the gate-weighted sum of its top-k routed experts (dense `mlp` or `glu` FFNs of their own
hidden size), plus always-on shared experts. Semantics (the generated module implements exactly these):

- Router: logits = x · W_router (fp32, no bias) → p = softmax over all experts → the top_k experts S → gate
  g_i = p_i / Σ_{j∈S} p_j (`renormalize: true`) or g_i = p_i (`renormalize: false`, Qwen2-MoE's
  `norm_topk_prob: false`). The top-k choice is a constant in backward; the router learns through the gates.
- Routing variants (DeepSeek-V3; transformers' DeepseekV3TopkRouter computes exactly these): `score: sigmoid` takes
  s = sigmoid(logits) per expert instead of the softmax (gates s_i / (Σ_{j∈S} s_j + 1e-20) renormalised, s_i raw);
  the balancing loss and the entropy are then over the normalised scores s / Σ_j s. `selection_bias: true` adds a
  per-expert bias b (a persistent buffer: in the checkpoint and in HF's files as e_score_correction_bias) to the
  scores for the choice only: S = top_k of s + b, the gates use s. `n_group` / `topk_group`: the experts split into
  n_group groups of n_experts / n_group; a group's score is the sum of its top two (biased) scores (of its one
  score for groups of one); the top_k experts are chosen within the best topk_group groups (null: all).
  `routed_scaling_factor` multiplies the routed gates (after renormalising).
- Bias balancing (auxiliary-loss-free, Wang et al. 2024): with `bias_update_rate` r > 0, after each optimizer step
  b += r · sign(mean_i load_i − load_i), load_i the assignments chosen for expert i (before any capacity drop: what
  the bias steers) summed over every training forward of the step (each micro-batch; `Model.after_micro_batch`, which
  the loop calls after each training forward, never after evaluation) and over every data-parallel rank
  (`Model.after_optimizer_step(all_sum)`: one all-reduce of int64 counts), so 2 processes update exactly as 1. It
  works beside a capacity factor (the loads are the router's choices, before drops, so that equivalence holds for
  the bias even where the drops themselves depend on the micro-batch), and beside the balancing loss (both steer).
- Capacity: `capacity_factor: null` is dropless. Otherwise each expert takes at most
  C = ceil(capacity_factor · N · top_k / n_experts) assignments, where N is the number of tokens *of that forward
  call on that process* (B · T of the micro-batch): with a limit, the output depends on the micro-batch, so the
  "2 processes = 1 process" equivalence holds for dropless MoE only. `drop_policy` picks which overflowing
  assignments an expert drops: `position` (default) keeps the first C in (position in the sequence, batch row,
  choice) order, so a token only competes with tokens at or before its position and the model stays causal;
  `probs` keeps the C with the highest router probability p_i (ties: that same order), which lets a later token evict an
  earlier one: the model is then NOT causal in training (`causal` is false, and the causality property is not
  claimed for it). A dropped assignment contributes zero (the residual still carries the token).
- Losses, per MoE layer, averaged over the MoE layers by `Model.auxiliary_losses()` (the training loop adds them):
  load balancing α · n · Σ_i f_i · P_i (f_i: fraction of routed assignments, before drops, that go to expert i;
  P_i: mean router probability of i; α = `aux_loss_coef`), and z-loss `z_loss_coef` · mean(logsumexp(logits)²).
- gpt-oss (OpenAI, 2025; transformers' GptOssMLP): `router_bias: true` adds a learned bias to the router's logits
  (softmax over all experts, top-k, renormalised: the softmax over the chosen logits, as gpt-oss computes it);
  `clamped_swiglu: {limit, alpha}` makes each routed expert's gated unit gpt-oss's: gate ← min(gate, limit),
  up ← clamp(up, −limit, limit), h = (up + 1) · gate · sigmoid(alpha · gate) (needs glu experts with silu, whose
  biases `expert.bias` gpt-oss has too). transformers stores gate and up interleaved in one (E, D, 2·hidden)
  gate_up_proj; archspec keeps them apart (gate_proj, up_proj, each (E, hidden, D)): the HF mapping interleaves.
- Shared experts: `n_shared_experts` always-on experts, stored as one dense FFN of the expert's kind with hidden
  `shared_hidden_dim` (default n_shared_experts · expert.hidden_dim, DeepSeek-MoE); `shared_gate: true` scales its
  output by sigmoid(x · w) (Qwen2-MoE's `shared_expert_gate`).

Past one process (archspec.train.expert_parallel, applied from outside the generated layer: hooks on its `experts`
and `losses` submodules and at its boundary): the balancing loss, z-loss and load statistics are over the whole global batch (the router's sums all-reduced
over the data-parallel processes, differentiably), so N processes give one process's losses. `train.parallel.ep`
spreads the routed experts over processes (dropless grouped path only; ep divides n_experts); `train.parallel.tp`
splits every expert's hidden units (and the shared experts'), the router computed whole on each tp process
(`parallel_problems` holds the rules).

Accounting: routed experts count top_k / n_experts of their total in `active`; router and shared experts in full.
FLOPs per token: top_k experts + the router + shared experts (+ the shared gate): the useful work. Padding is NOT
counted. Dropless MoE (sizes multiples of 8; CPU fp32/bf16, CUDA bf16 on Hopper) computes no padding: the sorted
rows go through F.grouped_mm, and nothing in that dispatch reads a tensor on the host (each expert's count and
offset stay on the device; a capacity comes from the token count). With a capacity factor (or where grouped GEMM is
unavailable) the experts run as one batched matmul over a buffer padded to the capacity C (dropless: the busiest
expert's count, read on the host), which multiplies the experts' work by n_experts · C / (N · top_k) (≥ 1, reported
as the `padding` router statistic; equal to capacity_factor when a limit is set and the buffer is full; 1 on the
grouped path).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import Field

from archspec.kinds.base import (Const, FFNKind, Problem, Since, Split, Strict, TPPlan, kind_union, lit_bool, lit_float,
                                 lit_int, register)
from archspec.kinds.ffn import activations
from archspec.kinds.ffn.activations import GLU_NAMES, MLP_NAMES, call
from archspec.kinds.ffn.glu import GLUSpec
from archspec.kinds.ffn.mlp import MLPSpec
from archspec.kinds.hf import HFUnsupported, HFWeight, put_fact
from archspec.kinds.limits import MAX_HIDDEN

MAX_EXPERTS = 1024

Expert = kind_union(MLPSpec, GLUSpec, default="glu")


class ClampedSwiGLU(Strict):
    """gpt-oss's expert unit: gate ← min(gate, limit), up ← clamp(up, −limit, limit),
    h = (up + 1) · gate · sigmoid(alpha · gate) (transformers' GptOssExperts._apply_gate)."""

    limit: float = Field(7.0, gt=0.0, le=1e4, description="the clamp: gate from above, up on both sides")
    alpha: float = Field(1.702, gt=0.0, le=100.0, description="the sigmoid's gain (1.702: GELU's sigmoid "
                         "approximation)")


@register
class MoESpec(FFNKind):
    kind: Literal["moe"] = "moe"  # router → top-k of n experts (+ shared experts)
    prefix = "MoE"
    n_experts: int = Field(8, ge=2, le=MAX_EXPERTS, description="routed experts")
    top_k: int = Field(2, ge=1, le=MAX_EXPERTS, description="experts per token, at most n_experts")
    expert: Expert = Field(default_factory=GLUSpec, description="one expert: a dense FFN (mlp or glu)")
    n_shared_experts: int = Field(0, ge=0, le=MAX_EXPERTS, description="always-on experts (DeepSeek-MoE)")
    shared_hidden_dim: int | None = Field(
        None, ge=1, le=MAX_HIDDEN, description="hidden size of the shared experts together; default "
        "n_shared_experts · expert.hidden_dim")
    shared_gate: bool = Field(False, description="scale the shared experts by sigmoid(x · w) (Qwen2-MoE)")
    renormalize: bool = Field(True, description="gates renormalised over the chosen experts (false: raw p_i)")
    capacity_factor: float | None = Field(
        None, gt=0, le=1024.0, description="null: dropless; else each expert takes at most "
        "ceil(factor · tokens · top_k / n_experts) assignments per forward call")
    drop_policy: Literal["position", "probs"] = Field(
        "position", description="which overflowing assignments an expert drops: the latest positions (causal), or "
        "the lowest router probabilities (not causal)")
    aux_loss_coef: float = Field(0.01, ge=0.0, le=100.0, description="load-balancing loss α")
    z_loss_coef: float = Field(0.0, ge=0.0, le=100.0, description="router z-loss coefficient")
    # Routing variants (DeepSeek-V3): added after hashes were in use, so at their defaults they leave every existing
    # model hash and run id as it was (Since).
    score: Annotated[Literal["softmax", "sigmoid"], Since("0.4")] = Field(
        "softmax", description="router scores: softmax over the experts, or each expert's sigmoid (DeepSeek-V3)")
    selection_bias: Annotated[bool, Since("0.4")] = Field(
        False, description="a per-expert bias (a persistent buffer) added to the scores for the top-k choice only; "
        "gates use the unbiased scores (DeepSeek-V3's e_score_correction_bias)")
    bias_update_rate: Annotated[float, Since("0.4")] = Field(
        0.0, ge=0.0, le=1.0, description="auxiliary-loss-free balancing: after each optimizer step, bias += rate · "
        "sign(mean load − each expert's load), loads summed over the step's micro-batches and data-parallel ranks; "
        "0: the bias stays as it is (needs selection_bias)")
    n_group: Annotated[int, Since("0.4")] = Field(
        1, ge=1, le=MAX_EXPERTS, description="group-limited routing: the experts split into n_group equal groups")
    topk_group: Annotated[int | None, Since("0.4")] = Field(
        None, ge=1, le=MAX_EXPERTS, description="groups kept per token (a group's score: the sum of its top two "
        "biased scores); top_k is chosen within them; null: every group")
    routed_scaling_factor: Annotated[float, Since("0.4")] = Field(
        1.0, gt=0.0, le=1000.0, description="multiplies the routed experts' gates (DeepSeek-V3: 2.5)")
    # gpt-oss (Since: off, every existing model hash and state_dict key stays as it was)
    router_bias: Annotated[bool, Since("0.6")] = Field(
        False, description="a learned bias on the router's logits (gpt-oss)")
    clamped_swiglu: Annotated[ClampedSwiGLU | None, Since("0.6")] = Field(
        None, description="gpt-oss's clamped SwiGLU in the routed experts: h = (clamp(up, ±limit) + 1) · g · "
        "sigmoid(alpha · g), g = min(gate, limit); needs expert.kind glu with activation silu")

    # ── spec ─────────────────────────────────────────────────────────────────────────────────────────────────────

    def fill_defaults(self, m) -> None:
        self.expert.fill_defaults(m)
        if self.shared_hidden_dim is None and self.n_shared_experts > 0:
            object.__setattr__(self, "shared_hidden_dim",
                               min(MAX_HIDDEN, self.n_shared_experts * self.expert.hidden_dim))

    def problems(self, m, path: tuple[str, ...]) -> list[Problem]:
        out: list[Problem] = []
        if self.top_k > self.n_experts:
            out.append((path + ("top_k",), f"must be at most n_experts ({self.n_experts}), got {self.top_k}",
                        self.top_k))
        if self.n_shared_experts == 0:
            if self.shared_hidden_dim is not None:
                out.append((path + ("shared_hidden_dim",), "needs n_shared_experts >= 1 (there is no shared expert "
                            f"to size), got {self.shared_hidden_dim}", self.shared_hidden_dim))
            if self.shared_gate:
                out.append((path + ("shared_gate",), "needs n_shared_experts >= 1 (there is no shared expert to "
                            "gate)", self.shared_gate))
        if self.clamped_swiglu is not None and (self.expert.kind != "glu" or self.expert.activation != "silu"):
            what = (f"expert.kind {self.expert.kind!r}" if self.expert.kind != "glu"
                    else f"expert.activation {self.expert.activation!r}")
            out.append((path + ("clamped_swiglu",), f"needs glu experts with activation silu (it replaces their "
                        f"SwiGLU), got {what}", self.clamped_swiglu.model_dump()))
        if self.bias_update_rate > 0 and not self.selection_bias:
            out.append((path + ("bias_update_rate",), "needs selection_bias: true (the bias it updates), got "
                        f"{self.bias_update_rate}", self.bias_update_rate))
        if self.n_experts % self.n_group:
            out.append((path + ("n_group",), f"must divide n_experts ({self.n_experts}), got {self.n_group}",
                        self.n_group))
        elif self.topk_group is not None:
            if self.topk_group > self.n_group:
                out.append((path + ("topk_group",), f"must be at most n_group ({self.n_group}), got "
                            f"{self.topk_group}", self.topk_group))
            elif self.top_k > self.topk_group * (self.n_experts // self.n_group):
                reach = self.topk_group * (self.n_experts // self.n_group)
                out.append((path + ("top_k",), f"must be at most topk_group · n_experts / n_group ({reach}: the "
                            f"experts of the {self.topk_group} kept group(s)), got {self.top_k}", self.top_k))
        return out

    def tensor_parallel(self, m):
        """The layer is handed whole to archspec.train.expert_parallel.apply_moe_parallel, which splits every
        expert's hidden units over tp and takes and returns the sequence shard itself; what tp must divide is
        `parallel_problems`'s rule."""
        return TPPlan({"": Split("delegate", fn="archspec.train.expert_parallel:apply_moe_parallel")})

    def parallel_problems(self, m, parallel, path: tuple[str, ...]) -> list[Problem]:
        """How `train.parallel` (ep, tp) can split this MoE layer (archspec.train.expert_parallel): ep must divide
        the experts, and expert parallelism takes the dropless grouped path only; tp splits every expert's (and
        the shared experts') hidden units, so it must divide them (into multiples of 8 for the grouped GEMM), and
        ep with tp together is not built yet."""
        out: list[Problem] = []
        where = ".".join(path)
        ep, tp = parallel.ep, parallel.tp
        if ep > 1:
            if self.n_experts % ep:
                fits = [d for d in range(1, self.n_experts + 1) if self.n_experts % d == 0 and d <= ep][-1]
                out.append((("train", "parallel", "ep"), f"must divide {where}.n_experts ({self.n_experts}), got "
                            f"{ep}: each process holds n_experts / ep experts; e.g. ep {fits}, or n_experts "
                            f"{math.ceil(self.n_experts / ep) * ep}", ep))
            if self.capacity_factor is not None:
                out.append((path + ("capacity_factor",), f"expert parallelism (train.parallel.ep {ep}) needs dropless "
                            "routing: a capacity counts the tokens of one process's forward call, which under ep no "
                            "longer meets the experts it limits; set capacity_factor: null, or ep: 1",
                            self.capacity_factor))
            elif not self.grouped(m):
                out.append((("train", "parallel", "ep"), f"expert parallelism runs {where}'s experts through the "
                            f"grouped GEMM, which needs model.d_model ({m.d_model}) and {where}.expert.hidden_dim "
                            f"({self.expert.hidden_dim}) to be multiples of 8; make them so, or set ep: 1", ep))
        if tp > 1:
            if ep > 1:
                out.append((("train", "parallel", "ep"), f"expert parallelism together with tensor parallelism (tp "
                            f"{tp}) is not built yet; set ep: 1 ({where} is then split by hidden over tp) or tp: 1",
                            ep))
            if self.expert.bias:
                out.append((path + ("expert", "bias"), f"tensor parallelism (train.parallel.tp {tp}) splits {where}'s "
                            "experts by hidden, and their output biases would be added once per process; set bias: "
                            "false, or tp: 1", self.expert.bias))
            for field, hidden in (("expert.hidden_dim", self.expert.hidden_dim),
                                  ("shared_hidden_dim", self.shared_hidden_dim if self.n_shared_experts else None)):
                if hidden is None:
                    continue
                step = 8 * tp if field == "expert.hidden_dim" and self.grouped(m) else tp
                if hidden % step:
                    why = (f" (the grouped GEMM needs each process's {hidden // tp if hidden % tp == 0 else 'slice'} "
                           "hidden units to be a multiple of 8)" if step != tp else "")
                    out.append((("train", "parallel", "tp"), f"must divide {where}.{field} ({hidden}) into slices "
                                f"of a multiple of {step // tp}{why}, got {tp}; e.g. {where}.{field} "
                                f"{math.ceil(hidden / step) * step}", tp))
        return out

    @property
    def group_limited(self) -> bool:
        """Whether the choice is limited to the best topk_group of n_group groups (not all of them)."""
        return self.topk_group is not None and self.topk_group < self.n_group

    @property
    def plain_router(self) -> bool:
        """The router of the first MoE kinds: softmax, no selection bias, no groups (its template code unchanged)."""
        return self.score == "softmax" and not self.selection_bias and not self.group_limited

    @property
    def causal(self) -> bool:
        return self.capacity_factor is None or self.drop_policy == "position"

    # ── accounting ───────────────────────────────────────────────────────────────────────────────────────────────

    def _shared(self) -> MLPSpec | GLUSpec | None:
        if not self.n_shared_experts:
            return None
        return self.expert.model_copy(update={"hidden_dim": self.shared_hidden_dim})

    def _always_on_params(self, d_model: int) -> int:
        shared = self._shared()
        return (d_model * self.n_experts  # router
                + (self.n_experts if self.router_bias else 0)
                + (shared.params(d_model) if shared else 0)
                + (d_model if self.shared_gate else 0))

    def params(self, d_model: int) -> int:
        return self._always_on_params(d_model) + self.n_experts * self.expert.params(d_model)

    def active_params(self, d_model: int) -> int:
        return self._always_on_params(d_model) + self.top_k * self.expert.params(d_model)

    def routed_params(self, d_model: int) -> int:
        return self.n_experts * self.expert.params(d_model)

    def flops(self, d_model: int) -> int:
        """Useful work per token: the router, top_k experts, the shared experts and their gate (no padding)."""
        shared = self._shared()
        return (2 * d_model * self.n_experts + self.top_k * self.expert.flops(d_model)
                + (shared.flops(d_model) if shared else 0) + (2 * d_model if self.shared_gate else 0))

    def saved_elements(self, d_model: int) -> int:
        """Per token, counted from the template: for each of its top_k assignments the expert's own tensors plus
        its gathered input row and output row (times the capacity factor: the padded buffer's rows), the router's
        fp32 input and its logits/probabilities, and the shared experts' tensors."""
        per_assignment = self.expert.saved_elements(d_model) + 2 * d_model
        padded = math.ceil(self.top_k * per_assignment * max(1.0, self.capacity_factor or 1.0))
        shared = self._shared()
        return (padded + d_model + 3 * self.n_experts + (shared.saved_elements(d_model) + d_model if shared else 0)
                + (d_model if self.shared_gate else 0))

    # ── codegen ──────────────────────────────────────────────────────────────────────────────────────────────────

    def constants(self, m) -> list[Const]:
        e = self.expert
        out = [
            Const("MOE_N_EXPERTS", lit_int(self.n_experts), "routed experts"),
            Const("MOE_TOP_K", lit_int(self.top_k), "experts per token"),
            Const("MOE_HIDDEN", lit_int(e.hidden_dim), f"each expert's hidden size ({e.hidden_dim / m.d_model:.3g} "
                  "× D_MODEL)"),
        ]
        if self.n_shared_experts:
            out.append(Const("MOE_SHARED_HIDDEN", lit_int(self.shared_hidden_dim),
                             f"{self.n_shared_experts} shared expert(s), always on"))
        if self.capacity_factor is not None:
            out.append(Const("MOE_CAPACITY_FACTOR", lit_float(self.capacity_factor),
                             "capacity = ceil(factor · tokens · top_k / n_experts) per forward call"))
        if self.group_limited:
            out += [Const("MOE_N_GROUP", lit_int(self.n_group), "expert groups (MOE_N_EXPERTS // MOE_N_GROUP each)"),
                    Const("MOE_TOPK_GROUP", lit_int(self.topk_group), "groups a token's experts are chosen within")]
        if self.clamped_swiglu is not None:
            out += [Const("MOE_SWIGLU_LIMIT", lit_float(self.clamped_swiglu.limit), "gpt-oss: gate clamped from "
                          "above, up on both sides"),
                    Const("MOE_SWIGLU_ALPHA", lit_float(self.clamped_swiglu.alpha), "gpt-oss: gate · sigmoid(alpha "
                          "· gate)")]
        if self.routed_scaling_factor != 1.0:
            out.append(Const("MOE_ROUTED_SCALING", lit_float(self.routed_scaling_factor), "multiplies the routed gates"))
        if self.bias_update_rate > 0:
            out.append(Const("MOE_BIAS_UPDATE_RATE", lit_float(self.bias_update_rate),
                             "selection bias step after each optimizer step: rate · sign(mean load − load)"))
        out += [Const("MOE_AUX_LOSS_COEF", lit_float(self.aux_loss_coef), "load-balancing loss α"),
                Const("MOE_Z_LOSS_COEF", lit_float(self.z_loss_coef), "router z-loss")]
        return out

    def grouped(self, m) -> bool:
        """Whether the dispatch can take the grouped GEMM (F.grouped_mm): dropless, and sizes that are multiples
        of 8 (its 16-byte stride alignment, for fp32 and bf16). Else the padded batched matmul is the only path."""
        return self.capacity_factor is None and m.d_model % 8 == 0 and self.expert.hidden_dim % 8 == 0

    def cuda_graph_refusal(self, m, device_type: str) -> str | None:
        # The grouped dispatch has no data-dependent shape since issue 48, but its capture is unmeasured, and off
        # bf16-on-Hopper the padded fallback runs, whose buffer the busiest expert's count sizes.
        return ("MoE routing has data-dependent shapes on its padded path (a buffer sized by the busiest expert's "
                "count), which CUDA graphs cannot capture; the grouped path has none but is not measured under CUDA "
                "graphs yet")

    def decode_compile_refusal(self, m) -> str | None:
        # Measured (torch 2.13, CPU, before issue 48): mixtral-like-tiny's step broke at bincount into 7 graphs,
        # deepseek-v3-like-tiny's into 8, where a dense model's is one. The grouped dispatch no longer counts by
        # bincount (no data-dependent shape); its compiled decode is not measured yet, so both paths stay eager.
        return ("MoE routing has data-dependent shapes on its padded path (a buffer sized by the busiest expert's "
                "count); the grouped path has none but its compiled decode is not measured yet")

    def describe(self, m) -> str:
        e = self.expert
        name = GLU_NAMES[e.activation] if e.kind == "glu" else f"{MLP_NAMES[e.activation]} MLP"
        shared = f" + {self.n_shared_experts} shared" if self.n_shared_experts else ""
        cap = "dropless" if self.capacity_factor is None else f"capacity {self.capacity_factor:g}"
        routing = "" if self.score == "softmax" else f", {self.score} scores"
        if self.group_limited:
            routing += f", within {self.topk_group} of {self.n_group} groups"
        if self.router_bias:
            routing += ", router bias"
        if self.clamped_swiglu is not None:
            routing += f", SwiGLU clamped at {self.clamped_swiglu.limit:g}"
        if self.bias_update_rate > 0:
            routing += f", bias balancing at {self.bias_update_rate:g}"
        elif self.selection_bias:
            routing += ", selection bias"
        return (f"MoE FFN (top-{self.top_k} of {self.n_experts} {name} experts of hidden {e.hidden_dim}{shared}, "
                f"{cap}{routing})")

    def template_context(self, m) -> dict[str, Any]:
        e = self.expert
        glu = e.kind == "glu"
        return {
            "glu": glu,
            "expert_bias": e.bias,
            "activation_name": e.activation,
            "act_h": ("h_gate * torch.sigmoid(MOE_SWIGLU_ALPHA * h_gate)" if self.clamped_swiglu is not None
                      else call(e.activation, "h_gate" if glu else "h")),
            "clamped": self.clamped_swiglu is not None,
            "router_bias": self.router_bias,
            "act_shared": call(e.activation, "self.shared_expert.gate_proj(x)" if glu
                               else "self.shared_expert.up_proj(x)"),
            "shared": bool(self.n_shared_experts),
            "shared_gate": self.shared_gate,
            "renormalize": lit_bool(self.renormalize),
            "capacity": self.capacity_factor is not None,
            "drop_policy": self.drop_policy,
            "grouped": self.grouped(m),
            "plain_router": self.plain_router,
            "sigmoid": self.score == "sigmoid",
            "selection_bias": self.selection_bias,
            "group_limited": self.group_limited,
            # a group's score sums its top two scores (DeepSeek-V3); a group of one expert has only one
            "group_top": min(2, self.n_experts // self.n_group),
            "scaled": self.routed_scaling_factor != 1.0,
            "bias_update": self.bias_update_rate > 0,
            # Model methods must be the same for every MoE configuration of a model (codegen): the balancing hooks
            # are there when any layer updates its bias.
            "model_balances": any(isinstance(b.ffn, MoESpec) and b.ffn.bias_update_rate > 0 for b in m.blocks()),
        }

    # ── weight quantization (archspec.quant) ─────────────────────────────────────────────────────────────────────

    def quantized_weights(self, module) -> list[str]:
        """The experts' matrices (routed and shared); the router and the shared expert's gate stay as trained: a
        rounding error there changes which experts a token reaches, not only how much."""
        return [n for n in super().quantized_weights(module) if not n.startswith(("router.", "shared_expert_gate."))]

    # ── metrics (archspec.kinds.base: the loop records them at each evaluation, ablation reports show them) ─────────

    metric_prefix = "moe."
    metric_column = "load stats"

    @classmethod
    def eval_stats(cls, model) -> dict[str, Any]:
        """Each MoE layer's `router_stats` from the last forward, as its module packs them (this template): one
        row [each expert's fraction of the routed assignments..., dropped fraction, router entropy (nats), padding
        factor], keyed `layer<i>`, and the selection bias of a layer that has one, keyed `layer<i>.bias`. The rows
        travel as they are to `eval_metrics` (the generated Model's `router_stats()` splits the same rows into named
        parts for a caller that wants them)."""
        rows = {}
        for i, block in enumerate(getattr(model, "blocks", ())):
            row = getattr(block.ffn, "router_stats", None)
            if row is not None:
                rows[f"layer{i}"] = row
                bias = getattr(block.ffn, "selection_bias", None)
                if bias is not None:
                    rows[f"layer{i}.bias"] = bias.detach()
        return rows

    @classmethod
    def eval_metrics(cls, stats) -> dict[str, float]:
        """Averaged router rows (`eval_stats`) → per layer `moe.layer<i>.max_load` / `min_load` / `dropped` /
        `entropy` / `padding`, and over the layers `moe.max_load` (the busiest expert of any layer: 1/n_experts is
        perfect balance, 1 is collapse onto one expert), `moe.min_load`, `moe.dropped` and `moe.entropy` (means);
        where layers have a selection bias, `moe.layer<i>.bias_spread` (its max − min) and `moe.bias_spread` (the
        largest of any layer)."""
        prefix = cls.metric_prefix
        out: dict[str, float] = {}
        rows = []
        spreads = []
        for layer, row in stats.items():
            if layer.endswith(".bias"):
                spreads.append(float(row.max() - row.min()))
                out[f"{prefix}{layer}_spread"] = spreads[-1]
                continue
            load = row[:-3]
            r = {"max_load": float(load.max()), "min_load": float(load.min()), "dropped": float(row[-3]),
                 "entropy": float(row[-2]), "padding": float(row[-1])}
            out.update({f"{prefix}{layer}.{k}": v for k, v in r.items()})
            rows.append(r)
        if rows:
            out[prefix + "max_load"] = max(r["max_load"] for r in rows)
            out[prefix + "min_load"] = min(r["min_load"] for r in rows)
            for key in ("dropped", "entropy"):
                out[prefix + key] = sum(r[key] for r in rows) / len(rows)
        if spreads:
            out[prefix + "bias_spread"] = max(spreads)
        return out

    @classmethod
    def in_summary(cls, key: str) -> bool:
        """The per-layer figures stay per-eval metrics; the summary keeps the model-wide ones."""
        return not key.startswith(cls.metric_prefix + "layer")

    # ── HF transformers interop (archspec.kinds.hf) ──────────────────────────────────────────────────────────────
    # Mixtral's and Qwen2-MoE's sparse MoE blocks: router `gate` (softmax in fp32, top-k, gates renormalised or
    # not), routed experts that are gated MLPs without biases; Qwen2-MoE adds one shared expert (a gated MLP) scaled
    # by sigmoid(shared_expert_gate(x)). Both dropless, no z-loss. In memory transformers 5.x fuses the experts
    # (gate_up_proj (E, 2·hidden, D)); its files keep one matrix per expert and projection (what save_pretrained
    # writes and the hub holds: Mixtral's experts.<e>.w1 (gate), w3 (up), w2 (down); Qwen2-MoE's
    # experts.<e>.gate_proj, up_proj, down_proj), which is what is read and written here.
    # Load balancing: transformers' loss counts each token's top_k assignments (Σ_i f_i = top_k) where ours counts
    # fractions of assignments (Σ_i f_i = 1), so α here = top_k · router_aux_loss_coef: per layer, the same loss.
    hf_block = "sparse_moe"

    @classmethod
    def from_hf(cls, cfg):
        from typing import get_args

        from archspec.kinds.ffn.activations import ActivationName

        keys = cfg.hf.keys
        top_k = cfg.take("top_k", int)
        out: dict[str, Any] = {
            "kind": "moe", "n_experts": cfg.take("n_experts", int), "top_k": top_k,
            "expert": {"kind": "glu", "hidden_dim": cfg.take("expert_hidden", int),
                       "activation": activations.from_hf(cfg, get_args(ActivationName)),
                       "bias": cfg.fact("expert_bias")},
            "renormalize": cfg.fact("renormalize"),
            # a type without the key (DeepSeek-V3's transformers model) has no load-balancing loss
            "aux_loss_coef": cfg.take("aux_loss_coef", float) * top_k if "aux_loss_coef" in keys else 0.0,
        }
        if "n_shared_experts" in keys:  # DeepSeek: n shared experts of the routed experts' width, as one MLP
            n_shared = cfg.take("n_shared_experts", int)
            if n_shared < 0:
                raise cfg.refuse("n_shared_experts", f"{n_shared}: must be at least 0")
            if n_shared:
                out["n_shared_experts"] = n_shared
        elif cfg.fact("shared_expert"):
            out.update(n_shared_experts=1, shared_hidden_dim=cfg.take("shared_hidden", int),
                       shared_gate=cfg.fact("shared_gate"))
        out.update(cls._routing_from_hf(cfg, out["n_experts"]))
        out.update(cls._gpt_oss_from_hf(cfg))
        return out

    @classmethod
    def _gpt_oss_from_hf(cls, cfg) -> dict[str, Any]:
        """gpt-oss: the router's bias, and the experts' clamped SwiGLU (swiglu_limit, swiglu_alpha), where the type
        has them."""
        out: dict[str, Any] = {}
        if cfg.fact("router_bias"):
            out["router_bias"] = True
        if "swiglu_limit" in cfg.hf.keys:
            limit, alpha = cfg.take("swiglu_limit", float), cfg.take("swiglu_alpha", float)
            if limit <= 0:
                raise cfg.refuse("swiglu_limit", f"{limit}: the clamp must be positive (transformers clamps the gate "
                                 "from above and up within ±limit)")
            if alpha <= 0:
                raise cfg.refuse("swiglu_alpha", f"{alpha}: the sigmoid's gain must be positive")
            out["clamped_swiglu"] = {"limit": limit, "alpha": alpha}
        return out

    @classmethod
    def _routing_from_hf(cls, cfg, n_experts: int) -> dict[str, Any]:
        """The routing variants, where the type has them (DeepSeek-V3's DeepseekV3TopkRouter): sigmoid scores, the
        selection bias (e_score_correction_bias), group-limited top-k, the routed scaling factor."""
        keys, out = cfg.hf.keys, {}
        score = "sigmoid" if cfg.fact("sigmoid_scores") else "softmax"
        if "scoring_func" in keys:  # what the original code switches on; transformers' class may compute one only
            written = cfg.take("scoring_func", str, default=score)
            if written != score:
                raise cfg.refuse("scoring_func", f"{written!r}: transformers' {cfg.hf.model_type} computes {score} "
                                 "scores whatever this says")
        if "topk_method" in keys:
            written = cfg.take("topk_method", str, default="noaux_tc")
            if written != "noaux_tc":
                raise cfg.refuse("topk_method", f"{written!r}: transformers' {cfg.hf.model_type} routes as "
                                 "'noaux_tc' (group-limited top-k over the bias-corrected scores)")
        if score != "softmax":
            out["score"] = score
        if cfg.fact("selection_bias"):
            out["selection_bias"] = True
        if "n_group" in keys:
            n_group, topk_group = cfg.take("n_group", int, default=1), cfg.take("topk_group", int, default=None)
            if n_group < 1 or n_experts % n_group:
                raise cfg.refuse("n_group", f"{n_group}: must be at least 1 and divide {n_experts} experts")
            if topk_group is not None and not 1 <= topk_group <= n_group:
                raise cfg.refuse("topk_group", f"{topk_group}: must be in 1..n_group ({n_group})")
            if topk_group is not None and topk_group < n_group:  # else every group is kept: no limit
                if n_experts // n_group < 2:
                    raise cfg.refuse("n_group", f"{n_group}: groups of one expert, whose score (the sum of a "
                                     "group's top two) transformers cannot take")
                out.update(n_group=n_group, topk_group=topk_group)
        if "routed_scaling_factor" in keys:
            factor = cfg.take("routed_scaling_factor", float, default=1.0)
            if factor != 1.0:
                out["routed_scaling_factor"] = factor
        if "bias_update_rate" in keys:
            rate = cfg.take("bias_update_rate", float, default=0.0)
            if rate:
                out["bias_update_rate"] = rate
        return out

    def to_hf(self, m, out, hf, path):
        where = ".".join(path)
        if self.expert.kind != "glu":
            raise HFUnsupported(f"{where}.expert.kind: {self.expert.kind!r} cannot be expressed as {hf.model_type} "
                                "(its experts are gated MLPs: glu)")
        if self.capacity_factor is not None:
            raise HFUnsupported(f"{where}.capacity_factor: {self.capacity_factor}: {hf.model_type}'s experts take every "
                                "token routed to them (dropless: capacity_factor null)")
        if self.z_loss_coef:
            raise HFUnsupported(f"{where}.z_loss_coef: {self.z_loss_coef}: {hf.model_type} has no router z-loss")
        keys = hf.keys
        if "n_shared_experts" in keys:
            if self.n_shared_experts and self.shared_hidden_dim != self.n_shared_experts * self.expert.hidden_dim:
                raise HFUnsupported(f"{where}.shared_hidden_dim: {self.shared_hidden_dim}: {hf.model_type}'s shared "
                                    f"experts are n_shared_experts · expert.hidden_dim wide "
                                    f"({self.n_shared_experts * self.expert.hidden_dim})")
            out[keys["n_shared_experts"]] = self.n_shared_experts
        else:
            if self.n_shared_experts > 1:
                raise HFUnsupported(f"{where}.n_shared_experts: {self.n_shared_experts}: {hf.model_type} has one "
                                    f"shared expert (n_shared_experts: 1 with shared_hidden_dim: "
                                    f"{self.shared_hidden_dim} computes the same)")
            put_fact(out, hf, "shared_expert", self.n_shared_experts > 0, (*path, "n_shared_experts"))
        put_fact(out, hf, "shared_gate", self.shared_gate, (*path, "shared_gate"))
        put_fact(out, hf, "expert_bias", self.expert.bias, (*path, "expert", "bias"))
        put_fact(out, hf, "renormalize", self.renormalize, (*path, "renormalize"))
        out[keys["n_experts"]] = self.n_experts
        out[keys["top_k"]] = self.top_k
        out[keys["expert_hidden"]] = self.expert.hidden_dim
        out[keys["activation"]] = activations.TO_HF[self.expert.activation]
        if self.n_shared_experts and "shared_hidden" in keys:
            out[keys["shared_hidden"]] = self.shared_hidden_dim
        if "aux_loss_coef" in keys:
            out[keys["aux_loss_coef"]] = _per_token_coef(self.aux_loss_coef, self.top_k)
        elif self.aux_loss_coef:  # a training setting: the exported model computes the same without it
            _left_out(f"{where}.aux_loss_coef: {self.aux_loss_coef} left out: {hf.model_type} has no load-balancing "
                      "loss (a training setting; the exported model computes the same; it imports back as 0)")
        self._routing_to_hf(out, hf, path)
        put_fact(out, hf, "router_bias", self.router_bias, (*path, "router_bias"))
        if "swiglu_limit" in keys:
            if self.clamped_swiglu is None:
                raise HFUnsupported(f"{where}.clamped_swiglu: null cannot be expressed as {hf.model_type} (its experts "
                                    "always clamp: give {limit, alpha})")
            out[keys["swiglu_limit"]] = self.clamped_swiglu.limit
            out[keys["swiglu_alpha"]] = self.clamped_swiglu.alpha
        elif self.clamped_swiglu is not None:
            raise HFUnsupported(f"{where}.clamped_swiglu: {self.clamped_swiglu.model_dump()} cannot be expressed as "
                                f"{hf.model_type} (its experts' SwiGLU is not clamped)")

    def _routing_to_hf(self, out, hf, path) -> None:
        where, keys = ".".join(path), hf.keys
        put_fact(out, hf, "sigmoid_scores", self.score == "sigmoid", (*path, "score"))
        put_fact(out, hf, "selection_bias", self.selection_bias, (*path, "selection_bias"))
        if "scoring_func" in keys:
            out[keys["scoring_func"]] = self.score
        if "topk_method" in keys:
            out[keys["topk_method"]] = "noaux_tc"
        if "n_group" in keys:
            out[keys["n_group"]] = self.n_group
            out[keys["topk_group"]] = self.n_group if self.topk_group is None else self.topk_group
        elif self.group_limited:
            raise HFUnsupported(f"{where}.topk_group: {self.topk_group}: {hf.model_type} has no group-limited routing "
                                "(null exports)")
        if "routed_scaling_factor" in keys:
            out[keys["routed_scaling_factor"]] = self.routed_scaling_factor
        elif self.routed_scaling_factor != 1.0:
            raise HFUnsupported(f"{where}.routed_scaling_factor: {self.routed_scaling_factor}: {hf.model_type} does "
                                "not scale the routed gates (1.0 exports)")
        if "bias_update_rate" in keys:
            out[keys["bias_update_rate"]] = self.bias_update_rate
        elif self.bias_update_rate:
            _left_out(f"{where}.bias_update_rate: {self.bias_update_rate} left out: {hf.model_type} has no key for the "
                      "bias balancing rate (a training setting; the bias itself is exported; it imports back as 0)")

    def hf_weights(self, m, hf):
        names = hf.names
        if hf.facts.get("fused_experts"):
            return self._fused_hf_weights(hf)
        out = [HFWeight("router.weight", (f"{names['router']}.weight",))]
        out += [HFWeight(f"experts.{proj}_proj",
                         tuple(f"experts.{e}.{names.get(f'expert_{proj}', f'{proj}_proj')}.weight"
                               for e in range(self.n_experts)), stack=True)
                for proj in ("gate", "up", "down")]
        if self.n_shared_experts:
            shared = names.get("shared_expert", "shared_expert")  # DeepSeek's: shared_experts
            out += [HFWeight(f"shared_expert.{p}_proj.weight", (f"{shared}.{p}_proj.weight",))
                    for p in ("gate", "up", "down")]
        if self.shared_gate:
            out.append(HFWeight("shared_expert_gate.weight", ("shared_expert_gate.weight",)))
        if self.selection_bias:
            out.append(HFWeight("selection_bias", (names.get("selection_bias",
                                                             f"{names['router']}.e_score_correction_bias"),)))
        return out

    def _fused_hf_weights(self, hf) -> list[HFWeight]:
        """gpt-oss's files, as its modules hold them: router.weight (and bias); experts.gate_up_proj (E, D, 2·hidden)
        with gate unit i at column 2i and up unit i at 2i + 1 (ours: gate_proj and up_proj, (E, hidden, D) each),
        gate_up_proj_bias (E, 2·hidden) interleaved alike, down_proj (E, hidden, D) (ours (E, D, hidden)) and
        down_proj_bias (E, D)."""
        router, hidden = hf.names["router"], self.expert.hidden_dim
        out = [HFWeight("router.weight", (f"{router}.weight",))]
        if self.router_bias:
            out.append(HFWeight("router.bias", (f"{router}.bias",)))
        out += [HFWeight(("experts.gate_proj", "experts.up_proj"), ("experts.gate_up_proj",), sizes=(hidden, hidden),
                         dim=1, transpose=True, interleave=True),
                HFWeight("experts.down_proj", ("experts.down_proj",), transpose=True)]
        if self.expert.bias:
            out += [HFWeight(("experts.gate_bias", "experts.up_bias"), ("experts.gate_up_proj_bias",),
                             sizes=(hidden, hidden), dim=1, interleave=True),
                    HFWeight("experts.down_bias", ("experts.down_proj_bias",))]
        return out

    # ── testing ──────────────────────────────────────────────────────────────────────────────────────────────────

    @classmethod
    def strategy(cls, ctx):
        from hypothesis import strategies as st

        hidden = st.integers(1, max(1, min(ctx["max_hidden"], 48)))

        @st.composite
        def build(draw):
            n = draw(st.integers(2, 6))
            out: dict[str, Any] = {"n_experts": n}
            reach = n  # the experts a token may choose from
            # n_group and topk_group always written (1 and null: no limit, as omitted): a layer group laid over a
            # model-wide MoE would otherwise keep its groups for another expert count
            out["n_group"], out["topk_group"] = 1, None
            if draw(st.booleans()):  # group-limited routing: a divisor of n, some of its groups kept
                groups = draw(st.sampled_from([g for g in range(1, n + 1) if n % g == 0]))
                out["n_group"] = groups
                if draw(st.booleans()):
                    out["topk_group"] = draw(st.integers(1, groups))
                    reach = out["topk_group"] * (n // groups)
            out["top_k"] = draw(st.integers(1, reach))
            if draw(st.booleans()):
                out["score"] = draw(st.sampled_from(["softmax", "sigmoid"]))
            if draw(st.booleans()):
                out["selection_bias"] = True
                if draw(st.booleans()):
                    out["bias_update_rate"] = draw(st.sampled_from([0.0, 0.001, 0.01]))
            if draw(st.booleans()):
                out["routed_scaling_factor"] = draw(st.sampled_from([1.0, 0.5, 2.5]))
            expert_kind = draw(st.sampled_from(["glu", "mlp", None]))
            if expert_kind is not None:
                cls_ = GLUSpec if expert_kind == "glu" else MLPSpec
                body = draw(cls_.strategy({**ctx, "max_hidden": 48}))
                out["expert"] = {"kind": expert_kind, **body}
            else:
                out["expert"] = {"hidden_dim": draw(hidden)}
            shared = draw(st.integers(0, 2))
            if shared:
                out["n_shared_experts"] = shared
                if draw(st.booleans()):
                    out["shared_hidden_dim"] = draw(hidden)
                out["shared_gate"] = draw(st.booleans())
            if draw(st.booleans()):
                out["renormalize"] = draw(st.booleans())
            if draw(st.booleans()):
                out["capacity_factor"] = draw(st.sampled_from([0.5, 1.0, 1.25, 2.0]))
                out["drop_policy"] = draw(st.sampled_from(["probs", "position"]))
            if draw(st.booleans()):
                out["aux_loss_coef"] = draw(st.sampled_from([0.0, 0.01, 0.1]))
            if draw(st.booleans()):
                out["z_loss_coef"] = draw(st.sampled_from([0.0, 0.001]))
            if draw(st.booleans()):
                out["router_bias"] = draw(st.booleans())
            # clamped_swiglu is not drawn here: a layer group's FFN merges onto the model-wide one, and a group that
            # switches the experts to an MLP under a model-wide clamp is invalid (the rule's own invalid case below
            # and tests/test_sinks.py, tests/test_hf_gpt_oss.py cover the clamp)
            return out

        return build()

    @classmethod
    def invalid_cases(cls):
        return {"n_group_divides": _bad_n_group, "topk_group_within": _bad_topk_group,
                "top_k_within_groups": _bad_top_k_in_groups, "bias_rate_needs_bias": _rate_without_bias,
                "clamped_swiglu_needs_silu_glu": _clamp_without_swiglu}


# ── invalid specs (archspec.testing): each breaks one routing rule of a model-wide MoE FFN ─────────────────────────


def _moe_case(data, ffn: dict[str, Any], field: str):
    if data["model"].get("layers"):  # a group may replace the model-wide FFN in every layer
        return None
    data["model"]["ffn"] = {"kind": "moe", "expert": {"hidden_dim": 8}, **ffn}
    return ("model", "ffn", field)


def _bad_n_group(draw, data, spec):
    from hypothesis import strategies as st

    n = draw(st.integers(3, 12))
    return _moe_case(data, {"n_experts": n, "top_k": 1,
                            "n_group": draw(st.sampled_from([g for g in range(2, 2 * n) if n % g]))}, "n_group")


def _bad_topk_group(draw, data, spec):
    from hypothesis import strategies as st

    return _moe_case(data, {"n_experts": 8, "top_k": 1, "n_group": 4, "topk_group": draw(st.integers(5, 16))},
                     "topk_group")


def _bad_top_k_in_groups(draw, data, spec):
    from hypothesis import strategies as st

    kept = draw(st.integers(1, 3))  # of 4 groups of 2 experts: at most 2 · kept experts reachable
    return _moe_case(data, {"n_experts": 8, "n_group": 4, "topk_group": kept,
                            "top_k": draw(st.integers(2 * kept + 1, 8))}, "top_k")


def _rate_without_bias(draw, data, spec):
    from hypothesis import strategies as st

    return _moe_case(data, {"n_experts": 4, "top_k": 2, "bias_update_rate": draw(st.sampled_from([0.001, 0.5]))},
                     "bias_update_rate")


def _clamp_without_swiglu(draw, data, spec):
    from hypothesis import strategies as st

    expert = draw(st.sampled_from([{"kind": "mlp", "hidden_dim": 8}, {"kind": "glu", "activation": "gelu",
                                                                      "hidden_dim": 8}]))
    return _moe_case(data, {"n_experts": 4, "top_k": 2, "expert": expert, "clamped_swiglu": {}}, "clamped_swiglu")


def _per_token_coef(coef: float, top_k: int) -> float:
    """transformers' router_aux_loss_coef for our aux_loss_coef: coef / top_k, nudged to the float whose product
    with top_k gives coef back where one exists, so that export then import is lossless."""
    value = coef / top_k
    for candidate in (value, math.nextafter(value, math.inf), math.nextafter(value, -math.inf)):
        if candidate * top_k == coef:
            return candidate
    return value


def _left_out(message: str) -> None:
    """Say what an export leaves out that does not change what the model computes (archspec.hf.convert re-says
    only the notes of the type it exports as)."""
    import warnings

    from archspec.errors import Caution

    warnings.warn(Caution(message), stacklevel=3)
