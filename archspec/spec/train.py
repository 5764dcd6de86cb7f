"""The training recipe (`train:` in a spec). Every field has a default, so a spec may omit `train:` entirely."""

from __future__ import annotations

import math
from typing import Annotated, Literal, get_args

from pydantic import Field, field_validator

from archspec.data import data_family  # registers the built-in data kinds (archspec.data)
from archspec.data.base import bind as _bind_data
# The built-in data kinds' classes, for code that names one directly (tests, strategies).
from archspec.data.corpus.files import FilesCorpus  # noqa: F401
from archspec.data.corpus.mqar import MQARCorpus  # noqa: F401
from archspec.data.corpus.passkey import PasskeyCorpus  # noqa: F401
from archspec.data.corpus.stdlib import StdlibCorpus  # noqa: F401
from archspec.data.tokenizer.bpe import BPETokenizer  # noqa: F401
from archspec.data.tokenizer.byte import ByteTokenizer  # noqa: F401
from archspec.spec.kinds import Strict as _Strict
from archspec.spec.kinds import kind_union
from archspec.kinds.base import EPS_MIN, Since
from archspec.spec.legacy import note


# Where a run is recorded besides the registry (archspec.train.sinks): each an optional extra, `archspec[<name>]`.
LogSink = Literal["tensorboard", "wandb", "mlflow"]

# ── how much evaluation a run does when its recipe does not say (observation, not identity) ──────────────────────
# The rule (docs/budgets.md): all of a run's evaluations together read at most EVAL_SHARE of the tokens it trains on
# (a forward pass costs a third of a training step per token, so about a seventh of the run's compute), in
# EVAL_POINTS evaluations of EVAL_SHARE · train tokens / EVAL_POINTS tokens each, that size held between a floor and
# a cap. The floor is where the validation set's own noise stops exceeding the seed-to-seed spread (16,384 tokens:
# 0.92× the seed std at the ablation presets, bench/eval_noise.py, docs/ABLATIONS.md); the cap is where more tokens
# no longer pay (65,536: a third of the seed std, the default before this rule). When the floor binds (a short run),
# the run evaluates fewer times instead, EVAL_SHARE · train tokens / floor, but never fewer than MIN_EVAL_POINTS.
EVAL_POINTS = 10  # evaluations per run when eval_interval is not given: enough points for a curve at any budget
MIN_EVAL_POINTS = 4  # the fewest a short run gets, so a curve is still a curve
EVAL_SHARE = 0.5
EVAL_TOKENS_FLOOR = 16_384
EVAL_TOKENS_CAP = 65_536


def auto_eval_tokens(train_tokens: int) -> int:
    """Validation tokens per evaluation by the budget rule, for a run that trains on `train_tokens` tokens."""
    return int(min(EVAL_TOKENS_CAP, max(EVAL_TOKENS_FLOOR, math.ceil(EVAL_SHARE * train_tokens / EVAL_POINTS))))


def auto_eval_points(train_tokens: int, eval_tokens: int) -> int:
    """Evaluations per run by the budget rule: EVAL_POINTS, fewer when even the floor-sized set would take the run's
    evaluation past EVAL_SHARE of its training tokens, but at least MIN_EVAL_POINTS."""
    return int(min(EVAL_POINTS, max(MIN_EVAL_POINTS, math.ceil(EVAL_SHARE * train_tokens / max(1, eval_tokens)))))


def rescaled_interval(eval_interval: int, spec_steps: int, steps: int) -> int:
    """A spec's eval_interval for a run of `steps` steps instead of its `spec_steps` (`train --steps N`): the interval
    is read as a number of points per run (a preset's `eval_interval: 25` of 100 steps is four points), so a short run
    still gets its points and a long one no more than it asked for."""
    points = max(1, math.ceil(spec_steps / eval_interval))
    return max(1, math.ceil(steps / points))


def resolved_eval(steps: int, tokens_per_step: int, eval_interval: int | None,
                  eval_tokens: int | None) -> tuple[int, int]:
    """(steps between evaluations, validation tokens per evaluation) of a recipe: what it states, else the rule. The
    one place the defaults are decided (the loop, the estimates and the reports of recorded runs call it)."""
    train_tokens = steps * tokens_per_step
    size = eval_tokens or auto_eval_tokens(train_tokens)
    if eval_interval:
        return eval_interval, size
    points = auto_eval_points(train_tokens, size) if eval_tokens is None else EVAL_POINTS
    return max(1, math.ceil(steps / points)), size

MAX_STEPS = 10_000_000  # optimizer steps of one run at most (also the limit of every --steps option)

# ── corpora and tokenizers: each kind is a unit of archspec.data, and these unions are built from its registry ──

Corpus = data_family("corpus").union()
Tokenizer = data_family("tokenizer").union()


class DataSpec(_Strict):
    corpus: Corpus = Field(default_factory=data_family("corpus").members[data_family("corpus").default])
    tokenizer: Tokenizer = Field(default_factory=data_family("tokenizer").members[data_family("tokenizer").default])
    val_fraction: float = Field(0.02, gt=0.0, lt=0.5)


_bind_data("corpus", DataSpec, "corpus")
_bind_data("tokenizer", DataSpec, "tokenizer")


# ── how the work is spread and how activations are kept (stored with a run, not part of its identity) ──────────


PipelineSchedule = Literal["gpipe", "1f1b", "interleaved_1f1b"]
PIPELINE_SCHEDULES: tuple[str, ...] = get_args(PipelineSchedule)


class _Layout(_Strict):
    """How the processes of a job are laid out on a device mesh (archspec.train.mesh): pp · dp · tp = world size, the
    data-parallel size dp = world / (tp · pp); ep divides dp (the experts of an MoE layer are spread over ep of the
    data-parallel ranks). All 1: every process is a data-parallel replica, as before these fields existed."""

    tp: Annotated[int, Since("0.4")] = Field(
        1, ge=1, le=1024, description="tensor-parallel degree: each matmul split over this many processes (heads, FFN "
                                      "hidden, vocabulary), activations sequence-parallel between them")
    ep: Annotated[int, Since("0.4")] = Field(
        1, ge=1, le=1024, description="expert-parallel degree: an MoE layer's experts spread over this many "
                                      "data-parallel processes, tokens sent to their expert's process (all-to-all)")
    pp: Annotated[int, Since("0.4")] = Field(
        1, ge=1, le=1024, description="pipeline-parallel stages: the layers split into this many consecutive stages "
                                      "by cost (archspec.train.stages), one per group of processes")
    schedule: Annotated[PipelineSchedule, Since("0.5")] = Field(
        "1f1b", description="pipeline schedule (pp > 1): gpipe (every forward, then every backward), 1f1b (one "
                            "forward, one backward: at most pp micro-batches' activations held), interleaved_1f1b "
                            "(two stages per process, a smaller bubble for more messages)")
    microbatches: Annotated[int | None, Since("0.5")] = Field(
        None, ge=1, le=4096, description="pipeline micro-batches each replica's batch is split into (pp > 1; "
                                         "default pp): the bubble is (pp - 1) / (microbatches + pp - 1) of a step")


class DDPParallel(_Layout):
    kind: Literal["ddp"] = "ddp"  # a full replica per process, gradients all-reduced (one process: plain training)


class FSDPParallel(_Layout):
    kind: Literal["fsdp"] = "fsdp"  # FSDP2: weights, gradients and AdamW state sharded over the processes, per block
    reshard_after_forward: bool = Field(
        True, description="free each block's gathered weights after its forward (gather again in backward); "
                          "false keeps them until backward: more memory, less communication")


Parallel = kind_union(DDPParallel, FSDPParallel, default="ddp")


class NoCheckpointing(_Strict):
    kind: Literal["none"] = "none"  # every block keeps its activations for backward


class FullCheckpointing(_Strict):
    kind: Literal["full"] = "full"  # every block keeps only its input and recomputes the rest in backward


class EveryKCheckpointing(_Strict):
    kind: Literal["every_k"] = "every_k"  # blocks 0, k, 2k, ... are checkpointed; the others keep their activations
    k: int = Field(2, ge=1, le=4096)


ActivationCheckpointing = kind_union(NoCheckpointing, FullCheckpointing, EveryKCheckpointing, default="none")


# ── the optimizer (archspec.train.optim): which one updates the weights; part of a run's identity ───────────────


class AdamWOptimizer(_Strict):
    """AdamW over every parameter (decay on matrices only): its settings are the recipe's own lr, beta1, beta2,
    adam_eps and weight_decay, as before this field existed."""

    kind: Literal["adamw"] = "adamw"


class MuonOptimizer(_Strict):
    """Muon (torch.optim.Muon: momentum, then Newton–Schulz orthogonalization of the update) for the blocks' 2-D
    hidden matrices; AdamW, with the recipe's own settings, for the embedding, head, norms, biases, routers and gates
    and anything not 2-D (docs/optimizers.md states the split). Both follow the recipe's schedule."""

    kind: Literal["muon"] = "muon"
    lr: float | None = Field(
        None, gt=0.0, le=10.0, description="Muon's peak rate (the schedule's shape is train.lr's); default train.lr "
                                           "itself, which lr_sweep sweeps: with adjust_lr_fn match_rms_adamw Muon's "
                                           "update has AdamW's RMS, so one rate serves both")
    weight_decay: float | None = Field(
        None, ge=0.0, le=10.0, description="Muon's decoupled decay (lr · weight_decay per step); default "
                                           "train.weight_decay")
    momentum: float = Field(0.95, ge=0.0, lt=1.0, description="momentum of the gradient buffer")
    nesterov: bool = Field(True, description="Nesterov momentum: orthogonalize g + momentum · buffer")
    ns_steps: int = Field(5, ge=1, le=99, description="Newton–Schulz iterations (torch takes fewer than 100)")
    adjust_lr_fn: Literal["match_rms_adamw", "original"] = Field(
        "match_rms_adamw", description="per-matrix rate scale: match_rms_adamw (Moonshot: 0.2 · sqrt(max(A, B)), "
                                       "AdamW's rate and decay carry over) or original (Keller Jordan's "
                                       "sqrt(max(1, A/B)), rates around 0.02)")


Optimizer = kind_union(AdamWOptimizer, MuonOptimizer, default="adamw")


# How torch.compile is applied (archspec.train.compile.resolve_compile). Stored with a run, not identity.
CompileMode = Literal["auto", "none", "per_block", "whole", "cudagraphs"]
COMPILE_MODES = get_args(CompileMode)


class TrainSpec(_Strict):
    seed: int = Field(0, ge=0, le=2**31 - 1, description="model init, data order and dropout")
    steps: int = Field(200, ge=1, le=MAX_STEPS, description="optimizer steps; also the length of the schedule")
    batch_size: int = Field(8, ge=1, le=65536, description="sequences per micro-batch (per process)")
    # tokens per optimizer step = batch_size · seq_len · grad_accum · processes
    grad_accum: int = Field(1, ge=1, le=4096)
    seq_len: int | None = Field(None, ge=1, description="training window; default model.context_length")
    lr: float = Field(3e-4, gt=0.0, le=10.0, description="peak learning rate")
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="cosine floor as a fraction of lr")
    warmup_steps: int = Field(20, ge=0, description="linear warmup from lr/warmup_steps to lr")
    # adamw (default: as before this field) | muon (archspec.train.optim). At its default it is left out of the run
    # key (Since), so every run recorded before it keeps its id.
    optimizer: Annotated[Optimizer, Since("0.6")] = Field(
        default_factory=AdamWOptimizer, description="adamw | muon (Muon for the blocks' 2-D hidden matrices, AdamW "
                                                    "for the rest)")
    weight_decay: float = Field(0.1, ge=0.0, le=10.0, description="AdamW decay on ≥2-D weights only")
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.95, ge=0.0, lt=1.0)
    adam_eps: float = Field(1e-8, ge=EPS_MIN, le=1.0)
    grad_clip: float = Field(1.0, ge=0.0, description="max global grad norm; 0 disables clipping")
    eval_interval: int | None = Field(
        None, ge=1, description="steps between evaluations (the last step is always evaluated); default: about ten "
                                "evaluations per run, ceil(steps / 10), fewer (at least 4) for a run too short to "
                                "afford them (the budget rule, docs/budgets.md)")
    # Default: the budget rule above (resolved_eval): half the run's training tokens over ten evaluations, each between
    # 16,384 and 65,536 tokens. Capped by the split. Observation, not identity (archspec.train.logger.NOT_IDENTITY).
    eval_tokens: int | None = Field(None, ge=1, le=1 << 30, description="target tokens in the fixed validation set "
                                    "(whole windows of seq_len, spread over the validation split; at most the "
                                    "split); default: the budget rule, half the run's training tokens over its "
                                    "evaluations, between 16,384 and 65,536 (docs/budgets.md)")
    checkpoint_interval: int = Field(0, ge=0, description="steps between checkpoints; 0: only at the end")
    # auto: bf16 autocast on CUDA, fp32 on CPU. fp16: autocast fp16 with dynamic loss scaling (torch.amp.GradScaler;
    # an overflowed step is skipped). fp8: torchao's float8 training of the quantizable linears (archspec.quant's
    # units decide which) on a CUDA device with FP8 (compute capability ≥ 8.9), bf16 autocast for the rest.
    precision: Literal["auto", "fp32", "bf16", "fp16", "fp8"] = "auto"
    fp8_scaling: Annotated[Literal["tensorwise", "rowwise"], Since("0.4")] = Field(
        "tensorwise", description="precision fp8: one scale per tensor, or per row (torchao's float8 recipes)")
    # How the model is compiled (archspec.train.compile): auto picks by device and size from measured figures (its
    # reason is printed); none: eager; per_block: each block (one graph serves identical blocks); whole: the whole
    # model one graph; cudagraphs: whole, replayed as CUDA graphs (mode="reduce-overhead"). `--no-compile`: none.
    compile: CompileMode = Field("auto", description="auto | none | per_block | whole | cudagraphs; "
                                 "`archspec train --no-compile` is none")
    parallel: Parallel = Field(default_factory=DDPParallel)  # under torchrun; see archspec.train.parallel
    activation_checkpointing: ActivationCheckpointing = Field(default_factory=NoCheckpointing)
    data: DataSpec = Field(default_factory=DataSpec)
    # Per-layer stability metrics at each evaluation (archspec.train.metrics.StabilityProbe): observation, not identity
    # (archspec.train.logger.NOT_IDENTITY); off unless asked, so a run records exactly the rows it did before.
    stability: Annotated[bool, Since("0.4")] = Field(
        False, exclude_if=lambda v: not v, description="record per-layer activation RMS, max attention logit, gradient and update norms and loss "
                           "spikes at each evaluation (`stability.*` metrics)")
    # Left out of the spec's JSON when empty, so a spec or run without sinks records exactly what it did before.
    log_to: list[LogSink] = Field(
        default_factory=list, exclude_if=lambda v: not v, description="also send the run's params, metrics and summary to these trackers "
                                          "(tensorboard, wandb, mlflow); the registry stays the record. "
                                          "`--log-to` replaces it")

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_spelling(cls, value):
        """The boolean spelling of earlier releases: true was the per-block compile, false eager."""
        if isinstance(value, bool):
            new = "per_block" if value else "none"
            note(f"train.compile: {str(value).lower()} is now train.compile: {new} (modes: "
                 f"{' | '.join(COMPILE_MODES)}); loaded as that")
            return new
        return value

    @property
    def tokens_per_step(self) -> int:
        """Tokens one process trains on per optimizer step (the rule reads the recipe alone, not the world size)."""
        from archspec.recipe import RecipeView

        return RecipeView.of(self).tokens_per_replica_step

    @property
    def eval_every(self) -> int:
        """Steps between evaluations: `eval_interval`, or the budget rule's (about ten points a curve)."""
        return resolved_eval(self.steps, self.tokens_per_step, self.eval_interval, self.eval_tokens)[0]

    @property
    def eval_size(self) -> int:
        """Target validation tokens per evaluation: `eval_tokens`, or the budget rule's."""
        return resolved_eval(self.steps, self.tokens_per_step, self.eval_interval, self.eval_tokens)[1]
