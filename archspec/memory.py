"""The memory plan: how many bytes a run needs on each device, from the spec alone, before anything is allocated.

    plan = plan_memory(spec, device="cpu")          # → MemoryPlan: weights, gradients, optimizer, activations, …
    check_memory(spec, device="cuda", world_size=8)  # raises UserError (exit 2) with the estimate and the cheapest fix

What is counted, per device (one process):
- weights (fp32 masters), gradients (fp32) and AdamW's two fp32 moments: 4 + 4 + 8 bytes per parameter, divided by
  the number of shards under FSDP. DDP keeps a full replica plus its gradient buckets (another 4 bytes per parameter).
  FSDP also holds the unsharded parameters of the block it is computing and of the one it prefetches.
- the model's fixed buffers (RoPE cos/sin tables, the sinusoid table).
- activations: the tensors autograd saves for backward at batch_size × seq_len tokens, counted op by op for the
  generated module (eager; a compiled block saves no more). With activation checkpointing a checkpointed block saves
  only its input, and one block's activations are recomputed at a time during backward.
- the peak of a training step, walked through backward: all saved activations plus the loss head's transient
  (log-softmax output, its gradient and the logits' gradient) at the start of backward; then, block by block, the
  activations are freed as the gradients appear. The peak is the larger of that walk and the optimizer step
  (weights + gradients + moments). Fused AdamW allocates no temporaries.

On CPU the estimate is checked against MemAvailable shared by this node's processes; on CUDA against the device's
free memory (`torch.cuda.mem_get_info`) less a margin for the caching allocator. The formulas were checked against
measured peak RSS on CPU (`bench/bench_memory.py`; per rank under ddp, fsdp, tp and ep: `bench/parallel_memory.py`;
docs/BENCHMARKS.md); the CUDA figures (bf16 autocast, FSDP mixed
precision) follow the same counting but have not been measured here: no GPU was available when they were written.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Literal

from archspec.accounting import Accounting, account
from archspec.environment import env_int
from archspec.errors import UserError
from archspec.spec import Spec
from archspec.spec.model import ModelSpec
from archspec.recipe import RecipeView
from archspec.stages import StagePlan, plan_stages

GIB = 1 << 30
CUDA_MARGIN = 0.92  # of the free device memory: the caching allocator rounds and fragments
# Resident memory beyond the live tensors on CPU: glibc keeps freed chunks (gradients freed at every step,
# activations freed in backward) in its heaps, and kernels and thread pools allocate outside autograd's view. Fitted on
# six configurations from 3.6M to 82M parameters (bench/bench_memory.py): a constant, plus fractions of the gradient
# and of the activation bytes a step frees and allocates again.
CPU_RUNTIME_BYTES = 32 << 20
CPU_RETAINED_GRADIENTS = 0.3
CPU_RETAINED_ACTIVATIONS = 0.1
# Under tensor parallelism the heap also keeps the buffers of sequence parallelism's collectives (each block's
# all-gathers and reduce-scatters of the whole-sequence stream, forward and backward, and gloo's staging copies):
# small tensors allocated between the activations, which fragment it. Fitted on tp 2 and dp 2 × tp 2
# (bench/parallel_memory.py, docs/BENCHMARKS.md): with glibc's mmap threshold fixed, the live tensors match the plan
# without it within 2% and 8%; with glibc's default the peak is higher by about 1.5× these buffers' bytes.
CPU_RETAINED_COLLECTIVES = 1.5

Checkpointing = Literal["none", "full", "every_k"]


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


@dataclass(frozen=True)
class Setup:
    """Everything besides the model that decides a run's memory. `from_spec` reads it from the recipe."""

    device: str = "cpu"  # cpu | cuda
    training: bool = True
    batch_size: int = 1  # sequences per micro-batch, per process
    seq_len: int = 1
    grad_accum: int = 1
    world_size: int = 1
    parallel: str = "ddp"  # ddp | fsdp (a world of one is plain single-process training either way)
    tp: int = 1  # tensor-parallel degree: matmuls, embedding and head split this many ways (archspec.train.mesh)
    ep: int = 1  # expert-parallel degree: routed experts spread over this many data-parallel processes
    pp: int = 1  # pipeline-parallel degree: the layers split into stages by cost (archspec.train.stages)
    schedule: str = "1f1b"  # pipeline schedule (pp > 1): gpipe | 1f1b | interleaved_1f1b
    microbatches: int = 0  # pipeline micro-batches the replica's batch is split into (pp > 1); 0: pp
    checkpointing: Checkpointing = "none"
    checkpoint_every: int = 1  # every_k: blocks 0, k, 2k, … are checkpointed
    bf16: bool = False  # bf16 compute: autocast (single process, DDP) or FSDP's bf16 parameters (CUDA)

    @property
    def dp(self) -> int:
        """Data-parallel replicas: world / (tp · pp)."""
        return max(1, self.world_size // (self.tp * self.pp))

    @property
    def n_microbatches(self) -> int:
        """Micro-batches of the pipeline schedule (1 without pp): each is batch_size / this many rows."""
        return 1 if self.pp == 1 else (self.microbatches or self.pp)

    @property
    def stages_per_process(self) -> int:
        """Pipeline stages one process holds: two under interleaved_1f1b (stages p and p + pp), else one."""
        return 2 if self.pp > 1 and self.schedule == "interleaved_1f1b" else 1

    @property
    def shards(self) -> int:
        """FSDP's shards of a non-expert weight (over the data-parallel processes); 1 without FSDP."""
        return self.dp if self.parallel == "fsdp" and self.dp > 1 else 1

    @property
    def expert_shards(self) -> int:
        """Shards of an expert weight beyond ep's: none. Under ep the experts are left out of FSDP and replicated
        over the data-parallel processes that hold the same experts (archspec.train.expert_parallel.shard_experts)."""
        return 1

    def describe(self) -> str:
        ac = {"none": "no activation checkpointing", "full": "activation checkpointing on every block",
              "every_k": f"activation checkpointing on every {self.checkpoint_every}th block"}[self.checkpointing]
        par = "" if self.world_size == 1 else f" · {self.parallel.upper()} over {self.world_size} processes"
        axes = [f"{k} {v}" for k, v in (("tp", self.tp), ("ep", self.ep), ("pp", self.pp)) if v > 1]
        if axes:
            par += f" (dp {self.dp} × {' × '.join(axes)})"
        if self.pp > 1:
            par += f" · {self.schedule}, {self.n_microbatches} micro-batches of {self.batch_size // self.n_microbatches}"
        what = (f"training, micro-batch {self.batch_size} × {self.seq_len} tokens"
                + (f" × {self.grad_accum} accumulated" if self.grad_accum > 1 else "") + f" · {ac}"
                if self.training else "inference, weights only")
        return f"{self.device} {'bf16' if self.bf16 else 'fp32'} · {what}{par}"


def setup_from_spec(spec: Spec, *, device: str = "cpu", training: bool = True, world_size: int = 1,
                    **overrides) -> Setup:
    """The Setup a run of `spec` would have: the recipe's micro-batch, window, precision, and (when the recipe has
    them) its parallel strategy and activation checkpointing."""
    t = spec.train
    parallel = getattr(t, "parallel", None)
    ac = getattr(t, "activation_checkpointing", None)
    # 16-bit activations: the recipe view's rule (bf16, fp16 autocast, fp8 inside bf16 autocast, auto on CUDA)
    bf16 = RecipeView.of(t).sixteen_bit(device)
    setup = Setup(device=device, training=training, batch_size=t.batch_size, seq_len=t.seq_len or spec.model.context_length,
                  grad_accum=t.grad_accum, world_size=world_size, parallel=getattr(parallel, "kind", "ddp"),
                  tp=getattr(parallel, "tp", 1), ep=getattr(parallel, "ep", 1), pp=getattr(parallel, "pp", 1),
                  schedule=getattr(parallel, "schedule", "1f1b"), microbatches=getattr(parallel, "microbatches", None) or 0,
                  checkpointing=getattr(ac, "kind", "none"), checkpoint_every=getattr(ac, "k", 1), bf16=bf16)
    return replace(setup, **overrides)


# ── activations saved for backward, per token, in bytes ─────────────────────────────────────────────────────────
# One function per family, counted from the generated templates op by op (what autograd keeps for each op: a linear
# keeps its input, an activation its input or output, SDPA its q, k, v, output and log-sum-exp, …). `stream` is the
# element size of the residual stream and norm statistics (fp32 even under autocast), `mm` that of matmul inputs and
# outputs (bf16 under autocast).


def _norm_saved(m: ModelSpec, stream: int, mm: int, b=None) -> int:
    """One pre-norm plus the copy of its output that the following linear keeps (its bf16 cast under autocast)."""
    norm = (b or m).norm
    return norm.saved_elements(m.d_model) * stream + m.d_model * mm


def _mixer_saved(m: ModelSpec, seq_len: int, mm: int, device: str, b=None) -> int:
    """What the layer's token mixer keeps, as its unit says (archspec.kinds.base.MixerKind.saved_bytes)."""
    return (b or m).token_mixer.saved_bytes(m, seq_len, mm, device)


def _ffn_saved(m: ModelSpec, mm: int, b=None) -> int:
    return (b or m).ffn.saved_elements(m.d_model) * mm


def block_saved_per_token(m: ModelSpec, seq_len: int, device: str, bf16: bool, b=None) -> int:
    """Activations one block keeps for backward, per token; `b` is the layer's BlockSpec (per-layer variation),
    default the model-wide components."""
    stream, mm = 4, (2 if bf16 else 4)
    ffn = type((b or m).ffn).sublayer  # a block may have no channel mixer (FFN kind none): one sublayer
    dropout_masks = (2 if ffn else 1) * m.d_model * stream if m.dropout > 0 else 0  # the residual dropouts
    # where the block's norms sit (model.block): two, one (shared, or no FFN) or four
    n_norms = b.n_norms if b is not None else sum(map(len, m.block.norms_of("", ffn)))
    return (n_norms * _norm_saved(m, stream, mm, b) + _mixer_saved(m, seq_len, mm, device, b) + _ffn_saved(m, mm, b)
            + dropout_masks)


def block_backward_transient_per_token(m: ModelSpec, bf16: bool, b=None) -> int:
    """Gradients of a block's intermediates alive at once while its backward runs (the widest: the FFN's)."""
    mm = 2 if bf16 else 4
    ffn = (b or m).ffn
    return 3 * (getattr(ffn, "hidden_dim", None) or 4 * m.d_model) * mm + 2 * m.d_model * 4


def head_saved_per_token(m: ModelSpec, bf16: bool) -> int:
    """Token ids, the embedding dropout mask, the final norm, and the fp32 log-softmax of the cross-entropy."""
    return embedding_saved_per_token(m) + loss_saved_per_token(m, bf16)


def embedding_saved_per_token(m: ModelSpec) -> int:
    """What the embedding keeps: the token ids (int64) and its dropout mask."""
    return 8 + (m.d_model * 4 if m.dropout > 0 else 0)


def loss_saved_per_token(m: ModelSpec, bf16: bool) -> int:
    """What the final norm and the cross-entropy keep (the fp32 log-softmax)."""
    final = _norm_saved(m, 4, 2 if bf16 else 4) if m.final_norm else 0
    return final + m.vocab_size * 4


def mtp_saved_per_token(m: ModelSpec, seq_len: int, device: str, bf16: bool) -> int:
    """What the multi-token prediction modules (model.mtp) keep for backward, per token: per depth its two input norms,
    the projection's 2·d_model input, one block like the last layer's and its own norm and cross-entropy (the loss
    head's). Zero without them."""
    if m.mtp is None:
        return 0
    stream, mm = 4, (2 if bf16 else 4)
    per_depth = (2 * _norm_saved(m, stream, mm) + 2 * m.d_model * mm
                 + block_saved_per_token(m, seq_len, device, bf16, m.blocks()[-1]) + loss_saved_per_token(m, bf16))
    return m.mtp.depth * per_depth


def head_transient_per_token(m: ModelSpec, bf16: bool) -> int:
    """At the start of backward: the log-softmax's gradient and the logits' gradient (fp32, and a bf16 copy)."""
    return m.vocab_size * (8 + (2 if bf16 else 0))


def buffer_bytes(acc: Accounting) -> int:
    """Non-persistent buffers the generated module allocates (fp32 position tables), from the kinds' accounting."""
    return acc.buffer_elements * 4


# ── the plan ────────────────────────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class MemoryPlan:
    spec_name: str
    setup: Setup
    params: int
    weights: int  # bytes per device, from here on
    buffers: int
    gradients: int
    optimizer: int
    communication: int  # DDP gradient buckets, FSDP unsharded blocks
    activations: int  # saved for backward, all blocks, at the start of backward
    transient: int  # the loss head's and one block's backward intermediates, recomputation under checkpointing
    allocator: int  # CPU: resident memory beyond the live tensors (see CPU_RUNTIME_BYTES)
    total: int  # the peak of a step (see the module docstring), or weights + buffers for inference
    available: int | None = None  # what the device has for it; None when unknown (planning for absent hardware)
    available_source: str = ""
    notes: list[str] = field(default_factory=list)
    pipeline_buffers: int = 0  # pp > 1: the stage's receive buffers (activations forward, their gradients backward)
    # pp > 1: the split (archspec.train.stages.StagePlan), this plan's pipeline process, and every process's plan
    # (this one is the largest of them: its total is the run's peak per device)
    stage_plan: "StagePlan | None" = None
    process: int | None = None
    per_process: tuple["MemoryPlan", ...] = ()

    @property
    def fits(self) -> bool:
        return self.available is None or self.total <= self.available

    def rows(self) -> list[tuple[str, int]]:
        rows = [("weights", self.weights), ("buffers", self.buffers)]
        if self.setup.training:
            rows += [("gradients", self.gradients), ("AdamW moments", self.optimizer)]
            if self.communication:
                rows.append(("DDP buckets" if self.setup.shards == 1 else "FSDP unsharded blocks", self.communication))
            if self.pipeline_buffers:
                rows.append(("pipeline recv buffers", self.pipeline_buffers))
            rows += [("activations (saved)", self.activations), ("transient (backward)", self.transient)]
            if self.allocator:
                rows.append(("allocator overhead", self.allocator))
        return rows

    def stages(self) -> list[dict]:
        """pp > 1: each pipeline stage's layers [start, stop), shares of the FLOPs and parameters, the process that
        holds it, and that process's peak (`memory_bytes`; under interleaved_1f1b a process holds two stages)."""
        if self.stage_plan is None:
            return []
        pp = self.setup.pp
        peaks = {p.process: p.total for p in self.per_process}
        return [{"stage": k, "layers": list(r), "flops_share": f, "params_share": ps, "process": k % pp,
                 "memory_bytes": peaks[k % pp]}
                for k, (r, (f, ps)) in enumerate(zip(self.stage_plan.ranges, self.stage_plan.shares()))]

    def to_dict(self) -> dict:
        out = {"spec": self.spec_name, "setup": self.setup.describe(), "params": self.params,
               **{k: v for k, v in self.rows()}, "peak_bytes": self.total, "available_bytes": self.available,
               "available_source": self.available_source, "fits": self.fits}
        if self.stage_plan is not None:
            out["stages"] = self.stages()
            out["peak_process"] = self.process
        return out

    def render(self) -> str:
        lines = [f"memory plan for {self.spec_name}: {self.setup.describe()}",
                 f"  {self.params:,} parameters" + (f", sharded {self.setup.shards} ways" if self.setup.shards > 1 else "")]
        if self.stage_plan is not None:
            lines += [f"  {line}" for line in self.stage_plan.lines()]
            lines += [f"  pipeline process {p.process} (stage{'s' if self.setup.stages_per_process > 1 else ''} "
                      f"{', '.join(str(k) for k in range(p.process, self.stage_plan.stages, self.setup.pp))}): "
                      f"peak {gib(p.total)}" for p in self.per_process]
            lines.append(f"  the largest, pipeline process {self.process}:")
        lines += [f"  {name:<24}{gib(n):>12}" for name, n in self.rows()]
        lines.append(f"  {'peak of a step' if self.setup.training else 'total':<24}{gib(self.total):>12}  per device")
        if self.available is not None:
            verdict = "fits" if self.fits else "does NOT fit"
            lines.append(f"  {'available':<24}{gib(self.available):>12}  ({self.available_source}): {verdict}")
        else:
            lines.append(f"  available: unknown ({self.available_source})")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _activation_walk(m: ModelSpec, s: Setup, layers: list[int] | None = None, first: bool = True, last: bool = True
                     ) -> tuple[int, int, list[int]]:
    """(saved activations at the start of backward, transient, activations freed per block in backward order) of
    one micro-batch of `s.batch_size` rows through `layers` (default: all), with the embedding's (`first`) and the
    loss head's (`last`) own tensors."""
    tokens = s.batch_size * s.seq_len
    every = m.blocks()  # each layer with its own components (per-layer variation)
    layers = list(range(m.n_layers)) if layers is None else layers
    blocks = [every[i] for i in layers]
    per_block = [block_saved_per_token(m, s.seq_len, s.device, s.bf16, b) * tokens for b in blocks]
    if m.media is not None:  # a gated cross-attention layer in front of a block keeps its own tensors (MixerKind)
        at, unit = set(m.media.positions(m)), m.media.cross_attention
        own = unit.saved_bytes(m, s.seq_len, 2 if s.bf16 else 4, s.device) * tokens
        per_block = [saved + (own if i in at else 0) for saved, i in zip(per_block, layers)]
    boundary = m.d_model * (2 if s.bf16 and s.shards > 1 else 4) * tokens  # what a checkpointed block keeps
    checkpointed = [s.checkpointing == "full" or (s.checkpointing == "every_k" and i % s.checkpoint_every == 0)
                    for i in layers]
    kept = [boundary if c else saved for c, saved in zip(checkpointed, per_block)]
    head = ((embedding_saved_per_token(m) if first else 0) + (loss_saved_per_token(m, s.bf16) if last else 0)) * tokens
    if first and m.media is not None:  # the media tokens, their keys and values, the resampler: per sequence
        head += sum(m.media.saved_bytes_per_sequence(m, 2 if s.bf16 else 4).values()) * s.batch_size
    if first and last:  # the multi-token prediction modules (model.mtp) run after the head, on the whole model
        head += mtp_saved_per_token(m, s.seq_len, s.device, s.bf16) * tokens
    widest = max(block_backward_transient_per_token(m, s.bf16, b) for b in blocks)
    transient = ((head_transient_per_token(m, s.bf16) if last else 0) + widest) * tokens
    if any(checkpointed):
        transient += max(p for p, c in zip(per_block, checkpointed) if c)  # one block recomputed at a time
    return sum(kept) + head, transient, list(reversed(kept))


def plan_memory(spec: Spec, setup: Setup | None = None, *, accounting: Accounting | None = None,
                **setup_fields) -> MemoryPlan:
    """The memory plan of `spec` under `setup` (default: the recipe's, on CPU, training). Keyword arguments are
    `setup_from_spec`'s (device, training, world_size, and any Setup field); `accounting` is `account(spec)` when the
    caller has it already."""
    s = setup or setup_from_spec(spec, **setup_fields)
    m = spec.model
    acc = accounting or account(spec)
    params = acc.total
    buffers = buffer_bytes(acc)
    if not s.training:
        weights = params * (2 if s.bf16 and s.device == "cuda" else 4)
        return MemoryPlan(spec.name, s, params, weights, buffers, 0, 0, 0, 0, 0, 0, weights + buffers)

    if s.pp > 1:
        return _pipeline_plan(spec, s, acc)
    shards = s.shards
    held = held_params(spec, s, acc)  # this process's share of the parameters, before FSDP
    weights = held * 4
    gradients = held * 4
    optimizer = held * 8
    notes: list[str] = []
    if s.tp > 1 or s.ep > 1:
        notes.append(f"holds {held:,} of the {params:,} parameters (tensor/expert shards, then FSDP)")
    # Per-block parameters (this process's tensor-parallel share), for FSDP's working copies and the backward walk.
    block_params = (params - _outside_blocks(spec, acc)) // max(1, m.n_layers) // s.tp
    if shards > 1:
        # the block being computed and the one being prefetched, gathered whole (bf16 under mixed precision), plus
        # the root's parameters (embedding, head) for the whole step and one block's unsharded gradient
        elem = 2 if s.bf16 else 4
        communication = (2 * block_params + _outside_blocks(spec, acc)) * elem + block_params * 4
    elif s.dp > 1:
        communication = held * 4  # DDP's bucket copy of the gradients
    else:
        communication = 0
    if s.bf16 and shards == 1:
        # autocast keeps the bf16 copy of every weight it cast for the backward of its matmul
        communication += params * 2
        notes.append("includes bf16 weight copies that autocast keeps for backward")

    saved, transient, freed = _activation_walk(m, s)
    if s.tp > 1:
        saved, transient, freed = _tensor_parallel_activations(m, s, saved, transient, freed)
    # Backward: start with everything saved plus the head's transient and the head's gradients; each block then frees
    # its activations and adds its gradients.
    grad_per_block = math.ceil(block_params / shards) * 4
    live = saved + transient + (gradients - grad_per_block * m.n_layers)
    backward_peak = live
    for kept in freed:
        live += grad_per_block - kept
        backward_peak = max(backward_peak, live)
    # Last, the token embedding's dense gradient; when tied to the head it is added to the head's gradient out of
    # place, so for a moment the table's gradient exists three times.
    if m.tie_embeddings:
        backward_peak = max(backward_peak, live + 2 * math.ceil(m.vocab_size * m.d_model / s.tp / shards) * 4)
    step_peak = max(backward_peak, gradients)
    allocator = 0
    if s.device == "cpu":
        allocator = CPU_RUNTIME_BYTES + round(CPU_RETAINED_GRADIENTS * gradients
                                              + CPU_RETAINED_ACTIVATIONS * (saved + transient)
                                              + CPU_RETAINED_COLLECTIVES * sequence_parallel_collective_bytes(m, s))
    total = weights + buffers + optimizer + communication + step_peak + allocator
    return MemoryPlan(spec.name, s, params, weights, buffers, gradients, optimizer, communication, saved, transient,
                      allocator, total, notes=notes)


# ── pipeline parallelism: one plan per pipeline process ────────────────────────────────────────────────────────


def schedule_ops(schedule: str, pp: int, microbatches: int, process: int) -> list[tuple[int, str]]:
    """The order in which pipeline process `process` runs its forwards ("F") and full backwards ("B") in one step,
    each with the local stage it runs on (0; under interleaved_1f1b 0 for stage `process`, 1 for `process + pp`), as
    torch.distributed.pipelining's schedules order them (torch 2.13, schedules.py):

    - gpipe: every micro-batch's forward, then every backward: all `microbatches` in flight.
    - 1f1b (Schedule1F1B): min(microbatches, pp - process) warm-up forwards, then one backward, one forward, ...:
      process 0 holds the most micro-batches in flight.
    - interleaved_1f1b (ScheduleInterleaved1F1B: `_get_warmup_ops`, `_get_1f1b_rank_ops`): rounds of
      microbatches // rounds micro-batches (rounds = max(1, microbatches // pp)); (2 - 1) · that + 2 · (pp - 1 -
      process) warm-up forwards, capped at 2 · microbatches; then a forward and a backward each step, the forward's
      local stage advancing every round and the backward's going back from the last."""
    m = microbatches
    if schedule == "gpipe":
        return [(0, "F")] * m + [(0, "B")] * m
    if schedule == "1f1b":
        warmup = min(m, pp - process)
        ops = [(0, "F")] * warmup
        for i in range(m):
            ops.append((0, "B"))
            if warmup + i < m:
                ops.append((0, "F"))
        return ops
    if schedule != "interleaved_1f1b":
        raise ValueError(f"unknown pipeline schedule {schedule!r}")
    local = 2
    rounds = max(1, m // pp)
    per_round = m // rounds
    warmup = min((local - 1) * per_round + 2 * (pp - 1 - process), m * local)
    steady = m * local - warmup

    def forward_stage(step: int) -> int:
        return (step // per_round) % local

    def backward_stage(step: int) -> int:
        return local - 1 - ((step - warmup) // per_round) % local

    ops: list[tuple[int, str]] = []
    for op in range(warmup + steady + warmup):
        if op < warmup + steady:
            ops.append((forward_stage(op), "F"))
        if op >= warmup:
            ops.append((backward_stage(op), "B"))
    return ops


def in_flight(schedule: str, pp: int, microbatches: int, process: int) -> list[int]:
    """The most micro-batches whose activations each local stage of `process` holds at once (schedule_ops)."""
    ops = schedule_ops(schedule, pp, microbatches, process)
    live = [0] * (1 + max(j for j, _ in ops))
    most = list(live)
    for j, op in ops:
        live[j] += 1 if op == "F" else -1
        most[j] = max(most[j], live[j])
    return most


def _layer_parts(m: ModelSpec) -> list[tuple[int, int, int]]:
    """(dense, norm, routed-expert) parameters of each layer."""
    d, out = m.d_model, []
    for b in m.blocks():
        norms = b.n_norms * b.norm.params(d)
        routed = b.ffn.routed_params(d)
        out.append((b.token_mixer.mixer_params(m) + b.ffn.params(d) - routed, norms, routed))
    return out


def _end_parts(m: ModelSpec) -> tuple[tuple[int, int], tuple[int, int]]:
    """(dense, norm) parameters of the first stage's embedding (with learned positions and the embeddings' norm) and
    of the last stage's head (final norm and output matrix; a tied matrix is held by both ends)."""
    d, v, norm = m.d_model, m.vocab_size, m.norm.params(m.d_model)
    embed = (v * d + m.attention.positional.params(m), norm if m.embedding_norm else 0)
    head = (v * d + (v if m.lm_head_bias else 0), norm if m.final_norm else 0)
    return embed, head


def _pipeline_plan(spec: Spec, s: Setup, acc: Accounting) -> MemoryPlan:
    """The plan of each pipeline process (its stages' layers, embedding and head) under `s`; the largest, with all of
    them in `per_process`."""
    n_stages = s.pp * s.stages_per_process
    stage_plan = plan_stages(spec, n_stages, seq_len=s.seq_len)
    plans = tuple(_pipeline_process_plan(spec, s, acc, stage_plan, p) for p in range(s.pp))
    peak = max(plans, key=lambda p: p.total)
    return replace(peak, stage_plan=stage_plan, per_process=plans)


def _pipeline_process_plan(spec: Spec, s: Setup, acc: Accounting, stage_plan: StagePlan, process: int) -> MemoryPlan:
    """One pipeline process's peak: the single-process counting (module docstring) over its stages' layers, with the
    activations of as many micro-batches in flight as its schedule keeps (`in_flight`) and the walk through the
    schedule's order (`schedule_ops`): a backward's peak is every micro-batch then held, the gradients the process
    has so far (a stage's whole gradient after its first backward; during it, block by block as in one process) and
    the backward's transient.

    Beyond one process's counting: a stage that is not the last keeps its output (the residual stream, fp32) for its
    backward; torch's PipelineStage allocates one receive buffer per micro-batch for the activations a stage that is
    not the first receives and one for the gradients a stage that is not the last receives (fp32 (rows, seq_len,
    d_model) each, not split by tp: the stage boundary is assumed to carry the whole sequence). The input a stage
    receives is also what its first block's norm keeps, so the in-flight part of those buffers is counted twice (at
    most in-flight × one micro-batch's stream)."""
    m = spec.model
    rows = s.batch_size // s.n_microbatches
    mb = replace(s, batch_size=rows)
    stream = rows * s.seq_len * m.d_model * 4
    layer_parts = _layer_parts(m)
    (embed_dense, embed_norm), (head_dense, head_norm) = _end_parts(m)
    local_stages = list(range(process, stage_plan.stages, s.pp))
    notes: list[str] = []

    helds, grads_per_block, walks, params_total, outside_total, block_params_max = [], [], [], 0, 0, 0
    pipeline_buffers = 0
    for k in local_stages:
        a, b = stage_plan.ranges[k]
        first, last = k == 0, k == stage_plan.stages - 1
        dense = sum(layer_parts[i][0] for i in range(a, b)) + (embed_dense if first else 0) + (head_dense if last else 0)
        norms = sum(layer_parts[i][1] for i in range(a, b)) + (embed_norm if first else 0) + (head_norm if last else 0)
        routed = sum(layer_parts[i][2] for i in range(a, b))
        outside = (embed_dense + embed_norm if first else 0) + (head_dense + head_norm if last else 0)
        held = _held(dense, norms, routed, s)
        helds.append(held)
        params_total += dense + norms + routed
        outside_total += outside
        block_params = (dense + norms + routed - outside) // (b - a) // s.tp
        block_params_max = max(block_params_max, block_params)
        grads_per_block.append(math.ceil(block_params / s.shards) * 4)
        saved, transient, freed = _activation_walk(m, mb, list(range(a, b)), first, last)
        if s.tp > 1:
            saved, transient, freed = _tensor_parallel_activations(m, mb, saved, transient, freed)
        if not last:
            saved += stream  # its output, kept for the backward that the next stage's gradient starts
        if first:  # the embedding's dense gradient of a micro-batch, before it is added into the table's
            transient += math.ceil(m.vocab_size * m.d_model / s.tp / s.shards) * 4
        else:
            transient += stream  # the gradient of the received input, sent back
        walks.append((saved, transient, freed, held * 4))
        pipeline_buffers += s.n_microbatches * stream * ((not first) + (not last))

    held = sum(helds)
    weights, gradients, optimizer = held * 4, held * 4, held * 8
    notes.append(f"pipeline process {process} holds stage{'s' if len(local_stages) > 1 else ''} "
                 f"{', '.join(map(str, local_stages))}: {held:,} of the {acc.total:,} parameters; {s.n_microbatches} "
                 f"micro-batches of {rows} rows, {s.schedule}")
    if s.shards > 1:
        elem = 2 if s.bf16 else 4
        communication = (2 * block_params_max + outside_total) * elem + block_params_max * 4
    elif s.dp > 1:
        communication = held * 4
    else:
        communication = 0
    if s.bf16 and s.shards == 1:
        communication += params_total * 2
        notes.append("includes bf16 weight copies that autocast keeps for backward")

    # The schedule's walk: activations held per local stage, gradients present once a stage's first backward is done.
    live = [0] * len(local_stages)
    done = [False] * len(local_stages)
    peak_live = peak = 0
    for j, op in schedule_ops(s.schedule, s.pp, s.n_microbatches, process):
        saved, transient, freed, grads = walks[j]
        present = sum(walks[i][3] for i in range(len(walks)) if done[i])
        if op == "F":
            live[j] += saved
            peak_live = max(peak_live, sum(live))
            peak = max(peak, sum(live) + present)
            continue
        if done[j]:
            peak = max(peak, sum(live) + transient + present)
        else:  # the first backward of this stage: its gradients appear block by block (plan_memory's walk)
            now = sum(live) + transient + present + (grads - grads_per_block[j] * len(freed))
            peak = max(peak, now)
            for kept in freed:
                now += grads_per_block[j] - kept
                peak = max(peak, now)
            done[j] = True
        live[j] -= saved
    step_peak = max(peak, gradients)
    transient_max = max(w[1] for w in walks)
    allocator = 0
    if s.device == "cpu":
        n_layers = sum(stage_plan.ranges[k][1] - stage_plan.ranges[k][0] for k in local_stages)
        # one micro-batch's sequence-parallel collectives over this process's blocks (and the head's gather)
        collectives = 0 if s.tp == 1 else ((n_layers * 8 + 2 * (stage_plan.stages - 1 in local_stages))
                                           * rows * s.seq_len * m.d_model * (2 if s.bf16 else 4))
        allocator = CPU_RUNTIME_BYTES + round(CPU_RETAINED_GRADIENTS * gradients
                                              + CPU_RETAINED_ACTIVATIONS * (peak_live + transient_max)
                                              + CPU_RETAINED_COLLECTIVES * collectives)
    buffers = buffer_bytes(acc)
    total = weights + buffers + optimizer + communication + pipeline_buffers + step_peak + allocator
    return MemoryPlan(spec.name, s, acc.total, weights, buffers, gradients, optimizer, communication, peak_live,
                      transient_max, allocator, total, notes=notes, pipeline_buffers=pipeline_buffers,
                      process=process)


def held_params(spec: Spec, s: Setup, acc: Accounting | None = None) -> int:
    """Parameters one process holds: every weight but the norms split tp ways (heads, FFN hidden, vocabulary; the
    norms are replicated), routed experts further split ep ways, then FSDP's shards over the data-parallel processes
    (the experts over those that hold the same experts). The whole model's (pp 1); a stage's: `_held`."""
    m = spec.model
    acc = acc or account(spec)
    routed = sum(b.ffn.routed_params(m.d_model) for b in m.blocks())
    norms = acc.by_component["norm"]
    return _held(acc.total - routed - norms, norms, routed, s)


def _held(dense: int, norms: int, routed: int, s: Setup) -> int:
    """held_params' rule for any set of weights: dense split tp ways, norms replicated, then FSDP; routed experts
    split tp · ep ways."""
    per_process = math.ceil(dense / s.tp) + norms
    return math.ceil(per_process / s.shards) + math.ceil(routed / (s.tp * s.ep) / s.expert_shards)


def _tensor_parallel_activations(m: ModelSpec, s: Setup, saved: int, transient: int, freed: list[int]
                                 ) -> tuple[int, int, list[int]]:
    """Under tensor parallelism each process keeps its heads' and hidden units' share of the activations and its
    sequence shard of the residual stream and norms (sequence parallel): a tp-th of what one process keeps, except
    the gathered (whole-sequence) input that the first projections of attention and of the FFN each keep."""
    tokens = s.batch_size * s.seq_len
    mm = 2 if s.bf16 else 4
    gathered = 2 * m.d_model * tokens * mm * (1 - 1 / s.tp)  # per block: the attention's and the FFN's input
    per_block = [math.ceil(k / s.tp + gathered) for k in freed]
    head = saved - sum(freed)
    saved = sum(per_block) + math.ceil(head / s.tp)
    return saved, math.ceil(transient / s.tp), per_block


def sequence_parallel_collective_bytes(m: ModelSpec, s: Setup) -> int:
    """Bytes of the whole-sequence stream that sequence parallelism moves per micro-batch under tp (0 without tp):
    per block, the attention's and the FFN's input all-gathered and their output reduce-scattered, forward and
    backward (the backward of a gather is a reduce-scatter and the other way round), plus the head's gather."""
    if s.tp == 1:
        return 0
    stream = s.batch_size * s.seq_len * m.d_model * (2 if s.bf16 else 4)
    return (m.n_layers * 2 * 2 * 2 + 2) * stream


def _outside_blocks(spec: Spec, acc: Accounting) -> int:
    """Parameters not in the blocks: embeddings, learned positions, final norm, untied head."""
    m = spec.model
    final = m.norm.params(m.d_model) if m.final_norm else 0
    mixers = sum(b.token_mixer.mixer_params(m) for b in m.blocks())  # attention, conv, ...: each layer's mixer
    in_blocks = mixers + acc.by_component["ffn"] + acc.by_component["norm"] - final
    return acc.total - in_blocks


# ── what the device has ─────────────────────────────────────────────────────────────────────────────────────────


def available_memory_bytes() -> int:
    """This machine's available RAM (MemAvailable), or its total when /proc is absent."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def device_memory(device: str, world_size: int = 1) -> tuple[int | None, str]:
    """(bytes one process may use, where the figure comes from). On CPU the node's processes share its RAM."""
    if device == "cpu":
        local = env_int("LOCAL_WORLD_SIZE", 0) or world_size
        have = available_memory_bytes()
        share = f", shared by {local} processes" if local > 1 else ""
        return have // local, f"MemAvailable {gib(have)}{share}"
    import torch

    if not torch.cuda.is_available():
        return None, "no CUDA device here"
    index = env_int("LOCAL_RANK", 0) % torch.cuda.device_count()
    free, total = torch.cuda.mem_get_info(index)
    return int(free * CUDA_MARGIN), f"{CUDA_MARGIN:.0%} of {gib(free)} free on cuda:{index} of {gib(total)}"


# ── the check, and the cheapest fix ─────────────────────────────────────────────────────────────────────────────


def cheapest_fix(spec: Spec, setup: Setup, available: int, accounting: Accounting | None = None
                 ) -> tuple[str, MemoryPlan] | None:
    """The least costly change that makes the run fit, tried in order of cost: a smaller micro-batch with more
    accumulation (the same tokens per step, so the same run), activation checkpointing (one more forward per step),
    both, then FSDP over the same processes (communication). None when nothing short of a smaller model or more
    devices fits."""
    recipe = type(spec.train).model_fields
    candidates: list[tuple[str, Setup]] = []
    smaller = [b for b in range(setup.batch_size - 1, 0, -1) if setup.batch_size % b == 0]

    def batch_fix(s: Setup, b: int) -> tuple[str, Setup]:
        accum = RecipeView(setup.batch_size, setup.grad_accum, setup.seq_len).sequences_per_replica // b
        return (f"--set train.batch_size={b} --set train.grad_accum={accum}",
                replace(s, batch_size=b, grad_accum=accum))

    candidates += [batch_fix(setup, b) for b in smaller]
    if "activation_checkpointing" in recipe and setup.checkpointing != "full":
        ac = replace(setup, checkpointing="full")
        candidates.append(("--set train.activation_checkpointing.kind=full", ac))
        candidates += [(f"--set train.activation_checkpointing.kind=full {fix}", s)
                       for fix, s in (batch_fix(ac, b) for b in smaller)]
    if "parallel" in recipe and setup.dp > 1 and setup.shards == 1:
        fsdp = replace(setup, parallel="fsdp")
        candidates.append(("--set train.parallel.kind=fsdp", fsdp))
        if "activation_checkpointing" in recipe:
            candidates.append(("--set train.parallel.kind=fsdp --set train.activation_checkpointing.kind=full",
                               replace(fsdp, checkpointing="full")))
    for fix, s in candidates:
        plan = plan_memory(spec, s, accounting=accounting)
        if plan.total <= available:
            return fix, plan
    return None


def communication_bytes(spec: Spec, s: Setup, acc: Accounting | None = None) -> int:
    """Bytes one process sends or receives over the network in one optimizer step under `s`'s layout, by axis (the
    ordering `cheapest_layout` uses; element sizes as the plan's: fp32 stream and gradients, bf16 matmul inputs
    under bf16):

    - dp: DDP's ring all-reduce of the gradients, about 2 × their bytes once a step; FSDP's all-gather of the
      parameters in forward and again in backward and reduce-scatter of the gradients, 3 × their bytes per
      accumulated micro-step.
    - tp: sequence parallelism's all-gathers and reduce-scatters of the stream, per block forward and backward
      (`sequence_parallel_collective_bytes`), over this process's blocks.
    - ep: two all-to-alls per MoE layer forward and two backward, each of the top_k routed copies of the tokens.
    - pp: each stage boundary a process touches sends (or receives) one micro-batch's stream forward and its gradient
      backward, for every micro-batch.
    The pipeline bubble ((pp - 1) / (microbatches + pp - 1) of a step idle) is time, not bytes: said beside it."""
    m = spec.model
    acc = acc or account(spec)
    share = max(1, m.n_layers // s.pp) / max(1, m.n_layers)  # of the layers this process runs
    elem = 2 if s.bf16 else 4
    tokens = s.batch_size * s.seq_len  # the replica's micro-step, every pipeline micro-batch of it
    unsharded = _held(*_totals(spec, acc), replace(s, parallel="ddp")) if s.dp > 1 else 0
    if s.pp > 1:
        unsharded = math.ceil(unsharded * share)
    dp = 0 if s.dp == 1 else (3 * unsharded * elem * s.grad_accum if s.shards > 1 else 2 * unsharded * 4)
    tp = round(sequence_parallel_collective_bytes(m, s) * share) * s.grad_accum
    moe = [b.ffn for b in m.blocks() if b.ffn.routed_params(m.d_model)]
    ep = 0 if s.ep == 1 else round(sum(4 * tokens * getattr(f, "top_k", 1) * m.d_model * elem * (s.ep - 1) / s.ep
                                       for f in moe) * share) * s.grad_accum
    boundaries = 0 if s.pp == 1 else 2 * s.stages_per_process
    pp = boundaries * tokens * m.d_model * 4 * s.grad_accum
    return dp + tp + ep + pp


def _totals(spec: Spec, acc: Accounting) -> tuple[int, int, int]:
    """(dense, norm, routed-expert) parameters of the whole model (held_params' split)."""
    routed = sum(b.ffn.routed_params(spec.model.d_model) for b in spec.model.blocks())
    norms = acc.by_component["norm"]
    return acc.total - routed - norms, norms, routed


def bubble(s: Setup) -> float:
    """The idle fraction of a pipeline step: (pp - 1) / (microbatches + pp - 1); interleaved_1f1b's stages per
    process divide the pipeline's depth in time (Narayanan et al. 2021)."""
    if s.pp == 1:
        return 0.0
    depth = (s.pp - 1) / s.stages_per_process
    return depth / (s.n_microbatches + depth)


def cheapest_layout(spec: Spec, setup: Setup, available: int, accounting: Accounting | None = None
                    ) -> tuple[str, MemoryPlan] | None:
    """The layout of the same processes that fits and moves the fewest bytes per step (`communication_bytes`): every
    tp · pp that divides the world (ep kept where it still divides the data-parallel size), with the asked parallel
    kind and with FSDP, without and with activation checkpointing; the global batch (batch_size × grad_accum ×
    data-parallel size) held, so the run learns the same thing: each data-parallel replica takes its share as the
    largest micro-batch up to the asked one (a multiple of pp, the default micro-batch count, under pp) with the
    rest accumulated. Ties go to the fewer model-parallel processes. The fix (`--set` overrides) is validated as a
    spec before it is offered. None when no layout fits."""
    import warnings

    from archspec.spec import load_spec_dict
    from archspec.spec.parallel_plan import divisors

    accounting = accounting or account(spec)
    world, recipe = setup.world_size, type(spec.train).model_fields
    if "parallel" not in recipe or world == 1:
        return None
    total = RecipeView(setup.batch_size, setup.grad_accum, setup.seq_len, setup.dp).global_batch
    explicit_m = getattr(spec.train.parallel, "microbatches", None) is not None
    candidates: list[tuple[int, int, str, Setup]] = []
    for tp in divisors(world):
        for pp in divisors(world // tp):
            dp = world // (tp * pp)
            if dp % setup.ep or total % dp or pp > spec.model.n_layers:
                continue
            rows = total // dp
            fits = [b for b in range(min(rows, max(setup.batch_size, pp)), 0, -1) if rows % b == 0 and b % pp == 0]
            if not fits:
                continue
            b = fits[0]
            kinds = [setup.parallel] + (["fsdp"] if setup.parallel != "fsdp" and dp > 1 else [])
            acs = [setup.checkpointing] + (["full"] if setup.checkpointing != "full"
                                           and "activation_checkpointing" in recipe else [])
            for kind in kinds:
                for ac in acs:
                    s = replace(setup, tp=tp, pp=pp, parallel=kind, checkpointing=ac, batch_size=b,
                                grad_accum=rows // b, microbatches=0)
                    if (tp, pp) == (setup.tp, setup.pp):
                        continue  # the asked layout: cheapest_fix's
                    sets = [f"train.parallel.{k}={v}" for k, v, was in (("tp", tp, setup.tp), ("pp", pp, setup.pp))
                            if v != was]
                    if kind != setup.parallel:
                        sets.append(f"train.parallel.kind={kind}")
                    if ac != setup.checkpointing:
                        sets.append(f"train.activation_checkpointing.kind={ac}")
                    if b != setup.batch_size or rows // b != setup.grad_accum:
                        sets += [f"train.batch_size={b}", f"train.grad_accum={rows // b}"]
                    if explicit_m:
                        sets.append("train.parallel.microbatches=" + (str(pp) if pp > 1 else "null"))
                    candidates.append((communication_bytes(spec, s, accounting), tp * pp, " ".join(
                        f"--set {x}" for x in sets), s))
    candidates.sort(key=lambda c: (c[0], c[1]))
    dumped = spec.model_dump(mode="json")
    for _, _, fix, s in candidates:
        plan = plan_memory(spec, s, accounting=accounting)
        if plan.total > available:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                load_spec_dict(dumped, fix.replace("--set ", "").split(), origin=spec.name)
        except UserError:
            continue  # a layout the model cannot take (heads, experts or layers that tp, ep or pp do not divide)
        return fix, plan
    return None


def planned(spec: Spec, device: str = "cpu", training: bool = True, *, world_size: int = 1,
            setup: Setup | None = None, accounting: Accounting | None = None) -> MemoryPlan:
    """The plan of a run of `spec` on this machine, with what the device has available filled in."""
    s = setup or setup_from_spec(spec, device=device, training=training, world_size=world_size)
    available, source = device_memory(s.device, s.world_size)
    return replace(plan_memory(spec, s, accounting=accounting), available=available, available_source=source)


def refusal(spec: Spec, plan: MemoryPlan, accounting: Accounting | None = None) -> UserError:
    """The error for a plan that does not fit: the estimate, the setup, and the cheapest fix."""
    s, available = plan.setup, plan.available or 0
    what = ", ".join(f"{name} {gib(n)}" for name, n in plan.rows() if n)
    problems = [f"estimate: {what}", f"setup: {s.describe()}"]
    fix = cheapest_fix(spec, s, available, accounting) if s.training else None
    layout = cheapest_layout(spec, s, available, accounting) if s.training else None
    if fix:
        problems.append(f"cheapest fix: {fix[0]} (estimate {gib(fix[1].total)})")
    elif s.training and not layout:
        floor = plan.weights + plan.buffers + plan.gradients + plan.optimizer
        problems.append(f"no micro-batch, checkpointing, sharding or layout setting on {s.world_size} "
                        f"process{'es' if s.world_size > 1 else ''} fits (weights, gradients and AdamW state alone: "
                        f"{gib(floor)}): shard over more devices with FSDP, or shrink the model")
    if layout:
        ls = layout[1].setup
        axes = " × ".join(f"{k} {v}" for k, v in (("dp", ls.dp), ("tp", ls.tp), ("ep", ls.ep), ("pp", ls.pp))
                          if v > 1 or k == "dp")
        moved = communication_bytes(spec, ls, accounting) / (1 << 20)
        idle = f", pipeline bubble {bubble(ls):.0%}" if ls.pp > 1 else ""
        problems.append(f"cheapest layout on {s.world_size} processes that fits: {axes} ({ls.parallel}"
                        f"{', activation checkpointing' if ls.checkpointing == 'full' else ''}): {layout[0]} "
                        f"(estimate {gib(layout[1].total)}; {moved:,.0f} MiB moved per process per step{idle})")
    else:
        problems.append("shrink the model or use a machine with more memory")
    return UserError(f"{spec.name}: needs about {gib(plan.total)} per {s.device} device but {gib(available)} is "
                     f"available ({plan.available_source})", problems)


def check_memory(spec: Spec, for_training: bool = False, device: str = "cpu", *, world_size: int = 1,
                 setup: Setup | None = None, accounting: Accounting | None = None) -> MemoryPlan:
    """Refuse (UserError, exit 2) a run that will not fit, naming the estimate and the cheapest fix; else return
    the plan. On a CUDA device that is not here the plan cannot be checked and is returned as is.

    for_training: weights only (False: `build`'s forward) or a full training step. device: cpu | cuda.
    world_size: processes in the job (FSDP shards over them; on CPU they share this node's RAM). accounting:
    `account(spec)` when the caller has it (computed here otherwise, once for the plan and every fix tried)."""
    accounting = accounting or account(spec)
    plan = planned(spec, device, for_training, world_size=world_size, setup=setup, accounting=accounting)
    if not plan.fits:
        raise refusal(spec, plan, accounting)
    return plan
