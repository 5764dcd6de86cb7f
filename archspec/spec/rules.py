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
    out += att.problems(m, p_att)  # the attention kind's own rules (heads, widths)
    if not m.layer_problems():
        # A layer group's own components get the same rules as the model-wide ones, at the group's path.
        checked: set[int] = set()
        for block, layers in m.block_groups():
            for c, unit, wide in (("attention", block.attention, att), ("norm", block.norm, m.norm),
                                  ("ffn", block.ffn, m.ffn), ("attention", block.attention.sparsity, att.sparsity),
                                  ("block", block.block, m.block)):
                if unit is wide or id(unit) in checked:
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
    out += _layout_problems(t)
    if not out:  # (a model already refused may lack what the plans read: head_dim, widths)
        out += tp_problems(spec)  # train.parallel.tp: every unit can be split that many ways (spec.parallel_plan)
    out += t.data.corpus.problems(spec)  # a capability task: its tokenizer and whether it fits (archspec.data)
    out += t.data.tokenizer.problems(spec)
    return out


def _layout_problems(t) -> list[Problem]:
    """What the loop does not do across a split model yet (the model's own divisibility is each unit's rule)."""
    par, out = t.parallel, []
    split = [f"{k} {getattr(par, k)}" for k in ("tp", "ep") if getattr(par, k) > 1]
    if split and t.stability:
        out.append((("train", "stability"), f"per-layer stability metrics are not measured across a split model "
                    f"({', '.join(split)}): each process sees only its shards; set stability: false or tp/ep 1", True))
    if par.pp > 1:
        out.append((("train", "parallel", "pp"), "pipeline parallelism is not built yet; set pp: 1 (tensor and expert "
                    "parallelism, tp and ep, are)", par.pp))
    if split and t.precision == "fp16":
        out.append((("train", "precision"), f"fp16 loss scaling across a split model ({', '.join(split)}) is not built: "
                    "each process would find overflows in its own shards only and skip steps alone; use bf16, or "
                    "tp/ep 1", t.precision))
    if par.tp > 1 and t.precision == "fp8":
        out.append((("train", "precision"), f"fp8 under tensor parallelism (tp {par.tp}) is not built: torchao's "
                    "float8 linears need their own parallel styles; use bf16, or tp 1", t.precision))
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


def trainability_problems(spec: "Spec") -> list[str]:
    """Problems that keep `archspec train` from running this spec with its own recipe, as `path: message` lines.

    Not part of validation: a model with vocab_size 100 is a valid architecture (for a tokenizer of its own), but
    `archspec build` of a spec whose recipe cannot train it says so before anything is generated."""
    return spec.train.data.tokenizer.trainability_problems(spec.model)


def _selects(m, group: str, layer: int) -> bool:
    from archspec.spec.layers import layer_indices

    return layer in layer_indices(m.layers[group].select, m.n_layers, ())[0]
