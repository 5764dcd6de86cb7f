"""The model's tensor-parallel plan, assembled from its units' own plans (`KindUnit.tensor_parallel`), torch-free.

Each entry places one unit's plan on the generated module: where its module sits in the Model (`blocks.1.attn`), the
unit's field path in the spec (`model.layers.mlp.ffn`), and the plan. The rules (archspec.spec.rules) read it to refuse
a spec that cannot be split before any process-group work; archspec.train.tensor_parallel applies it. The module
names are the generated file's (archspec/codegen/templates/model.py.j2): `tok_emb`, `tok_norm`, `blocks.i.attn`,
`blocks.i.ffn`, the block's norms (BlockShape.input_norms, output_norms), `final_norm`, `lm_head`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from archspec.kinds.base import Divides, Problem, Split, TPPlan

if TYPE_CHECKING:  # pragma: no cover
    from archspec.spec.model import ModelSpec, Spec

TP_PATH = ("train", "parallel", "tp")


@dataclass(frozen=True)
class Placed:
    module: str  # the module the plan's names are relative to, in the Model ("" the Model itself)
    path: tuple[str, ...]  # the unit's field path in the spec
    unit: Any  # the unit (a kind, the block shape, or None for the embedding and head)
    plan: TPPlan | None  # None: the unit's kind has no tensor-parallel plan


def embedding_plan(m: "ModelSpec") -> TPPlan:
    """The token embedding and the head, vocabulary-parallel; tied, they stay one matrix (both split by rows)."""
    return TPPlan({"tok_emb": Split("vocab"), "lm_head": Split("vocab")},
                  divides=(Divides(("model", "vocab_size"), m.vocab_size, "vocab_size"),))


def model_plan(m: "ModelSpec") -> list[Placed]:
    """Every unit's plan, placed: the embedding and head, the positions, then layer by layer its token mixer
    (attention with its sparsity pattern, or another mixer kind), FFN, block wiring and norms, then the final norm."""
    from archspec.spec.layers import layer_indices

    groups = {name: set(layer_indices(g.select, m.n_layers, ())[0]) for name, g in sorted(m.layers.items())}

    def path_of(component: str, unit: Any, wide: Any, layer: int) -> tuple[str, ...]:
        if unit is wide:
            return ("model", component)
        group = next((n for n, layers in groups.items() if layer in layers and getattr(m.layers[n], component)),
                     None)
        return ("model", "layers", group, component) if group else ("model", component)

    out = [Placed("", ("model",), None, embedding_plan(m))]
    if m.embedding_norm:
        out.append(Placed("tok_norm", ("model", "norm"), m.norm, m.norm.tensor_parallel(m)))
    positional = m.attention.positional
    out.append(Placed("", ("model", "attention", "positional"), positional, positional.tensor_parallel(m)))
    for i, block in enumerate(m.blocks()):
        where = f"blocks.{i}"
        mixer = block.token_mixer  # its module is the block's attribute the kind names (attn, conv)
        attr = type(mixer).attribute
        if mixer is block.attention:
            att_path = path_of("attention", block.attention, m.attention, i)
            out.append(Placed(f"{where}.{attr}", att_path, block.attention, block.attention.tensor_parallel(m)))
            sparsity = block.attention.sparsity
            out.append(Placed(f"{where}.{attr}", att_path + ("sparsity",), sparsity, sparsity.tensor_parallel(m)))
        else:
            out.append(Placed(f"{where}.{attr}", path_of("mixer", mixer, m.mixer, i), mixer, mixer.tensor_parallel(m)))
        if type(block.ffn).sublayer:
            out.append(Placed(f"{where}.ffn", path_of("ffn", block.ffn, m.ffn, i), block.ffn,
                              block.ffn.tensor_parallel(m)))
        shape = block.block
        out.append(Placed(where, path_of("block", shape, m.block, i), shape, shape.tensor_parallel(m)))
        norm_path = path_of("norm", block.norm, m.norm, i)
        for name in block.norms():
            out.append(Placed(f"{where}.{name}", norm_path, block.norm, block.norm.tensor_parallel(m)))
    if m.final_norm:
        out.append(Placed("final_norm", ("model", "norm"), m.norm, m.norm.tensor_parallel(m)))
    return out


def divisors(n: int) -> list[int]:
    """The divisors of n (up to 1024, the largest degree train.parallel takes)."""
    return [d for d in range(1, min(n, 1024) + 1) if n % d == 0]


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(str(p) for p in path)


def tp_problems(spec: "Spec") -> list[Problem]:
    """Why `spec` cannot be split over train.parallel.tp processes, each at train.parallel.tp and naming the unit's
    field: a kind with no plan, a configuration a kind refuses, a count tp does not divide (with the tp values that
    divide every count, and the nearest count tp divides)."""
    tp = spec.train.parallel.tp
    if tp == 1:
        return []
    m = spec.model
    out: list[Problem] = []
    seen: set[str] = set()
    counts: dict[tuple[str, ...], Divides] = {}
    for placed in model_plan(m):
        where = _dotted(placed.path)
        if placed.plan is None:
            msg = (f"{where}: kind {placed.unit.kind!r} has no tensor-parallel plan; use tp 1, or a kind that has one")
        elif placed.plan.refused is not None:
            field, why = placed.plan.refused
            msg = f"{_dotted(placed.path + field)}: {why}"
        else:
            for d in placed.plan.divides:
                counts.setdefault(d.path if d.path[:1] == ("model",) else placed.path + d.path, d)
            continue
        if msg not in seen:
            seen.add(msg)
            out.append((TP_PATH, msg, tp))
    seq_len = spec.train.seq_len or m.context_length
    every = math.gcd(seq_len, *(d.value for d in counts.values()))
    fits = ", ".join(map(str, divisors(every)))
    for path, d in counts.items():
        if d.value % tp:
            padding = " (the vocabulary is not padded)" if d.what == "vocab_size" else ""
            msg = (f"{_dotted(path)} ({d.value}) is not divisible by tp {tp}{padding}: use tp in {{{fits}}} or "
                   f"{d.what} {-(-d.value // tp) * tp}")
            if msg not in seen:
                seen.add(msg)
                out.append((TP_PATH, msg, tp))
    if seq_len % tp:
        out.append((TP_PATH, f"train.seq_len ({seq_len}) is not divisible by tp {tp} (each rank holds seq_len / tp "
                    f"positions of the residual stream): use tp in {{{fits}}} or seq_len "
                    f"{max(tp, seq_len // tp * tp)}", tp))
    return out
