"""Rules that relate several fields. Each problem is reported at its own field path with the valid range."""

from __future__ import annotations

from typing import TYPE_CHECKING

from archspec.kinds.base import Problem  # (field path, message, offending value)
from archspec.spec.parallel_plan import tp_problems

if TYPE_CHECKING:
    from archspec.spec.model import Spec

# Names whose generated file (generated/<name>.py) would shadow a module that file itself imports (the directory
# of a script run beside it comes first on sys.path).
RESERVED_NAMES = {"torch", "math", "archspec"}


def cross_field_problems(spec: "Spec") -> list[Problem]:
    m = spec.model
    att = m.attention
    out: list[Problem] = []
    p_att = ("model", "attention")

    out += m.layer_problems()  # per-layer groups: selections, overlaps that disagree, merged fields
    if m._unused_attention:  # a written attention that no layer would use (model.mixer is another kind)
        out.append((p_att, f"no layer mixes tokens by attention (model.mixer is {m.mixer.kind}), so nothing would "
                    "read it; leave model.attention out, or mix some layers by attention (model.mixer null and a "
                    "layer group's mixer for the others)", "..."))
    if m.mixer is None:  # the attention kind's own rules (heads, widths), when some layer attends
        out += att.problems(m, p_att)
    if not m.layer_problems():
        # A layer group's own components get the same rules as the model-wide ones, at the group's path.
        checked: set[int] = set()
        for block, layers in m.block_groups():
            for c, unit, wide in (("attention", block.attention, att), ("norm", block.norm, m.norm),
                                  ("ffn", block.ffn, m.ffn), ("attention", block.attention.sparsity, att.sparsity),
                                  ("block", block.block, m.block), ("mixer", block.mixer, m.mixer)):
                if unit is None or unit is wide or id(unit) in checked:
                    continue
                checked.add(id(unit))
                group = next((n for n in sorted(m.layers) if getattr(m.layers[n], c) and _selects(m, n, layers[0])),
                             None)
                if group is None:
                    continue
                where = ("model", "layers", group, c)
                if unit is block.attention:
                    out += unit.problems(m, where)
                else:  # a kind reports at the path it is given
                    out += unit.problems(m, where + (("sparsity",) if unit is block.attention.sparsity else ()))
    out += m.block.problems(m, ("model", "block"))  # shared_norm without parallel; parallel with post/output
    for path, unit in m.unit_paths():  # each kind's own rules (rope: even head_dim; sinusoidal: even d_model)
        out += unit.problems(m, path)

    out += _parametrization_problems(m)
    out += _parallel_problems(spec)
    if m.media is not None:  # the cross-attention layers have no tensor-parallel plan and sit beside the blocks
        par = spec.train.parallel
        for name in ("tp", "pp"):
            if getattr(par, name) > 1:
                out.append((("train", "parallel", name), f"a model with media input (model.media) is not split yet: "
                            f"its cross-attention layers have no {name} plan; set {name}: 1, got "
                            f"{getattr(par, name)}", getattr(par, name)))
    out += _optimizer_problems(spec)
    out += _mtp_problems(spec)

    if spec.name in RESERVED_NAMES:
        out.append((("name",), f"{spec.name!r} would generate {spec.name}.py, which shadows the Python module of that "
                    "name for scripts run beside it; pick another name", spec.name))

    t = spec.train
    if t.seq_len is not None and t.seq_len > m.context_length:
        out.append((("train", "seq_len"), f"must be at most model.context_length ({m.context_length}), got {t.seq_len}", t.seq_len))
    if t.fp8_scaling != "tensorwise" and t.precision != "fp8":
        out.append((("train", "fp8_scaling"), f"applies to train.precision fp8 only (got precision {t.precision}); "
                    "leave it out or set precision: fp8", t.fp8_scaling))
    if t.warmup_steps > t.steps:
        out.append((("train", "warmup_steps"), f"must be at most train.steps ({t.steps}), got {t.warmup_steps}", t.warmup_steps))
    out += _layout_problems(t, spec.model.n_layers)
    if not out:  # (a model already refused may lack what the plans read: head_dim, widths)
        out += tp_problems(spec)  # train.parallel.tp: every unit can be split that many ways (spec.parallel_plan)
    out += t.data.corpus.problems(spec)  # a capability task: its tokenizer and whether it fits (archspec.data)
    out += t.data.tokenizer.problems(spec)
    return out


def _layout_problems(t, n_layers: int) -> list[Problem]:
    """What the loop does not do across a split model yet (the model's own divisibility is each unit's rule)."""
    par, out = t.parallel, []
    split = [f"{k} {getattr(par, k)}" for k in ("tp", "ep", "pp") if getattr(par, k) > 1]
    if split and t.stability:
        out.append((("train", "stability"), f"per-layer stability metrics are not measured across a split model "
                    f"({', '.join(split)}): each process sees only its shards; set stability: false or tp/ep/pp 1",
                    True))
    if split and t.precision == "fp16":
        out.append((("train", "precision"), f"fp16 loss scaling across a split model ({', '.join(split)}) is not built: "
                    "each process would find overflows in its own shards only and skip steps alone; use bf16, or "
                    "tp/ep/pp 1", t.precision))
    out += pipeline_problems(t, n_layers)
    if par.tp > 1 and t.precision == "fp8":
        out.append((("train", "precision"), f"fp8 under tensor parallelism (tp {par.tp}) is not built: torchao's "
                    "float8 linears need their own parallel styles; use bf16, or tp 1", t.precision))
    return out


def pipeline_problems(t, n_layers: int) -> list[Problem]:
    """What train.parallel.pp asks of the recipe: enough layers for its stages, a batch its micro-batches divide, and
    as many micro-batches as the schedule needs (torch.distributed.pipelining's own conditions, said before a run)."""
    par = t.parallel
    if par.pp == 1:
        if par.microbatches is not None:
            return [(("train", "parallel", "microbatches"), "only means something with pipeline parallelism "
                     "(train.parallel.pp > 1); remove it or set pp", par.microbatches)]
        return []
    out: list[Problem] = []
    per_rank = 2 if par.schedule == "interleaved_1f1b" else 1
    stages = par.pp * per_rank
    if n_layers < stages:
        why = f" ({par.pp} processes × 2 stages each: interleaved_1f1b)" if per_rank == 2 else ""
        out.append((("train", "parallel", "pp"), f"{stages} pipeline stages{why} need at least as many layers; the "
                    f"model has {n_layers}: set pp to at most {max(1, n_layers // per_rank)}", par.pp))
    m = par.microbatches or par.pp
    if t.batch_size % m:
        fits = [d for d in range(1, t.batch_size + 1) if t.batch_size % d == 0 and (d >= par.pp
                or par.schedule == "gpipe")]
        out.append((("train", "parallel", "microbatches"), f"must divide train.batch_size ({t.batch_size}): each "
                    f"replica's batch is split into {m} micro-batches of equal size"
                    + (f"; one of {', '.join(map(str, fits))}" if fits else
                       f"; raise train.batch_size to a multiple of {m}"), m))
    elif par.schedule != "gpipe" and m < par.pp:
        out.append((("train", "parallel", "microbatches"), f"{par.schedule} needs at least as many micro-batches as "
                    f"stages ({par.pp}): with fewer, the last stage's first backward would wait on a forward that "
                    f"never comes; set microbatches >= {par.pp} or schedule: gpipe", m))
    elif par.schedule == "interleaved_1f1b" and m % max(1, m // par.pp):
        rounds = max(1, m // par.pp)
        out.append((("train", "parallel", "microbatches"), f"interleaved_1f1b runs micro-batches in rounds of pp "
                    f"({par.pp}): {m} is not a whole number of its {rounds} rounds; use a multiple of {par.pp}", m))
    return out


def _ffn_paths(m) -> list[tuple[tuple[str, ...], object]]:
    """Each distinct FFN unit of the model with the path it is written at (model.ffn, or its layer group's)."""
    out, seen = [], set()
    for block, layers in m.block_groups():
        unit = block.ffn
        if id(unit) in seen:
            continue
        seen.add(id(unit))
        if unit is m.ffn:
            out.append((("model", "ffn"), unit))
            continue
        group = next((n for n in sorted(m.layers) if getattr(m.layers[n], "ffn") and _selects(m, n, layers[0])), None)
        out.append((("model", "layers", group, "ffn") if group else ("model", "ffn"), unit))
    return out


def _parallel_problems(spec) -> list[Problem]:
    """What `train.parallel` asks of the model's units: each FFN kind that can be split says how
    (`parallel_problems`); ep > 1 needs an MoE layer to spread."""
    par, m = spec.train.parallel, spec.model
    if par.ep == 1 and par.tp == 1:
        return []
    splittable = [(path, unit) for path, unit in _ffn_paths(m) if hasattr(unit, "parallel_problems")]
    out: list[Problem] = []
    if par.ep > 1 and not splittable:
        out.append((("train", "parallel", "ep"), f"the spec has no MoE layer: expert parallelism spreads an MoE "
                    f"layer's experts over processes; set ep: 1, got {par.ep}", par.ep))
    for path, unit in splittable:
        for problem in unit.parallel_problems(m, par, path):
            if problem not in out:
                out.append(problem)
    return out


def _parametrization_problems(m) -> list[Problem]:
    """µP's options: the base width means nothing under the standard parametrization (it would only split one model
    into two hashes; its default written out is harmless), and sqrt(d_model)-scaled embeddings grow with the width, which µP holds constant."""
    out: list[Problem] = []
    if m.parametrization != "mup" and m.mup_base_width != type(m).model_fields["mup_base_width"].default:
        out.append((("model", "mup_base_width"), "only means something with model.parametrization: mup (the "
                    f"parametrization is {m.parametrization}); remove it or set the parametrization to mup",
                    m.mup_base_width))
    if m.parametrization == "mup" and m.embedding_scale != "none":
        out.append((("model", "embedding_scale"), f"{m.embedding_scale} grows the token embeddings with the width, "
                    "which µP (model.parametrization: mup) keeps constant; use none", m.embedding_scale))
    return out


def _optimizer_problems(spec) -> list[Problem]:
    """What `train.optimizer: {kind: muon}` is not built with, and why (archspec.train.optim; docs/optimizers.md)."""
    t, m = spec.train, spec.model
    if t.optimizer.kind != "muon":
        return []
    out: list[Problem] = []
    where = ("train", "optimizer", "kind")
    if m.parametrization == "mup":
        out.append((where, "muon with model.parametrization: mup is not built: Muon scales each matrix's update "
                    "itself (adjust_lr_fn original: already µP's spectral scaling, so µP would scale it twice; "
                    "match_rms_adamw, the default: AdamW's RMS, never composed with µP's rates); use adamw, or "
                    "parametrization standard", "muon"))
    par = t.parallel
    if par.kind == "fsdp":
        out.append((where, "muon under train.parallel.kind fsdp is not built: FSDP shards each matrix over the "
                    "processes and Muon orthogonalizes whole matrices (torch.optim.Muon takes plain 2-D tensors); "
                    "use parallel kind ddp", "muon"))
    for axis, why in (("tp", "tensor parallelism splits each matrix over processes and Muon orthogonalizes whole "
                             "matrices"),
                      ("pp", "a pipeline stage's optimizer holds part of the blocks, which the Muon/AdamW split has "
                             "not been built or tested for"),
                      ("ep", "expert parallelism's layout has not been built or tested with it")):
        if getattr(par, axis) > 1:
            out.append((where, f"muon with train.parallel.{axis} > 1 is not built: {why}; use {axis}: 1 or "
                        "optimizer adamw", "muon"))
    return out


def _mtp_problems(spec) -> list[Problem]:
    """Multi-token prediction (model.mtp): each depth shortens the sequence its loss is over by one, and the loop trains
    it on one process's whole model only (docs/mtp.md)."""
    m, t = spec.model, spec.train
    if m.mtp is None:
        return []
    out: list[Problem] = []
    where = ("model", "mtp", "depth")
    seq_len = t.seq_len or m.context_length
    if m.mtp.depth >= seq_len:
        out.append((where, f"must be below the training sequence length ({seq_len}): depth k predicts the token k + 1 "
                    f"ahead, so a window of seq_len tokens has seq_len - k targets for it; got {m.mtp.depth}",
                    m.mtp.depth))
    if m.parametrization == "mup":
        out.append((("model", "mtp"), "with model.parametrization: mup is not built (the MTP modules' matrices would "
                    "need µP's init and rates too); use the standard parametrization", "..."))
    par = t.parallel
    for axis, why in (("tp", "the MTP modules are not in the tensor-parallel plan and their loss is not vocabulary-"
                             "parallel"),
                      ("pp", "the MTP modules need the embedding (first stage) and the head (last stage) together"),
                      ("ep", "the MTP module's experts are not spread over processes")):
        if getattr(par, axis) > 1:
            out.append((("model", "mtp"), f"with train.parallel.{axis} > 1 is not built: {why}; use {axis}: 1 or "
                        "leave model.mtp out", "..."))
    return out


def trainability_problems(spec: "Spec") -> list[str]:
    """Problems that keep `archspec train` from running this spec with its own recipe, as `path: message` lines.

    Not part of validation: a model with vocab_size 100 is a valid architecture (for a tokenizer of its own), but
    `archspec build` of a spec whose recipe cannot train it says so before anything is generated."""
    return spec.train.data.tokenizer.trainability_problems(spec.model)


def _selects(m, group: str, layer: int) -> bool:
    from archspec.spec.layers import layer_indices

    return layer in layer_indices(m.layers[group].select, m.n_layers, ())[0]
