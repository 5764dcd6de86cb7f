"""Kinds: every norm, positional encoding, attention pattern, token mixer and FFN is one self-contained unit.

A unit is one pydantic class (its spec fields) that also carries everything else about the kind:

- its template, a Jinja2 file beside the class's module (`<kind>.py.j2`), which lays out the kind's nn.Module and,
  as macros, the lines it adds at the model's hook points (see `Family.hooks`);
- its accounting (`params`, `flops`, ...: the methods of its family's base class, `archspec.kinds.base`);
- its initialisation (in the template: each generated module initialises its own parameters);
- what it adds to the generated file's constants (`constants`) and docstring (`describe`);
- its cross-field rules (`problems`) and derived defaults (`fill_defaults`);
- what the Hypothesis strategies need to draw it (`strategy`);
- the metrics its generated modules report, and how a report shows them (`metric_prefix`, `eval_stats`,
  `eval_metrics`, `in_summary`, `report_cell`).

Families are assembled from their units: the spec's unions, the JSON Schema, `known_keys()` (registry filters),
`--set`, the strategies and codegen all read the registry below, so nothing outside a unit switches on `kind`.

Adding a kind (see docs/EXTENDING.md):

    from typing import Literal
    from archspec.kinds import FFNKind, Const, register

    @register
    class SquaredReLU(FFNKind):
        kind: Literal["relu2"] = "relu2"
        hidden_dim: int | None = None
        ...

`register` may be called after the spec classes are built (from a plugin module); the unions are then rebuilt in
place, so every class and function that already imported `Spec` sees the new kind.
"""

from __future__ import annotations

from archspec.kinds.base import (AttentionKind, Const, FFNKind, Family, KindUnit, MixerKind, NormKind, PositionalKind, Problem, SparsityKind,
                                 Strict, family, families, kind_union, lit_bool, lit_float, lit_int, metric_kinds,
                                 register, registry_version)

__all__ = [
    "AttentionKind", "Const", "FFNKind", "Family", "KindUnit", "MixerKind", "NormKind", "PositionalKind", "Problem", "SparsityKind", "family",
    "families", "Strict", "kind_union", "lit_bool", "lit_float", "lit_int", "metric_kinds", "register", "registry_version",
]

# The built-in kinds register themselves on import, through the same `register` a plugin uses.
from archspec.kinds import ffn as _ffn  # noqa: E402,F401
from archspec.kinds import norm as _norm  # noqa: E402,F401
from archspec.kinds import positional as _positional  # noqa: E402,F401
from archspec.kinds import sparsity as _sparsity  # noqa: E402,F401
from archspec.kinds import attention as _attention  # noqa: E402,F401 (its kinds hold the positional and sparsity unions)
from archspec.kinds import mixer as _mixer  # noqa: E402,F401
from archspec.kinds.attention import Attention  # noqa: E402,F401 (the attention family's union)
