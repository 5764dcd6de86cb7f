"""Pipeline parallelism (train.parallel.pp): each process holds consecutive layers, stages by cost
(archspec.train.stages), and micro-batches flow through the stages under torch.distributed.pipelining's schedules.

    pipe = Pipeline.build(model, spec, mesh, device)   # cuts `model` down to this process's stages, in place
    loss, aux = pipe.train_batch(inputs, targets)       # forward and backward of one replica batch, in micro-batches
    loss = pipe.eval_batch(inputs, targets)             # forward only, one batch, stage to stage

The generated model stays the model: a stage calls its `embed` (first stage), `through_blocks` (its own blocks) and
`head` (last stage, with the loss). The blocks another stage holds are replaced by `OtherStage`, a pass-through
without parameters, so every name in the state dict (`blocks.5.attn...`) is the one a whole model has: checkpoints
(DCP, by name) load across layouts. The embedding's and head's modules are kept only where they are used, except a
module sharing a parameter with a kept one (a tied head keeps the embedding too, so the optimizer state is named
`tok_emb.weight` on both ends, as on one process); the tied weight's gradient is summed between the first and last
stage after each batch.

Micro-batches: each replica's batch of train.batch_size rows splits into train.parallel.microbatches equal parts;
the loss of each is scaled by 1 / (microbatches · grad_accum), so the gradient is the batch mean, as on one process.
Auxiliary losses (the model's declared `auxiliary_losses` hook, archspec.runtime.protocol: MoE router losses, averaged
over the layers that have them) are computed per micro-batch on the stage that holds the layer, as that layer's share
of the model's mean, and join the gradient through its output (`_WithAuxiliary`); their values are summed over the
stages for the logs. Which layers have them, and their names, are learnt once before the cut from a one-token
forward of the whole model (`_auxiliary_layers`), so no kind's attribute is named here.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from archspec.runtime.protocol import hooks_of
from archspec.train.distributed import full_value
from archspec.train.stages import StagePlan, plan_stages


class OtherStage(nn.Module):
    """A block that another pipeline stage holds: x passes through unchanged (no parameters, no state)."""

    ffn = None
    attn = None

    def __init__(self, layer: int):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return x

    def reset_parameters(self) -> None:
        pass

    def extra_repr(self) -> str:
        return f"layer {self.layer}: held by another stage"


def held_blocks(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(layer, block) for each block this process holds: every block without pipeline parallelism."""
    return [(i, b) for i, b in enumerate(model.blocks) if not isinstance(b, OtherStage)]


class _WithAuxiliary(torch.autograd.Function):
    """x unchanged; in backward the auxiliary loss gets gradient 1 (it joins the loss through the stage's output)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        ctx.aux_shape, ctx.aux_dtype = aux.shape, aux.dtype
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, torch.ones(ctx.aux_shape, dtype=ctx.aux_dtype, device=grad.device)


def _roles(model: nn.Module, device: torch.device) -> tuple[set[str], set[str]]:
    """The model's top-level modules (blocks aside) that `embed` and `head` call: found by running them on one token
    with forward hooks, so no kind is named here."""
    called: set[str] = set()
    handles = [child.register_forward_hook(lambda mod, args, out, name=name: called.add(name))
               for name, child in model.named_children() if name != "blocks"]
    try:
        with torch.no_grad():
            x = model.embed(torch.zeros(1, 1, dtype=torch.long, device=device))
            embed = set(called)
            called.clear()
            model.head(x)
            head = set(called)
    finally:
        for h in handles:
            h.remove()
    return embed, head


def _auxiliary_layers(model: nn.Module, device: torch.device) -> tuple[list[int], list[str]]:
    """The layers whose blocks give auxiliary losses, and the losses' names: one token through the whole model (no
    gradient, the RNG forked), then the model's `auxiliary_losses` hook asked of each block alone."""
    hooks = hooks_of(model)
    if not hooks.defines("auxiliary_losses"):
        return [], []
    with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model.through_blocks(model.embed(torch.zeros(1, 1, dtype=torch.long, device=device)), 1)
    layers = [i for i in range(len(model.blocks)) if _with_blocks(model, i, i + 1, hooks.auxiliary_losses)]
    return layers, sorted(hooks.auxiliary_losses())


@dataclass
class _StageState:
    """What one stage's forwards left for the step's logs: cross-entropy and router losses per micro-batch."""

    losses: list[torch.Tensor] = field(default_factory=list)
    aux: list[dict[str, torch.Tensor]] = field(default_factory=list)


class _StageView(nn.Module):
    """The module a PipelineStage runs: calls the (shared, cut-down) model with its stage index, through the model's
    own __call__ so FSDP's hooks on the model run. Holds no parameters of its own (the model is not its child)."""

    def __init__(self, model: nn.Module, stage: int):
        super().__init__()
        object.__setattr__(self, "_model", model)
        self.stage = stage
        self.pipeline_stage = None  # its PipelineStage, once made

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        # The schedule's first step runs each stage once on placeholder inputs to learn its output's shape (torch's
        # dynamic metadata inference): that forward is not a micro-batch, and leaves no statistics.
        inferring = self.pipeline_stage is not None and self.pipeline_stage._stage_meta.outputs is None
        return self._model(x, targets, _stage=self.stage, _record=not inferring)


class Pipeline:
    def __init__(self, model: nn.Module, plan: StagePlan, mine: list[int], mesh, device: torch.device,
                 seq_len: int, schedule: str, microbatches: int, auxiliary: tuple[list[int], list[str]],
                 roles: tuple[set[str], set[str]], tie_embeddings: bool = False):
        self.model, self.plan, self.mine, self.mesh, self.device = model, plan, mine, mesh, device
        self.seq_len, self.schedule_name, self.microbatches = seq_len, schedule, microbatches
        self.hooks = hooks_of(model)
        # the layers with auxiliary losses (over the whole model) and the losses' names: every stage logs every name
        self.aux_layers, self.aux_names = auxiliary
        self.n_aux = len(self.aux_layers)
        self.n_stages = plan.stages
        self.first, self.last = 0 in mine, self.n_stages - 1 in mine
        self.scale = 1.0  # loss scale of one micro-batch (set per step)
        self.evaluating = False
        self.state = _StageState()
        self.embed_modules, self.head_modules = roles
        self.tie_embeddings = tie_embeddings
        self.tied: list[nn.Parameter] = []  # found in build_schedule: TP and FSDP replace the parameters first
        self._ends_group = None
        model.forward = self._forward  # instance attribute: __call__ (and FSDP's hooks around it) finds it
        self.schedule = None  # built once the model is sharded (build_schedule)

    # ── building ────────────────────────────────────────────────────────────────────────────────────────────────

    @classmethod
    def build(cls, model: nn.Module, spec, mesh, device: torch.device) -> Pipeline:
        """Cut `model` to this process's stages (in place) and return its pipeline. Interleaved 1F1B gives each
        process two stages, p and p + pp."""
        par, layout = spec.train.parallel, mesh.layout
        per_rank = 2 if par.schedule == "interleaved_1f1b" else 1
        plan = plan_stages(spec, layout.pp * per_rank)
        rank = mesh.pp.get_local_rank()
        mine = [rank + k * layout.pp for k in range(per_rank)]
        embed, head = _roles(model, device)
        auxiliary = _auxiliary_layers(model, device)
        keep_layers = {i for s in mine for i in range(*plan.ranges[s])}
        for i in range(len(model.blocks)):
            if i not in keep_layers:
                model.blocks[i] = OtherStage(i)
        first, last = 0 in mine, plan.stages - 1 in mine
        dropped = (embed - head if not first else set()) | (head - embed if not last else set())
        kept_params = {id(p) for name, child in model.named_children() if name not in dropped
                       for p in child.parameters()}
        for name in sorted(dropped):
            if not any(id(p) in kept_params for p in getattr(model, name).parameters()):
                setattr(model, name, None)
        return cls(model, plan, mine, mesh, device, spec.train.seq_len or spec.model.context_length, par.schedule,
                   par.microbatches or layout.pp, auxiliary, (embed, head), bool(spec.model.tie_embeddings))

    def _tied_parameters(self) -> list[nn.Parameter]:
        """Parameters the first and the last stage both hold (a tied embedding and head): those of the embedding's
        modules that a head module uses too."""
        if not (self.first or self.last):
            return []
        model = self.model
        head_params = {id(p) for name in self.head_modules if getattr(model, name, None) is not None
                       for p in getattr(model, name).parameters()}
        return [p for name in self.embed_modules if getattr(model, name, None) is not None
                for p in getattr(model, name).parameters() if id(p) in head_params]

    def _tied_anywhere(self) -> list[bool]:
        """Whether the model ties the embedding to the head (the same on every process: from the spec's model)."""
        return [bool(self.tie_embeddings)]

    def build_schedule(self) -> None:
        """The PipelineStage(s) of this process and the schedule over them (after TP, compile, FSDP)."""
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

        group = self.mesh.pp.get_group()
        stages = []
        for s in self.mine:
            view = _StageView(self.model, s)
            view.pipeline_stage = PipelineStage(view, s, self.n_stages, self.device, group=group)
            stages.append(view.pipeline_stage)
        loss_fn = _scaled_loss
        if self.schedule_name == "interleaved_1f1b":
            self.schedule = ScheduleInterleaved1F1B(stages, self.microbatches, loss_fn=loss_fn, scale_grads=False)
        else:
            kind = ScheduleGPipe if self.schedule_name == "gpipe" else Schedule1F1B
            self.schedule = kind(stages[0], self.microbatches, loss_fn=loss_fn, scale_grads=False)
        self.tied = self._tied_parameters()
        if any(self._tied_anywhere()):  # every process makes the groups (collectively), ends or not
            self._ends_group = self._make_ends_group()

    def _make_ends_group(self):
        """A process group of the first and last stage at each data- and tensor-parallel place (every process makes
        every group, in the same order, as new_group asks)."""
        mesh = self.mesh.mesh  # ("pp", "dp_out", "ep", "tp")
        ranks = mesh.mesh  # tensor of global ranks
        pp = ranks.shape[0]
        mine = None
        me = torch.distributed.get_rank()
        for place in ranks.reshape(pp, -1).t().tolist():
            pair = sorted({place[0], place[-1]})
            group = torch.distributed.new_group(pair)
            if me in pair:
                mine = group
        return mine

    # ── the stage's forward ─────────────────────────────────────────────────────────────────────────────────────

    def _forward(self, x: torch.Tensor, targets: torch.Tensor | None = None, _stage: int | None = None,
                 _record: bool = True):
        """One micro-batch through stage `_stage` of this process: the embedding on the first, this stage's blocks,
        the head and loss on the last (scaled; its router losses added). A stage before the last returns its output
        with its router losses attached for backward. `_record`: keep its losses for the logs and let the stage's
        layers count the micro-batch (a model's `after_micro_batch`: MoE loads for bias balancing)."""
        model = self.model
        a, b = self.plan.ranges[_stage]
        if _stage == 0:
            x = model.embed(x)
        x = _through(model, x, self.seq_len, a, b)
        aux = self._auxiliary_losses(a, b, _record)
        if _record and not self.evaluating:
            _with_blocks(model, a, b, self.hooks.after_micro_batch)
        if _stage == self.n_stages - 1:
            loss = full_value(model.head(x, targets)[1])
            if _record:
                self.state.losses.append(loss.detach().float())
            if self.evaluating:
                return loss
            total = loss + sum(aux.values()) if aux else loss
            return total * self.scale
        if aux and not self.evaluating:
            x = _WithAuxiliary.apply(x, sum(aux.values()) * self.scale)
        return x

    def _auxiliary_losses(self, a: int, b: int, record: bool) -> dict[str, torch.Tensor]:
        """This stage's share of the model's auxiliary losses (each the mean over the model's layers that have it):
        the sum over its layers a..b-1 / the model's count of such layers. Recorded (detached) for the logs."""
        layers = [i for i in self.aux_layers if a <= i < b]
        if not layers:
            return {}
        per_layer = [_with_blocks(self.model, i, i + 1, self.hooks.auxiliary_losses) for i in layers]
        out = {name: torch.stack([losses[name] for losses in per_layer]).sum(dim=0) / self.n_aux
               for name in self.aux_names}
        if record:
            self.state.aux.append({k: v.detach().float() for k, v in out.items()})
        return out

    # ── one batch ───────────────────────────────────────────────────────────────────────────────────────────────

    def train_batch(self, inputs: torch.Tensor, targets: torch.Tensor, accum: int,
                    context: Callable[[], Any] = nullcontext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Forward and backward of one replica batch in micro-batches. Returns the batch's mean cross-entropy (on
        the last stage; zero elsewhere) and router losses (this process's stages' shares) for the logs; the caller
        sums them over the pipeline."""
        self.state = _StageState()
        self.scale = 1.0 / (self.microbatches * accum)
        kwargs: dict[str, Any] = {}
        if self.last:
            kwargs = {"targets": targets, "target": targets, "losses": []}
        args = (inputs,) if self.first else ()
        with context():
            self.schedule.step(*args, **kwargs, return_outputs=False)
        return self._summary()

    def _summary(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        zero = torch.zeros((), device=self.device)
        loss = torch.stack(self.state.losses).mean() if self.state.losses else zero
        aux: dict[str, torch.Tensor] = {}
        if self.n_aux:
            for name in self.aux_names:
                values = [a[name] for a in self.state.aux]
                aux[name] = torch.stack(values).mean() if values else zero.clone()
        return loss, aux

    def after_backward(self) -> None:
        """The tied weight's gradient: the embedding's part (first stage) plus the head's (last stage)."""
        if self._ends_group is None:
            return
        from torch.distributed.tensor import DTensor

        for p in self.tied:
            grad = p.grad
            if grad is None:
                continue
            if isinstance(grad, DTensor):
                # under tp the head's gradient may come back in another layout than the embedding's (replicated,
                # partial): both ends sum the parameter's own shard
                if grad.placements != p.placements:
                    grad = p.grad = grad.redistribute(p.device_mesh, p.placements)
                grad = grad.to_local()
            torch.distributed.all_reduce(grad, group=self._ends_group)

    def pipeline_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum over the stages (each holds its part of the loss and router losses)."""
        torch.distributed.all_reduce(values, group=self.mesh.pp.get_group())
        return values

    @torch.no_grad()
    def eval_batch(self, inputs: torch.Tensor, targets: torch.Tensor, context: Callable[[], Any] = nullcontext
                   ) -> torch.Tensor | None:
        """Forward of one batch stage to stage (no micro-batches: the schedule's are for training); the loss on the
        process holding the last stage, None elsewhere. Activations travel by send/recv over the pipeline group,
        a shape header first."""
        self.state = _StageState()
        self.evaluating = True
        group = self.mesh.pp.get_group()
        pp = self.mesh.layout.pp
        x = None
        try:
            with context():
                for s in range(self.n_stages):
                    if s not in self.mine:
                        continue
                    if s > 0:
                        x = _recv(group, (s - 1) % pp, self.device)
                    out = self.model(inputs if s == 0 else x, targets if s == self.n_stages - 1 else None, _stage=s)
                    if s < self.n_stages - 1:
                        _send(out, group, (s + 1) % pp)
                    else:
                        return out
        finally:
            self.evaluating = False
        return None


def _scaled_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The last stage returns its (scaled) loss itself: the schedule's loss function passes it on."""
    return output


def _through(model: nn.Module, x: torch.Tensor, seq_len: int, a: int, b: int) -> torch.Tensor:
    """Blocks a..b-1 of the model through its own `through_blocks`."""
    return _with_blocks(model, a, b, lambda: model.through_blocks(x, seq_len))


def _with_blocks(model: nn.Module, a: int, b: int, fn: Callable[[], Any]) -> Any:
    """fn() while model.blocks holds blocks a..b-1 only (a process with two stages holds both stages' blocks; the
    model's own methods iterate model.blocks)."""
    blocks = model.blocks
    saved = blocks._modules
    blocks._modules = {str(i): saved[str(i)] for i in range(a, b)}
    try:
        return fn()
    finally:
        blocks._modules = saved


_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _send(x: torch.Tensor, group, dst_local: int) -> None:
    dst = torch.distributed.get_global_rank(group, dst_local)
    header = torch.tensor([x.dim(), _DTYPES.index(x.dtype), *x.shape], dtype=torch.long)
    header = torch.cat([header, header.new_zeros(8 - len(header))])
    torch.distributed.send(header.to(x.device), dst, group=group)
    torch.distributed.send(x.contiguous(), dst, group=group)


def _recv(group, src_local: int, device: torch.device) -> torch.Tensor:
    src = torch.distributed.get_global_rank(group, src_local)
    header = torch.zeros(8, dtype=torch.long, device=device)
    torch.distributed.recv(header, src, group=group)
    ndim, dtype = int(header[0]), _DTYPES[int(header[1])]
    x = torch.empty([int(d) for d in header[2:2 + ndim]], dtype=dtype, device=device)
    torch.distributed.recv(x, src, group=group)
    return x
