"""The unit contract: the base class of every spec class, one base per family, and the registry of kinds.

Nothing here imports the rest of archspec: the spec classes (`archspec.spec.model`) are built from this registry,
and a unit needs no more than its family's base class to be complete.
"""

from __future__ import annotations

import inspect
import math
from abc import abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, ClassVar, Iterable, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, ValidationInfo, field_validator
from pydantic.fields import FieldInfo

if TYPE_CHECKING:  # pragma: no cover
    from hypothesis.strategies import SearchStrategy

    from archspec.kinds.hf import HFConfig, HFType, HFWeight
    from archspec.spec.model import ModelSpec, Spec

Problem = tuple[tuple[str, ...], str, Any]  # (field path, message, offending value): see archspec.spec.rules

_NUMBERS = (int, float, int | None, float | None)

# The least epsilon a spec takes (norms, Adam). A norm of a zero vector (a token an MoE dropped, under a post-norm)
# is 0 · rsqrt(eps): finite for any eps that is not zero in float32, but its gradient scales as eps^-1.5, which
# overflows float32 and bfloat16 (3.4e38) below about 2e-26 and gives NaN. 1e-20 keeps it under 1e30.
EPS_MIN = 1e-20


# ── identity: fields added after a hash was fixed ────────────────────────────────────────────────────────────────


class _Since:
    """Annotation marker (see `Since`)."""

    __slots__ = ("version",)

    def __init__(self, version: str) -> None:
        self.version = version

    def __repr__(self) -> str:  # pragma: no cover
        return f"Since({self.version!r})"


def Since(version: str) -> _Since:
    """Mark a field added after model hashes and run ids were in use: `x: Annotated[float, Since("0.4")] = 1.0`.
    At its default the field is left out of the identity dump (`identity_dump`), so every spec written before it
    existed keeps its model hash and its runs' ids; set to anything else it is part of the identity like any field."""
    return _Since(version)


def _since(info: FieldInfo) -> bool:
    return any(isinstance(m, _Since) for m in info.metadata)


def identity_dump(model: BaseModel) -> dict[str, Any]:
    """`model.model_dump(mode="json")` without the `Since` fields that hold their defaults, at every depth: what
    the model hash and the run key are taken over."""
    return _drop_new_defaults(model, model.model_dump(mode="json"))


def _drop_new_defaults(value: Any, dumped: Any) -> Any:
    if isinstance(value, BaseModel) and isinstance(dumped, dict):
        clean = value.identity_clean_fields() if hasattr(value, "identity_clean_fields") else ()
        for name, info in type(value).model_fields.items():
            if name not in dumped or name in clean:  # dumped by identity_dump already, maybe from another object
                continue
            current = getattr(value, name)
            if _since(info) and current == info.get_default(call_default_factory=True):
                del dumped[name]
            elif isinstance(current, BaseModel) and dumped[name] != current.model_dump(mode="json"):
                continue  # a serializer wrote something else there (per-layer groups' canonical form): its own
            else:
                dumped[name] = _drop_new_defaults(current, dumped[name])
        return dumped
    if isinstance(value, (list, tuple)) and isinstance(dumped, list) and len(value) == len(dumped):
        return [_drop_new_defaults(v, d) for v, d in zip(value, dumped)]
    if isinstance(value, dict) and isinstance(dumped, dict):
        return {k: _drop_new_defaults(value.get(k), d) for k, d in dumped.items()}
    return dumped


# ── the base of every spec class ─────────────────────────────────────────────────────────────────────────────────


class Strict(BaseModel):
    """Unknown keys are errors, NaN/inf are refused, assignments are validated too, and booleans are not numbers.

    Numbers stay lax otherwise: PyYAML reads `3e-4` (no dot) as a string, and pydantic turns it into the float the
    user meant. But `n_layers: yes` must not quietly become one layer, nor `bias: 1` true.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _booleans_are_not_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        annotation = cls.model_fields[info.field_name].annotation
        if isinstance(value, bool) and annotation in _NUMBERS:
            raise ValueError(f"expected a number, got {str(value).lower()}")
        if annotation in (bool, bool | None) and value is not None and not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value


# Every union built here, so the JSON Schema can mark which member an omitted `kind` selects (archspec.spec).
_UNION_DEFAULTS: dict[type[BaseModel], bool] = {}


def kind_union(*members: type[BaseModel], default: str | None) -> Any:
    """A union discriminated on `kind`, where an omitted kind means `default` (`norm: {eps: 1e-6}` is an RMSNorm), or
    is refused when `default` is None (a family with no natural default, such as the token mixers).

    Each member declares `kind: Literal[...]`; the tag is read from that literal, so there is one source of truth.
    """
    kinds = [m.model_fields["kind"].default for m in members]
    assert default is None or default in kinds, (default, kinds)
    for m, k in zip(members, kinds):
        _UNION_DEFAULTS[m] = _UNION_DEFAULTS.get(m, False) or k == default

    def pick(value: Any) -> str | None:
        if isinstance(value, dict):
            kind = value.get("kind", default)
            return kind if isinstance(kind, str) else None
        return getattr(value, "kind", None)

    return Annotated[
        Union[tuple(Annotated[m, Tag(k)] for m, k in zip(members, kinds))],
        Discriminator(
            pick,
            custom_error_type="invalid_kind",
            custom_error_message=f"kind must be one of {', '.join(repr(k) for k in kinds)}",
        ),
    ]


def is_default_member(cls: type[BaseModel]) -> bool:
    """Whether `cls` is the member an omitted `kind` selects in some union (its `kind` may then be left out)."""
    return _UNION_DEFAULTS.get(cls, False)


# ── literals: the only way a spec value reaches generated source ────────────────────────────────────────────────


def lit_int(x: Any) -> str:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"expected int, got {x!r}")
    return str(int(x))


def lit_float(x: Any) -> str:
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"non-finite value {x!r}")
    return repr(x)


def lit_bool(x: Any) -> str:
    if not isinstance(x, bool):
        raise TypeError(f"expected bool, got {x!r}")
    return repr(x)


@dataclass(frozen=True)
class Const:
    """A module-level constant of the generated file: `NAME = value  # why`. `value` must be a Python literal made
    by the lit_* helpers (or a known word)."""

    name: str
    value: str
    why: str = ""

    @property
    def line(self) -> str:
        return f"{self.name} = {self.value}" + (f"  # {self.why}" if self.why else "")


# ── tensor parallelism: what each unit's module becomes when its matmuls are split over tp processes ───────────
# Torch-free: a unit declares its plan here; archspec.train.tensor_parallel turns it into torch's parallel styles
# (parallelize_module). Between modules the residual stream is each rank's sequence shard, a plain (B, T/tp, D)
# tensor: a module whose plan gathers its input sees the whole sequence and hands back its output sequence-sharded
# (a rowwise projection reduce-scatters it), a norm works on the shard itself.


@dataclass(frozen=True)
class Split:
    """What tensor parallelism does to one submodule (or, named "", to the unit's module itself).

    style `colwise`: a Linear's output features split over the ranks (its input is the whole sequence); `parts`: the
    row counts of a fused weight's parts (q, k, v), each part split evenly, so that rank r holds part i's r-th slice
    of every part · `rowwise`: a Linear's input features split, the partial products reduce-scattered over the
    sequence · `sequence`: parameters replicated, the input a shard along `dim` (1: the sequence; a per-head norm
    inside attention: the heads, dim 1 of (B, heads, T, head_dim)) · `gather`: the module's first input all-gathered
    over the sequence (what it returns is already sequence-sharded, by a rowwise projection inside) · `around`: the
    same gather, and its output (whole sequence, equal on every rank) split back over the sequence · `vocab`: the
    token embedding split by vocabulary rows (its output reduce-scattered over the sequence), or the head split by
    vocabulary columns (its input the sequence shard, its logits left vocabulary-sharded for the loss) · `delegate`:
    the
    module is handed to `fn` ("package.module:function", called as fn(module, tp_mesh)), which takes and returns the
    sequence shard itself."""

    style: Literal["colwise", "rowwise", "sequence", "gather", "around", "vocab", "delegate"]
    parts: tuple[int, ...] = ()
    dim: int = 1
    replicated_output: bool = False  # colwise: all-gather the output (an embedding's features) instead of sharding it
    fn: str = ""


@dataclass(frozen=True)
class Divides:
    """A count tp must divide for this plan: `value` at field `path` (relative to the unit's path, or from the top
    when it starts with "model": `("model", "d_model")`), and the field's name for the message."""

    path: tuple[str, ...]
    value: int
    what: str


@dataclass(frozen=True)
class TPPlan:
    """A unit's tensor-parallel plan: `splits` by submodule name inside the unit's module ("" the module itself);
    `sliced`: attributes of the module holding a slice of its heads (ALiBi's slopes: which heads it computes), name →
    the global count (rank r: its contiguous share, as it holds its heads' rows of the weights; every other per-head
    count the generated code reads off the weights' shapes); `divides`: the counts tp must divide; `refused`: (field path relative to the unit,
    why) when this configuration of the kind cannot be split."""

    splits: dict[str, Split] = field(default_factory=dict)
    sliced: dict[str, int] = field(default_factory=dict)
    divides: tuple[Divides, ...] = ()
    refused: tuple[tuple[str, ...], str] | None = None


# ── units ────────────────────────────────────────────────────────────────────────────────────────────────────────


class KindUnit(Strict):
    """One kind of one family. Subclasses declare `kind: Literal["..."] = "..."` and their own fields, and override
    the hooks of their family's base class. The template is `<kind>.py.j2` beside the module defining the class
    (set `template` to another file name, relative to that module)."""

    family: ClassVar[str]
    template: ClassVar[str | None] = None
    prefix: ClassVar[str | None] = None  # see class_prefix
    # Code several kinds call (sparse attention's kernels, the MoE grouped GEMM, the KV caches) is not rendered: it
    # lives once in archspec.runtime, and a generated file imports the names it uses.

    # spec
    def fill_defaults(self, m: "ModelSpec") -> None:
        """Write defaults that depend on other fields (so writing them explicitly keeps the hash)."""

    def problems(self, m: "ModelSpec", path: tuple[str, ...]) -> list[Problem]:
        """Rules relating this kind's fields to the rest of the model; `path` is where this unit sits."""
        return []

    def model_options(self, m: "ModelSpec", written: set[str]) -> tuple[dict[str, Any], list[str]]:
        """Model-level options an old spelling of this unit's fields stood for, and the notes to show for them:
        ModelSpec writes the options (refusing one that contradicts a model field the user wrote, `written`) and
        shows the notes (archspec.spec.legacy). The unit clears its old field itself."""
        return {}, []

    # tensor parallelism (archspec.train.tensor_parallel; the rules in archspec.spec.rules)
    def tensor_parallel(self, m: "ModelSpec") -> TPPlan | None:
        """What tensor parallelism does to this unit's module (see TPPlan). Default None: this kind has no
        tensor-parallel plan, and a spec using it is refused under train.parallel.tp > 1, naming the kind."""
        return None

    # weight quantization (archspec.quant)
    def quantized_weights(self, module: "torch.nn.Module") -> list[str]:
        """The parameters of this unit's module (names inside it) that weight-only quantization may store in int8 or
        int4. Default: none (norms and positions stay as trained); attention and FFN kinds quantize their matrices,
        and a kind keeps what must stay precise by overriding (MoE: its router). `archspec quantize` asks each
        layer's units, and says what they kept in the evaluation it records."""
        return []

    # the optimizer (archspec.train.optim)
    def hidden_matrices(self, module: "torch.nn.Module") -> list[str]:
        """The parameters of this unit's module (names inside it) that `train.optimizer: muon` orthogonalizes: its
        2-D hidden matrices. Default: the 2-D ones among `quantized_weights`, the unit's projections (so a MoE's router
        and shared-expert gate, kept out there, stay with AdamW; its stacked 3-D expert banks are not 2-D, which
        torch.optim.Muon requires); a kind overrides to say otherwise."""
        params = dict(module.named_parameters())
        return [n for n in self.quantized_weights(module) if params[n].ndim == 2]

    # codegen
    def constants(self, m: "ModelSpec") -> list[Const]:
        return []

    # training
    def cuda_graph_refusal(self, m: "ModelSpec", device_type: str) -> str | None:
        """Why a model with this unit cannot be captured as CUDA graphs (`train.compile: cudagraphs`, which then
        falls back to whole, archspec.train.compile), or None: it can."""
        return None

    # generation
    def decode_compile_refusal(self, m: "ModelSpec") -> str | None:
        """Why a model with this unit cannot decode through one compiled graph (`archspec sample --compile`, which
        then decodes eager, archspec.sample.resolve_decode_compile), or None: it can."""
        return None

    def describe(self, m: "ModelSpec") -> str:
        """A few words for the generated file's docstring."""
        return str(getattr(self, "kind", type(self).__name__))

    def template_context(self, m: "ModelSpec") -> dict[str, Any]:
        """Extra names for this unit's template (literals and known words only)."""
        return {}

    @classmethod
    def class_prefix(cls) -> str:
        """How a generated file names this kind's class when layers differ (`WindowAttention`, `MoEFeedForward`):
        `prefix`, else the kind in CamelCase."""
        kind = cls.model_fields["kind"].default
        return cls.prefix or "".join(p[:1].upper() + p[1:] for p in kind.split("_"))

    @classmethod
    def template_path(cls) -> Path:
        kind = cls.model_fields["kind"].default
        return Path(inspect.getfile(cls)).with_name(cls.template or f"{kind}.py.j2")

    # HF transformers interop (archspec.kinds.hf; the model-level assembly is archspec.hf)
    hf_block: ClassVar[str | None] = None  # the HF building block this kind is, in HF's words; None: HF has none

    @classmethod
    def from_hf(cls, cfg: "HFConfig") -> dict[str, Any]:
        """This kind's spec fields (as a user writes them, `kind` included) from a transformers config whose type
        uses `hf_block`; reads through `cfg.take` (every key read is marked) and refuses what it cannot map."""
        return {"kind": cls.model_fields["kind"].default}

    def to_hf(self, m: "ModelSpec", out: dict[str, Any], hf: "HFType", path: tuple[str, ...]) -> None:
        """Write this kind's fields into a transformers config `out` of type `hf`; raise HFUnsupported (naming the
        field at `path`) for a value that type cannot express."""

    def hf_weights(self, m: "ModelSpec", hf: "HFType") -> list["HFWeight"]:
        """This kind's parameters and their HF names, each inside its own module (archspec.kinds.hf.HFWeight)."""
        return []

    # metrics: what this kind's generated modules report at each evaluation. The training loop (archspec.train.loop)
    # and the ablation report (archspec.ablate.report) call these hooks for every kind that sets `metric_prefix`
    # (metric_kinds), naming none, so a kind registered from outside reports its metrics the same way.
    metric_prefix: ClassVar[str | None] = None  # every metric key of this kind starts with it ("moe."); None: none
    metric_column: ClassVar[str] = "stats"  # the ablation table's column for this kind's summary metrics

    @classmethod
    def eval_stats(cls, model: Any) -> dict[str, Any]:
        """Statistics of the generated model's last forward that this kind reports (detached tensors, any shapes;
        {} when the model has none). The loop reads them after each validation batch and averages each one
        elementwise over the validation windows and the processes (one sync), then hands them to `eval_metrics`."""
        return {}

    @classmethod
    def eval_metrics(cls, stats: dict[str, Any]) -> dict[str, float]:
        """The averaged `eval_stats` → this evaluation's metrics, each key starting with `metric_prefix`."""
        return {}

    @classmethod
    def in_summary(cls, key: str) -> bool:
        """Whether the run summary keeps this kind's metric `key` from the last evaluation (else it stays a per-eval
        metric only)."""
        return True

    @classmethod
    def report_cell(cls, means: dict[str, float], number: Callable[[float], str]) -> str:
        """The ablation table's `metric_column` cell from a variant's summary metrics of this kind (mean over seeds,
        keys with the prefix); `number` formats a figure."""
        prefix = cls.metric_prefix or ""
        return ", ".join(f"{k.removeprefix(prefix)}={number(x)}" for k, x in means.items())

    # accounting
    def buffer_elements(self, m: "ModelSpec") -> int:
        """Elements of the non-persistent buffers this unit's module holds (tables derived from constants)."""
        return 0

    # testing
    @classmethod
    def strategy(cls, ctx: dict[str, int]) -> "SearchStrategy | None":
        """Hypothesis strategy for this kind's fields as a user writes them (without `kind`), or None when no valid
        value fits `ctx` (d_model, context_length, max_hidden). Default: every field over its declared range."""
        from archspec.kinds.introspect import fields_of

        return fields_of(cls, cls.strategy_overrides(ctx))

    @classmethod
    def strategy_overrides(cls, ctx: dict[str, int]) -> dict[str, Any]:
        return {}

    @classmethod
    def invalid_cases(cls) -> dict[str, "Callable[[Callable, dict, Spec], tuple | None]"]:
        """This kind's own rules (`problems`) broken on purpose, for archspec.testing's invalid specs: name →
        `case(draw, data, spec)`, which edits `data`, a valid spec dict that validated to `spec`, so that exactly
        this rule is broken, and returns the field path the problem must be reported at (None: the case does not
        apply to this spec; `data` is then dropped). `draw` is Hypothesis's."""
        return {}


def _matrices(module) -> list[str]:
    """Weight matrices: ≥ 2-D parameters, biases aside (stacked experts' biases are 2-D)."""
    return [name for name, p in module.named_parameters() if p.ndim >= 2 and "bias" not in name.rsplit(".", 1)[-1]]


class NormKind(KindUnit):
    """A normalisation layer. The template defines `class Norm(nn.Module)` taking `dim`, with `reset_parameters`."""

    family: ClassVar[str] = "norm"

    def params(self, d_model: int) -> int:
        raise NotImplementedError

    def saved_elements(self, d_model: int) -> int:
        """Elements per token autograd keeps for backward inside one norm (fp32), besides its output, which the
        following linear keeps (archspec.memory). Default: a generous guess for a kind that does not say."""
        return 2 * d_model + 2


class PositionalKind(KindUnit):
    """How positions reach the model. The template may define classes/functions, and these hook macros:
    `model_init` (lines in Model.__init__), `model_reset` (lines in Model.reset_parameters), `embed` (lines in
    Model.embed after the token embedding: `x`, `T`, and `start`, the position of x's first token: 0 for a whole
    sequence, the number of cached positions when generating), `tables` (lines in Model.through_blocks computing what
    every block takes beside x from `T` and `start`: a pipeline stage without the embedding computes them too),
    `block_params` / `block_args` (what Block.forward and Attention.forward take beyond `x`),
    `attention_qk` (lines in Attention.forward once `q` and `k` are (B, heads, T, HEAD_DIM))."""

    family: ClassVar[str] = "positional"
    head_dim_multiple: ClassVar[int] = 1  # e.g. 2 where pairs of dimensions are rotated
    # Whether positions reach attention only as offsets between query and key (RoPE; none), not as absolute positions
    # (a learned or sinusoidal table). With windowed attention, such a model meets nothing new past context_length;
    # its template must then compute positions past the table (see SparsityKind.max_lookback).
    relative: ClassVar[bool] = False
    # Keyword arguments the attention kernels take from this kind, naming a local its `attention_qk` hook sets
    # (ALiBi: ", alibi=alibi", its head slopes, a bias on the scores); "": positions never reach the scores as a bias.
    score_args: ClassVar[str] = ""
    # Per layer (archspec.spec.layers): a layer group may switch positions off (to an `inert` kind: none) where the
    # model's kind acts inside each layer's attention (`in_attention`: rope, alibi), not on the embeddings.
    in_attention: ClassVar[bool] = False
    inert: ClassVar[bool] = False
    # Whether its `attention_qk` hook reads per-head values (ALiBi's slopes) by the attention module's `heads`, the
    # slice of the query heads it computes (all of them; under tensor parallelism the plan narrows it).
    per_head: ClassVar[bool] = False

    @classmethod
    def head_dim_step(cls, fields: dict[str, Any]) -> int:
        """The step head widths must come in for this kind with these fields (as a user writes them), for the
        strategies: `head_dim_multiple` unless a field changes it (rope's `partial`)."""
        return cls.head_dim_multiple

    def params(self, m: "ModelSpec") -> int:
        return 0

    def saved_elements(self, m: "ModelSpec") -> int:
        """Elements per token each layer's attention keeps for backward because of this kind (e.g. rotated q and
        k), in the matmul dtype (archspec.memory)."""
        return 0


class SparsityKind(KindUnit):
    """Which keys each query sees. The template defines the `doc` macro (a line for Attention's docstring) and the
    `attend` macro: the lines in Attention.forward that
    turn `q` (B, N_HEADS, T, HEAD_DIM), `k`, `v` (B, N_KV_HEADS, T, HEAD_DIM) into `y` (B, N_HEADS, T, HEAD_DIM).

    Generation (a KV cache) has two optional hooks; without them a layer caches every position (dense):
    `new_cache` (the body of `Attention.new_cache(batch_size, max_len, device, dtype, rollback)`: return this layer's
    cache; the dense default is archspec.runtime's `KVCache`) and `decode` (the lines in Attention.forward that, given
    `cache` and this step's `q`, `k`, `v` for T new positions starting at `cache.length`, store k and v and produce
    `y`). A cache has `length` (positions seen), `truncate(length)` (speculative decoding takes back rejected drafts:
    up to `rollback` positions) and `nbytes` (its K and V, which `cached_positions` prices).

    A sparse pattern's template defines its predicate `mask_mod(b, h, q_idx, kv_idx)` and a `SparsePattern`
    (archspec.runtime.sparse) saying what the fast paths need; its
    `attend` calls `sparse_attention(q, k, v, PATTERN, ...)`, which picks FlexAttention on CUDA and the blockwise
    path everywhere else; its `new_cache` returns a `RollingKVCache(PATTERN, ...)`, which keeps the pattern's
    `n_global` leading positions and a ring buffer of the last `reach` positions (what `cached_positions` says), and
    its `decode` is `y = cache.attend(q, k, v)`."""

    family: ClassVar[str] = "sparsity"
    cache_class: ClassVar[str] = "KVCache"  # what `new_cache` returns (archspec.runtime): the annotation of `cache`

    def keys(self, seq_len: int) -> float:
        """Mean number of keys a query attends to over a sequence of `seq_len` tokens (exact, as a rational)."""
        raise NotImplementedError

    def blockwise_kept_bytes(self, m: "ModelSpec", mm: int) -> int | None:
        """Bytes per token one layer's attention keeps for backward when it takes the sparse patterns' blockwise path
        (on CPU, and on any device with attention dropout), `mm` the matmul element size (archspec.memory); None:
        the layer goes through SDPA (dense)."""
        return None

    def cuda_graph_refusal(self, m: "ModelSpec", device_type: str) -> str | None:
        """A pattern with a blockwise path takes it on CPU and under attention dropout: a graph break by design
        (archspec.runtime.sparse), its chunk loop eager."""
        if self.blockwise_kept_bytes(m, 4) is not None and (device_type == "cpu" or m.dropout > 0):
            return (f"{self.kind} attention takes its blockwise path here (CPU, or attention dropout), which runs "
                    "eagerly between graphs")
        return None

    def cached_positions(self, context_length: int) -> int:
        """Positions a layer's KV cache holds for a sequence of `context_length` tokens (what `new_cache` allocates,
        rollback aside): all of them for dense attention; a window layer at most its window. The accounting prices
        the cache from it (tested against the generated cache's `nbytes`)."""
        return context_length

    def max_lookback(self) -> int | None:
        """When every key a query sees lies within the last `max_lookback()` positions (the query included), that
        number; None when some key may be seen from any distance (dense attention, global keys). A model whose every
        layer has one, and whose positions reach attention only as offsets (`PositionalKind.relative`), can generate
        past context_length: each cache rolls, and no query meets an offset longer than those of training."""
        return None


class MixerKind(KindUnit):
    """A token mixer: what moves information between positions in a layer (the channel mixer is the FFN family).
    Attention kinds (gqa, mla) are mixer kinds that also hold a positional encoding and a sparsity pattern; a mixer
    that is not attention (a short causal convolution) holds neither. A layer's mixer is its attention unless the
    spec names another (`model.mixer`, or a layer group's `mixer`); `BlockSpec.token_mixer` is the one it uses.

    Accounting, the memory plan, codegen and the HF mapping reach every mixer through the members below, declared
    abstract: a mixer kind that leaves one out cannot be instantiated. The template defines the mixer's module with
    `reset_parameters()`, `new_cache(batch_size, max_len, device, dtype, rollback)` (its decoding state, with
    `length`, `truncate(length)` and `nbytes`) and `forward(x, [positions,] cache) -> (B, T, D_MODEL)`."""

    family: ClassVar[str] = "mixer"
    # The block's attribute holding this mixer's module: also its state_dict key (`blocks.0.attn.qkv_proj.weight`).
    attribute: ClassVar[str] = "mixer"
    # The accounting column its parameters are counted under (`params.by_component`).
    component: ClassVar[str] = "mixer"
    # Whether the block hands it the positional tables (attention: its positional unit reads them).
    takes_positions: ClassVar[bool] = False
    # What its module class is called in a generated file (`Attention`, `ShortConv`), and its section's title there.
    base_class: ClassVar[str] = "Mixer"
    section: ClassVar[str] = "token mixer"

    @abstractmethod
    def mixer_params(self, m: "ModelSpec") -> int:
        """Parameters of one layer's mixer."""

    @abstractmethod
    def mixer_flops(self, m: "ModelSpec", seq_len: int, full_attention: bool = False) -> dict[str, float]:
        """Forward matmul FLOPs of one layer's mixer for one token at sequence length `seq_len`, by accounting column
        (attention: its projections and its score·value products; exact, possibly a rational)."""

    @abstractmethod
    def state_bytes_per_token(self, m: "ModelSpec", element_bytes: int) -> int:
        """Bytes its decoding state grows by per generated position (a KV cache: K and V; a fixed state: 0)."""

    @abstractmethod
    def state_bytes_per_sequence(self, m: "ModelSpec", seq_len: int, element_bytes: int) -> int:
        """Bytes of one sequence's decoding state after `seq_len` positions, as `new_cache` allocates it (tested
        against the generated cache's `nbytes`): a KV cache grows with the context, a conv state does not."""

    @abstractmethod
    def saved_bytes(self, m: "ModelSpec", seq_len: int, mm: int, device: str) -> int:
        """Bytes per token one layer's mixer keeps for backward (archspec.memory), `mm` the matmul element size."""

    def sub_units(self) -> tuple["KindUnit", ...]:
        """The kind units it holds (attention: its sparsity pattern), for codegen and the model's unit list."""
        return ()

    @property
    def cache_class(self) -> str:
        """What its module's `new_cache` returns (archspec.runtime): the annotation of `cache` in the block."""
        return "object"

    def max_lookback(self) -> int | None:
        """When every position it reads lies within the last `max_lookback()` (its own included), that number; None
        when it may read any earlier position (see SparsityKind.max_lookback)."""
        return None

    def summary(self, m: "ModelSpec") -> str:
        """A few words for the accounting table's per-layer row."""
        return self.describe(m)

    def class_label(self) -> str:
        """How a file names this configuration's class beside other mixers' (`WindowAttention`)."""
        return ""


class AttentionKind(MixerKind):
    """How a layer's queries read earlier positions: its projections, what its KV cache holds, and the two families
    it holds, `positional` and `sparsity`. The template defines `class Attention(nn.Module)` (`new_cache`,
    `reset_parameters`, `forward(x, <positional.block_params>, cache)`), filling in the families' hook macros.

    Besides the KindUnit hooks every attention kind provides (archspec.accounting, archspec.memory and codegen ask it,
    naming no kind): `n_heads`, `positional`, `sparsity`; `fill_defaults(d_model)`; `params(d_model)`,
    `projection_flops(d_model)`, `score_flops(seq_len, full_attention)`, `kv_cache_elements_per_token()` and
    `kv_cache_elements_per_sequence(seq_len)` (what its `new_cache` allocates, tested); `rotary_width` (the dims of
    each head the positional unit rotates) at spec field `rotary_field`, `rotary_kv_heads` (how many key heads it
    rotates); `saved_widths()` (archspec.memory); `mean_head_dim` (PaLM's FLOPs convention); `heads_summary()` (words
    for the accounting table and the docstring); `cache_class` (what `new_cache` returns) and `class_label()`."""

    family: ClassVar[str] = "attention"
    rotary_field: ClassVar[str] = "head_dim"

    def quantized_weights(self, module: "torch.nn.Module") -> list[str]:
        """Every matrix (≥ 2-D parameter) of the module: projections (see KindUnit)."""
        return _matrices(module)

    def fill_defaults(self, d_model: int) -> None:  # type: ignore[override]  (takes d_model: see ModelSpec)
        """Defaults that depend on d_model (written into the spec so explicit and omitted forms hash alike)."""

    @property
    def cache_class(self) -> str:
        return self.sparsity.cache_class

    def class_label(self) -> str:
        """How a file names this configuration's class when layers differ (`WindowAttention`)."""
        return type(self.sparsity).class_prefix()

    # ── the mixer contract (MixerKind), from the attention kinds' own members ──
    attribute: ClassVar[str] = "attn"
    component: ClassVar[str] = "attention"
    takes_positions: ClassVar[bool] = True
    base_class: ClassVar[str] = "Attention"
    section: ClassVar[str] = "attention"

    def mixer_params(self, m: "ModelSpec") -> int:
        return self.params(m.d_model)

    def mixer_flops(self, m: "ModelSpec", seq_len: int, full_attention: bool = False) -> dict[str, float]:
        return {"attention_proj": self.projection_flops(m.d_model),
                "attention_scores": self.score_flops(seq_len, full_attention)}

    def state_bytes_per_token(self, m: "ModelSpec", element_bytes: int) -> int:
        return self.kv_cache_elements_per_token() * element_bytes

    def state_bytes_per_sequence(self, m: "ModelSpec", seq_len: int, element_bytes: int) -> int:
        return self.kv_cache_elements_per_sequence(seq_len) * element_bytes

    def saved_bytes(self, m: "ModelSpec", seq_len: int, mm: int, device: str) -> int:
        q, qkv = self.saved_widths()  # the output's width; what the projections leave alive (GQA: q, k, v of one matmul)
        # A sparse pattern on CPU, and on any device with attention dropout (FlexAttention has none), takes the
        # blockwise path, which says what it keeps: its own q, k, v and output (and dropout's keep-masks), no score
        # tile. FlexAttention on CUDA keeps what SDPA keeps.
        own = self.sparsity.blockwise_kept_bytes(m, mm) if device == "cpu" or m.dropout > 0 else None
        if own is not None:
            return own
        manual = self.score_mod_kept_bytes(m, seq_len, mm) if hasattr(self, "score_mod_kept_bytes") else None
        if manual is not None:  # capped or biased scores: materialised (archspec.runtime.scores), not SDPA
            return manual
        if m.dropout > 0 and device == "cpu":
            # CPU SDPA with dropout takes the math path: scaled q, expanded k and v, the (T × T) weights before and
            # after dropout and the mask, and an output copy for the projection.
            return (4 * q + 3 * self.n_heads * seq_len) * mm
        # positions' own tensors (RoPE's rotated q and k), the output (the o-projection's input is a view of it) and
        # the fp32 log-sum-exp per head; positions are model-wide
        return (qkv + m.attention.positional.saved_elements(m) + q) * mm + self.n_heads * 4

    def sub_units(self) -> tuple[KindUnit, ...]:
        return (self.sparsity,)

    def max_lookback(self) -> int | None:
        return self.sparsity.max_lookback()

    def summary(self, m: "ModelSpec") -> str:
        return f"{self.heads_summary()}, {self.sparsity.describe(m)}"

    # The width q·k sums over, and its constant's name in the file (MLA: the nope and rope parts together).
    score_width_name: ClassVar[str] = "HEAD_DIM"

    @property
    def score_width(self) -> int:
        return self.head_dim


class FFNKind(KindUnit):
    """A feed-forward layer. The template defines `class FeedForward(nn.Module)` with no constructor arguments,
    `reset_parameters()` and `forward(x) -> (B, T, D_MODEL)`; optional hook macro `model_methods` (methods added
    to Model, e.g. `auxiliary_losses` for a kind with auxiliary losses)."""

    family: ClassVar[str] = "ffn"
    # Whether the block holds this channel mixer as a sublayer (with its own norm); false for a block that is its token
    # mixer alone (kind `none`: Mamba-2's norm → mixer → residual).
    sublayer: ClassVar[bool] = True

    def quantized_weights(self, module: "torch.nn.Module") -> list[str]:
        """Every matrix (≥ 2-D parameter) of the module: projections, stacked experts (see KindUnit)."""
        return _matrices(module)

    def params(self, d_model: int) -> int:
        raise NotImplementedError

    def active_params(self, d_model: int) -> int:
        return self.params(d_model)

    def routed_params(self, d_model: int) -> int:
        """Parameters of routed experts, which expert parallelism spreads over its ranks (archspec.memory); 0 for a
        dense FFN."""
        return 0

    def flops(self, d_model: int) -> int:
        """Forward matmul FLOPs of one layer for one token (active experts only)."""
        raise NotImplementedError

    def saved_elements(self, d_model: int) -> int:
        """Elements per token autograd keeps for backward inside one layer, in the matmul dtype, besides its input
        (archspec.memory). Default: a generous guess, four hidden-width tensors."""
        return 4 * (getattr(self, "hidden_dim", None) or 4 * d_model)

    @property
    def causal(self) -> bool:
        """Whether a token's output depends only on tokens at or before its position (a capacity-limited MoE that
        drops by router probability is not: a later token can evict an earlier one)."""
        return True


# ── the registry ─────────────────────────────────────────────────────────────────────────────────────────────────


@dataclass
class Family:
    name: str
    base: type[BaseModel]
    default: str | None  # the kind an omitted `kind` means; None: `kind` must be given
    hooks: tuple[str, ...] = ()
    members: dict[str, type[Any]] = field(default_factory=dict)
    slots: list[tuple[type[BaseModel], str]] = field(default_factory=list)

    def union(self) -> Any:
        return kind_union(*self.members.values(), default=self.default)

    def __iter__(self):
        return iter(self.members.items())


_VERSION = [0]


class Registry:
    """Families of units, each a pydantic class with a `kind` literal, and the spec fields that hold each family's
    union. A unit registered late (a plugin) rebuilds those fields in place, so validation, the JSON Schema,
    filters, `--set` and the strategies all see it. The model's kinds are one registry (below), the data kinds
    (archspec.data) another."""

    def __init__(self, what: str, families: Iterable[Family], check: Callable[[type], None] | None = None):
        self.what, self.check = what, check
        self.families: dict[str, Family] = {f.name: f for f in families}
        self.rebuild: list[type[BaseModel]] = []  # models that hold the unions, in the order they must be rebuilt
        self.optional: set[tuple[type[BaseModel], str]] = set()  # slots that may also hold None

    def register(self, cls):
        # the most specific family whose base it extends (an attention kind is also a MixerKind)
        fams = [f for f in self.families.values() if issubclass(cls, f.base)]
        fam = next((f for f in fams if all(issubclass(f.base, g.base) for g in fams)), None)
        if fam is None:
            raise TypeError(f"{cls.__name__}: {self.what} must subclass one of "
                            f"{', '.join(f.base.__name__ for f in self.families.values())}")
        kind = getattr(cls.model_fields.get("kind"), "default", None)
        if not isinstance(kind, str) or not kind:
            raise TypeError(f"{cls.__name__}: declare `kind: Literal['...'] = '...'`")
        if kind in fam.members and fam.members[kind] is not cls:
            raise ValueError(f"{fam.name} kind {kind!r} is already registered by {fam.members[kind].__name__}")
        if self.check is not None:
            self.check(cls)
        fam.members[kind] = cls
        _VERSION[0] += 1  # caches derived from the spec's shape (known_keys) key on it
        if fam.slots:
            self._rebuild(fam)
        return cls

    def bind(self, family_name: str, owner: type[BaseModel], field_name: str, optional: bool = False) -> None:
        """Declare that `owner.field_name` holds `family_name`'s union (`optional`: or None)."""
        self.families[family_name].slots.append((owner, field_name))
        if optional:
            self.optional.add((owner, field_name))

    def rebuild_order(self, *models: type[BaseModel]) -> None:
        """The models to rebuild, innermost first, when a family gains a kind."""
        self.rebuild[:] = list(models)

    def _rebuild(self, fam: Family) -> None:
        union = fam.union()
        for owner, name in fam.slots:
            annotation = union | None if (owner, name) in self.optional else union
            owner.model_fields[name] = FieldInfo.from_annotated_attribute(annotation, owner.model_fields[name])
        for model in self.rebuild:
            model.model_rebuild(force=True)


def _has_template(cls: type[KindUnit]) -> None:
    if not cls.template_path().is_file():
        raise FileNotFoundError(f"{cls.__name__}: no template at {cls.template_path()}")


_KINDS = Registry("a kind", [
    Family("norm", NormKind, "rmsnorm"),
    Family("positional", PositionalKind, "rope",
           ("model_init", "model_reset", "embed", "tables", "block_params", "block_args", "attention_qk")),
    Family("sparsity", SparsityKind, "dense", ("doc", "attend", "new_cache", "decode")),
    Family("attention", AttentionKind, "gqa"),
    Family("ffn", FFNKind, "glu", ("model_methods",)),
    # Token mixers other than attention (attention kinds are mixers too, in their own family above, because they
    # hold the positional and sparsity families). No default: a mixer says which it is (`mixer: {}` is refused).
    Family("mixer", MixerKind, None),
], check=_has_template)
_FAMILIES = _KINDS.families


def families() -> dict[str, Family]:
    return dict(_FAMILIES)


def family(name: str) -> Family:
    return _FAMILIES[name]


def registry_version() -> int:
    """Changes whenever a kind (of the model or of the data) is registered: caches derived from the spec's shape
    key on it."""
    return _VERSION[0]


def register(cls: type[KindUnit]) -> type[KindUnit]:
    """Add a kind to its family (a decorator). The built-in kinds use it; so may a plugin, at any time: the spec
    classes are then rebuilt in place so that validation, JSON Schema, filters, `--set` and codegen all see it."""
    return _KINDS.register(cls)


def metric_kinds(kinds: Iterable[type[KindUnit]] | None = None) -> list[type[KindUnit]]:
    """The kinds that report metrics (a `metric_prefix`) among `kinds` (default: every registered kind), in order,
    one per prefix (a subclass registered as another kind reports through its parent's hooks only once)."""
    if kinds is None:
        kinds = [cls for fam in _FAMILIES.values() for cls in fam.members.values()]
    out: dict[str, type[KindUnit]] = {}
    for cls in kinds:
        if cls.metric_prefix:
            out.setdefault(cls.metric_prefix, cls)
    return list(out.values())


def bind(family_name: str, owner: type[BaseModel], field_name: str, optional: bool = False) -> None:
    """Declare that `owner.field_name` holds `family_name`'s union, or None when `optional` (called by
    archspec.spec.model)."""
    _KINDS.bind(family_name, owner, field_name, optional)


def rebuild_order(*models: type[BaseModel]) -> None:
    """The models to rebuild, innermost first, when a family gains a kind (called by archspec.spec.model)."""
    _KINDS.rebuild_order(*models)
