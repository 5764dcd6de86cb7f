"""Tensor parallelism of a generated model: each unit's plan (archspec.spec.parallel_plan) as torch's parallel styles.

    apply_tensor_parallel(model, spec, mesh.tp)   # before FSDP over the data-parallel mesh, before compiling blocks
    with loss_context(model):                     # loss_parallel() under tp: the loss never gathers the full logits
        logits, loss = model(idx, targets)
        loss.backward()

What each style becomes (torchtitan's llama plan is the reference composition; Megatron's sequence parallelism):
between modules the residual stream is this rank's sequence shard, a plain (B, T/tp, D) tensor. The token embedding
is vocabulary-parallel (RowwiseParallel of nn.Embedding, reduce-scattered over the sequence); a norm is
SequenceParallel (its gain replicated); attention and the FFN gather their input over the sequence
(PrepareModuleInput), run colwise projections (this rank's heads, hidden units) and a rowwise one whose partial
products are reduce-scattered back to the sequence shard; the head is colwise with vocabulary-sharded logits, which
the loss reads under `loss_parallel()`. Every parameter ends a DTensor on the tp mesh (sharded or replicated), so
gradients of replicated ones are summed over tp by DTensor itself.

The fused qkv_proj (rows [q heads | k heads | v heads]) is *permuted* in memory, not split into three: its rows are
reordered rank-major, [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] (q_r: rank r's N_HEADS/tp query heads), so that
ColwiseParallel's contiguous Shard(0) gives each rank its own heads of all three. The parameter keeps its name and shape; checkpoints
keep the natural layout: `checkpoint_state` / `restore_state` (archspec.train.checkpoint calls them around DCP) put
the rows back in natural order for the model and for AdamW's exp_avg and exp_avg_sq, and permute them again on load.
A unit may hand its whole module to a function of its own instead (style `delegate`, "package.module:function",
called as fn(module, mesh) with the job's archspec.train.mesh.JobMesh when the loop gives one, else the tp mesh): the
module then gets this rank's sequence shard as a plain (B, T/tp, D) tensor and returns the same shape, already summed
over tp, as any FFN does here; what it keeps whole it keeps in step itself. That is the MoE unit's plan
(archspec.train.expert_parallel.apply_moe_parallel: experts split by hidden, the router whole on every rank).

Dropout under tp draws its masks on each rank's shard (and, inside attention, its heads) from that rank's own
dropout stream: a valid dropout, not one process's masks; the equality tests run at dropout 0.

Memory cost of that boundary: during a save or a load each rank holds every layer's whole fused weight (and bias)
three times (weight, exp_avg, exp_avg_sq) in the parameter dtype, besides its shards; nothing at training time.
"""

from __future__ import annotations

import inspect
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any, Callable

import torch
from torch import nn

from archspec.errors import UserError
from archspec.kinds.base import Split
from archspec.spec.parallel_plan import TP_PATH, model_plan, tp_problems


@dataclass
class TensorParallel:
    """What apply_tensor_parallel did to a model (kept on it as `model._archspec_tp`)."""

    mesh: Any  # the tp DeviceMesh
    permuted: dict[str, torch.Tensor] = field(default_factory=dict)  # parameter name → row order in memory: the
    # stored tensor's row i is the natural tensor's row permuted[i]


def _fqn(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def rank_major_rows(parts: tuple[int, ...], tp: int) -> torch.Tensor:
    """The row order that puts each rank's slice of every part together: for rank r, part i's rows
    [r·n_i/tp, (r+1)·n_i/tp) for each part in turn, then rank r + 1."""
    starts = [sum(parts[:i]) for i in range(len(parts))]
    rows = [torch.arange(start + r * (n // tp), start + (r + 1) * (n // tp))
            for r in range(tp) for start, n in zip(starts, parts)]
    return torch.cat(rows)


def _inputs(module: nn.Module) -> int:
    """How many positional inputs the generated block passes this module (its forward's parameters: the blocks pass
    all of them positionally)."""
    return len([p for p in inspect.signature(module.forward).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)])


def _settled(output_layouts, use_local_output, mod, outputs, device_mesh):
    """The colwise/rowwise styles' output step with a synchronous redistribute. Torch's own is async (an
    AsyncCollectiveTensor), and with torch.compile anywhere in the backward (a compiled block) that tensor's gradient
    reaches the redistribute as a plain tensor and backward fails (torch 2.13, CPU gloo, also backend "eager")."""
    if outputs.placements != output_layouts:
        outputs = outputs.redistribute(placements=output_layouts, async_op=False)
    return outputs.to_local() if use_local_output else outputs


def _styles():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    class Colwise(ColwiseParallel):
        _prepare_output_fn = staticmethod(_settled)

    class Rowwise(RowwiseParallel):
        _prepare_output_fn = staticmethod(_settled)

    return Colwise, Rowwise


def _style(module: nn.Module, split: Split):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleInputOutput, SequenceParallel

    ColwiseParallel, RowwiseParallel = _styles()

    rest = (None,) * (_inputs(module) - 1)
    if split.style == "colwise":
        return ColwiseParallel(output_layouts=Replicate()) if split.replicated_output else ColwiseParallel()
    if split.style == "rowwise":
        return RowwiseParallel(output_layouts=Shard(1))
    if split.style == "sequence":
        return SequenceParallel(sequence_dim=split.dim, use_local_output=True)
    if split.style == "gather":
        return PrepareModuleInput(input_layouts=(Shard(1), *rest), desired_input_layouts=(Replicate(), *rest),
                                  use_local_output=True)
    if split.style == "around":
        return PrepareModuleInputOutput(input_layouts=(Shard(1), *rest), desired_input_layouts=(Replicate(), *rest),
                                        use_local_input=True, output_layouts=Replicate(),
                                        desired_output_layouts=Shard(1), use_local_output=True)
    if split.style == "vocab":
        if isinstance(module, nn.Embedding):  # rows = tokens: each rank looks up its tokens, zeros elsewhere
            return RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
        # the head: the final norm's sequence shard in, logits sharded by vocabulary out, kept a DTensor for the loss
        return ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)
    raise ValueError(f"tensor parallelism: unknown style {split.style!r}")  # a unit's bug, not user input


def _present(model: nn.Module, fqn: str) -> bool:
    """Whether this process holds the module at `fqn` (a pipeline stage holds some blocks and ends only)."""
    if not fqn:
        return True
    try:
        return model.get_submodule(fqn) is not None
    except AttributeError:
        return False


def apply_tensor_parallel(model: nn.Module, spec: Any, tp_mesh: Any, job_mesh: Any = None) -> nn.Module:
    """Split `model` (the generated Model of `spec`, whole on every rank, the same weights on each) over `tp_mesh`
    in place, following each unit's plan; returns it. UserError (train.parallel.tp: ...) for a spec that cannot be
    split, before any collective. `job_mesh`: the job's archspec.train.mesh.JobMesh, which a delegated unit (MoE)
    is given (its experts also need the data-parallel axis); a unit is given `tp_mesh` without it."""
    tp = tp_mesh.size()
    if tp != spec.train.parallel.tp:
        raise UserError(f"train.parallel.tp: the tensor-parallel mesh has {tp} processes, the spec asks for "
                        f"{spec.train.parallel.tp}")
    problems = tp_problems(spec)
    if problems:
        raise UserError(f"train.parallel.tp: {problems[0][1]}", [f"{'.'.join(TP_PATH)}: {p[1]}" for p in problems])
    if tp == 1:
        return model
    state = TensorParallel(tp_mesh)
    rank = tp_mesh.get_local_rank()
    styles: dict[str, Any] = {}
    delegates: list[tuple[str, str]] = []
    sliced: list[tuple[nn.Module, str, int]] = []
    for placed in model_plan(spec.model):
        if not _present(model, placed.module):  # held by another pipeline stage (archspec.train.pipeline)
            continue
        for name, split in placed.plan.splits.items():
            fqn = _fqn(placed.module, name)
            if not _present(model, fqn):
                continue
            if split.style == "delegate":
                delegates.append((fqn, split.fn))
                continue
            module = model.get_submodule(fqn)
            styles[fqn] = _style(module, split)
            if split.parts:  # a fused weight: rank-major rows, so each rank's contiguous shard holds its parts
                order = rank_major_rows(split.parts, tp)
                with torch.no_grad():
                    for pname in ("weight", "bias"):
                        p = getattr(module, pname, None)
                        if p is not None:
                            p.copy_(p[order.to(p.device)])
                            state.permuted[_fqn(fqn, pname)] = order
        module = model.get_submodule(placed.module)
        sliced += [(module, name, count) for name, count in placed.plan.sliced.items()]
    for fqn, fn in delegates:
        where, _, name = fn.partition(":")
        try:
            function = getattr(import_module(where), name)
        except (ImportError, AttributeError):
            raise UserError(f"train.parallel.tp: {fqn} is handed to {fn}, which is not available here; use tp 1")
        function(model.get_submodule(fqn), job_mesh if job_mesh is not None else tp_mesh)
    head, embedding = getattr(model, "lm_head", None), getattr(model, "tok_emb", None)
    tied = head is not None and embedding is not None and head.weight is embedding.weight
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(model, tp_mesh, styles)
    if tied:  # each style distributed its own copy; both are Shard(0) of the same (VOCAB_SIZE, D_MODEL) matrix
        model.lm_head.weight = model.tok_emb.weight
    for module, name, count in sliced:  # which of the heads the module computes (ALiBi's slopes): this rank's
        setattr(module, name, slice(rank * (count // tp), (rank + 1) * (count // tp)))
    from torch.distributed.tensor import DTensor

    handed = tuple(f"{fqn}." for fqn, _ in delegates)  # a delegate keeps what it keeps whole in step itself
    plain = [n for n, p in model.named_parameters() if not isinstance(p, DTensor) and not n.startswith(handed)]
    if plain:  # a parameter no plan covers would train unsynchronised on each rank
        raise ValueError(f"tensor parallelism: no plan covers {', '.join(plain[:4])}")  # a unit's bug
    model._archspec_tp = state
    return model


def is_tensor_parallel(model: nn.Module) -> bool:
    return getattr(model, "_archspec_tp", None) is not None


def loss_context(model: nn.Module) -> AbstractContextManager:
    """What the loop wraps the forward and backward in: `loss_parallel()` under tensor parallelism (the cross-entropy
    of vocabulary-sharded logits, without gathering them), else nothing."""
    if not is_tensor_parallel(model):
        return nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


# ── the checkpoint boundary: natural row order in the files ────────────────────────────────────────────────


def natural_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the model's state_dict as whole plain tensors in today's layout (fused rows in natural order), the
    same on every rank: what a weights checkpoint or an HF export of a tensor-parallel model must be given."""
    from torch.distributed.tensor import DTensor

    state = getattr(model, "_archspec_tp", None)
    out = {}
    for name, t in model.state_dict().items():
        whole = t.full_tensor() if isinstance(t, DTensor) else t
        if state is not None and name in state.permuted:
            whole = whole[torch.argsort(state.permuted[name]).to(whole.device)]
        out[name] = whole
    return out


def _optimizer_tensors(optim_state: dict[str, Any], name: str, like: torch.Tensor) -> dict[str, torch.Tensor]:
    entry = (optim_state or {}).get("state", {}).get(name, {})
    return {k: v for k, v in entry.items() if isinstance(v, torch.Tensor) and v.shape == like.shape}


def _put(model_state: dict[str, Any], optim_state: dict[str, Any], name: str, key: str | None,
         value: torch.Tensor) -> None:
    """Replace an entry of get_state_dict's dicts without touching the optimizer's own: its per-parameter dicts may
    be the ones the optimizer holds, so they are copied, never written into."""
    if key is None:
        model_state[name] = value
    else:
        optim_state["state"][name] = {**optim_state["state"][name], key: value}


def checkpoint_state(model: nn.Module, model_state: dict[str, Any], optim_state: dict[str, Any]) -> None:
    """In place, before DCP saves get_state_dict's dicts: each permuted parameter, and its optimizer moments, as the
    natural-order whole tensor (a plain tensor, the same on every rank: DCP writes it once)."""
    state = getattr(model, "_archspec_tp", None)
    if state is None:
        return
    for name, order in state.permuted.items():
        if name not in model_state:
            continue
        inverse = torch.argsort(order)
        tensors = {None: model_state[name], **_optimizer_tensors(optim_state, name, model_state[name])}
        for key, t in tensors.items():
            natural = t.full_tensor()[inverse.to(t.device)]
            _put(model_state, optim_state, name, key, natural)


def restore_state(model: nn.Module, model_state: dict[str, Any], optim_state: dict[str, Any]) -> Callable[[], None]:
    """Around a DCP load: call it with get_state_dict's dicts before dcp.load; it swaps each permuted entry for a
    natural-order whole tensor for DCP to fill, and returns `finish`, to call after dcp.load: it permutes what was
    read into the in-memory order and keeps this rank's shard, ready for set_state_dict."""
    state = getattr(model, "_archspec_tp", None)
    held: dict[tuple[str, str | None], torch.Tensor] = {}
    if state is not None:
        for name, order in state.permuted.items():
            if name not in model_state:
                continue
            tensors = {None: model_state[name], **_optimizer_tensors(optim_state, name, model_state[name])}
            for key, t in tensors.items():
                held[(name, key)] = t
                _put(model_state, optim_state, name, key, torch.empty(t.shape, dtype=t.dtype, device=t.device))

    def finish() -> None:
        from torch.distributed.tensor import distribute_tensor

        for (name, key), like in held.items():
            order = state.permuted[name]
            whole = model_state[name] if key is None else optim_state["state"][name][key]
            mine = distribute_tensor(whole[order.to(whole.device)], like.device_mesh, like.placements,
                                     src_data_rank=None)  # every rank holds the whole: no communication
            _put(model_state, optim_state, name, key, mine)

    return finish
