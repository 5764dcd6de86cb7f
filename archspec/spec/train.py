"""The training recipe (`train:` in a spec). Every field has a default, so a spec may omit `train:` entirely."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from archspec.spec.kinds import Strict as _Strict
from archspec.spec.kinds import kind_union


EVAL_POINTS = 10  # evaluations per run when eval_interval is not given: enough points for a curve at any budget

# ── corpus sources ───────────────────────────────────────────────────────────────────────────────────────────────


MAX_STEPS = 10_000_000  # optimizer steps of one run at most (also the limit of every --steps option)

class StdlibCorpus(_Strict):
    kind: Literal["stdlib"] = "stdlib"  # the running Python's standard-library sources: ~13 MB, always present


class FilesCorpus(_Strict):
    kind: Literal["files"] = "files"  # text files, directories (recursively) and .jsonl files (their `text` field)
    paths: list[str] = Field(min_length=1)


# Capability tasks (archspec.train.tasks): synthetic examples written in the byte tokenizer's ids, generated from
# their own `seed` (the data, the same for every training seed), each exactly train.seq_len + 1 tokens, with loss and
# accuracy on the answer positions only. Id layout and the rules that tie them to train.seq_len: archspec.train.tasks.


class MQARCorpus(_Strict):
    kind: Literal["mqar"] = "mqar"  # multi-query associative recall (Zoology, Arora et al. 2023)
    vocab: int = Field(64, ge=4, le=252, description="symbols: keys are drawn from the first half, values from the "
                                                     "second (chance accuracy 2/vocab)")
    pairs: int = Field(8, ge=1, le=126, description="key-value pairs at the start of each example (distinct keys)")
    queries: int | None = Field(None, ge=1, le=126, description="keys queried after the pairs, each followed by its "
                                                                "value (the answer); default: pairs (every key once)")
    train_examples: int = Field(20_000, ge=1, le=2_000_000)
    val_examples: int = Field(1_000, ge=1, le=100_000, description="the fixed validation set (its own stream)")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="draws the examples (not the training order: train.seed)")


class PasskeyCorpus(_Strict):
    kind: Literal["passkey"] = "passkey"  # a passkey inside filler, asked for at the end (Mohtashami & Jaggi 2023)
    vocab: int = Field(16, ge=2, le=250, description="passkey symbols (chance accuracy 1/vocab)")
    key_len: int = Field(1, ge=1, le=16, description="tokens per passkey")
    distances: list[int] = Field(default_factory=lambda: [16, 32, 64], min_length=1, max_length=64,
                                 description="tokens from the passkey to the question; each example takes one, and "
                                             "accuracy is also reported per distance")
    filler: int = Field(64, ge=1, le=248, description="filler symbols (drawn at random around the passkey)")
    train_examples: int = Field(20_000, ge=1, le=2_000_000)
    val_examples: int = Field(1_000, ge=1, le=100_000, description="the fixed validation set (its own stream)")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="draws the examples (not the training order: train.seed)")


Corpus = kind_union(StdlibCorpus, FilesCorpus, MQARCorpus, PasskeyCorpus, default="stdlib")
TASK_CORPORA = ("mqar", "passkey")


# ── tokenizers ───────────────────────────────────────────────────────────────────────────────────────────────────


class ByteTokenizer(_Strict):
    kind: Literal["byte"] = "byte"  # 256 byte values + specials (EOS)


class BPETokenizer(_Strict):
    kind: Literal["bpe"] = "bpe"  # byte-level BPE trained locally with HF tokenizers, cached by content hash
    vocab_size: int | None = Field(None, ge=260, le=1 << 20, description="default: model.vocab_size")


Tokenizer = kind_union(ByteTokenizer, BPETokenizer, default="byte")


class DataSpec(_Strict):
    corpus: Corpus = Field(default_factory=StdlibCorpus)
    tokenizer: Tokenizer = Field(default_factory=ByteTokenizer)
    val_fraction: float = Field(0.02, gt=0.0, lt=0.5)


# ── how the work is spread and how activations are kept (stored with a run, not part of its identity) ──────────


class DDPParallel(_Strict):
    kind: Literal["ddp"] = "ddp"  # a full replica per process, gradients all-reduced (one process: plain training)


class FSDPParallel(_Strict):
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
    weight_decay: float = Field(0.1, ge=0.0, le=10.0, description="AdamW decay on ≥2-D weights only")
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.95, ge=0.0, lt=1.0)
    adam_eps: float = Field(1e-8, gt=0.0, le=1.0)
    grad_clip: float = Field(1.0, ge=0.0, description="max global grad norm; 0 disables clipping")
    eval_interval: int | None = Field(
        None, ge=1, description="steps between evaluations (the last step is always evaluated); default: about ten "
                                "evaluations per run, ceil(steps / 10)")
    # 65,536 target tokens: at the ablation presets' size the evaluation noise this leaves (~0.003 nats) is a tenth of
    # the seed-to-seed spread (~0.03), measured by bench/eval_noise.py (docs/ABLATIONS.md). Capped by the split.
    eval_tokens: int = Field(65_536, ge=1, le=1 << 30, description="target tokens in the fixed validation set "
                             "(whole windows of seq_len, spread over the validation split; at most the split)")
    checkpoint_interval: int = Field(0, ge=0, description="steps between checkpoints; 0: only at the end")
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    compile: bool = True  # torch.compile per block; `archspec train --no-compile` overrides it
    parallel: Parallel = Field(default_factory=DDPParallel)  # under torchrun; see archspec.train.parallel
    activation_checkpointing: ActivationCheckpointing = Field(default_factory=NoCheckpointing)
    data: DataSpec = Field(default_factory=DataSpec)

    @property
    def eval_every(self) -> int:
        """Steps between evaluations: `eval_interval`, or about ten points a curve whatever the steps."""
        return self.eval_interval or max(1, math.ceil(self.steps / EVAL_POINTS))
