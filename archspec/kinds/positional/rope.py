"""Rotary position embedding (Su et al., 2021), as in LLaMA ("rotate half" layout), with optional frequency
scaling for longer contexts: `linear` (position interpolation, Chen et al., 2023) or `llama3` (Llama 3.1's
per-band rescaling of the frequencies)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from archspec.errors import printable
from archspec.kinds.base import Const, PositionalKind, Strict, kind_union, lit_float, lit_int, register
from archspec.kinds.limits import MAX_CONTEXT


class LinearRopeScaling(Strict):
    kind: Literal["linear"] = "linear"  # every frequency divided by `factor` (position interpolation)
    factor: float = Field(2.0, ge=1.0, le=1024.0)


class Llama3RopeScaling(Strict):
    """Llama 3.1: wavelengths longer than original_context_length / low_freq_factor are stretched by `factor`,
    those shorter than original_context_length / high_freq_factor are kept, the band between is interpolated."""

    kind: Literal["llama3"] = "llama3"
    factor: float = Field(8.0, ge=1.0, le=1024.0)
    low_freq_factor: float = Field(1.0, gt=0.0, le=1024.0)
    high_freq_factor: float = Field(4.0, gt=0.0, le=1024.0)
    original_context_length: int = Field(8192, ge=1, le=MAX_CONTEXT)


RopeScaling = kind_union(Llama3RopeScaling, LinearRopeScaling, default="llama3")

_MAY_BE_ELSEWHERE = ("rope_theta", "partial_rotary_factor")  # an older rope_scaling leaves them to the top level


def _rope_type(cfg, where: str, params: dict) -> str:
    """The scaling type a mapping names (`rope_type`, or `type` in older files; both must agree)."""
    named = [params[k] for k in ("rope_type", "type") if params.get(k) is not None]
    for value in named:
        if not isinstance(value, str):
            raise cfg.refuse(where, f"rope_type: expected a word, got {value!r}")
    if len(set(named)) > 1:
        raise cfg.refuse(where, f"rope_type {named[0]!r} contradicts type {named[1]!r}; give one")
    return named[0] if named else "default"


def _rope_contradiction(cfg, a: dict, b: dict) -> str | None:
    """Why two rope mappings (rope_parameters, rope_scaling) disagree, or None: another type, or a field both give
    with other values, or a scaling field only one gives."""
    ta, tb = _rope_type(cfg, "rope_parameters", a), _rope_type(cfg, "rope_scaling", b)
    if ta != tb:
        return f"rope_type {tb!r} contradicts rope_parameters' {ta!r}"
    fields = {k for k in {*a, *b} if k not in ("rope_type", "type")}
    for k in sorted(fields):
        if k in a and k in b and a[k] != b[k]:
            return f"{k} {b[k]!r} contradicts rope_parameters' {a[k]!r}"
        if (k in a) != (k in b) and k not in _MAY_BE_ELSEWHERE:
            return f"{k} is given in only one of them"
    return None


# transformers' rope dict keys → ours, per scaling type (rope_parameters in 5.x, rope_scaling before)
_HF_FIELDS = {
    "linear": {"factor": "factor"},
    "llama3": {"factor": "factor", "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
               "original_max_position_embeddings": "original_context_length"},
}


@register
class RopePositional(PositionalKind):
    kind: Literal["rope"] = "rope"  # rotary embeddings applied to q and k in every layer (RoFormer, LLaMA)
    theta: float = Field(10000.0, gt=1.0, le=1e9)
    scaling: RopeScaling | None = Field(None, description="frequency scaling: linear | llama3 (default: none)")

    head_dim_multiple = 2  # rotates pairs of dimensions
    relative = True  # q·k depends on the offset alone; angles past the table are computed when asked for

    def problems(self, m, path):
        out = []
        hd, field = m.attention.rotary_width, type(m.attention).rotary_field  # the width rotated, and its field
        if hd is not None and hd % 2:
            out.append((("model", "attention", field), f"must be even for rope (rotates pairs), got {hd}", hd))
        elif m.layers and not m.layer_problems():
            # One rotary table serves every layer: a layer group may not change the head width under rope.
            widths = sorted({b.attention.rotary_width for b in m.blocks()})
            if len(widths) > 1:
                out.append((("model", "layers"), f"every layer must have one head_dim under rope (one rotary table "
                            f"serves all layers), got {widths}; keep n_heads·head_dim per layer, or set head_dim",
                            widths))
        s = self.scaling
        if s is not None and s.kind == "llama3" and s.high_freq_factor <= s.low_freq_factor:
            out.append(((*path, "scaling", "high_freq_factor"),
                        f"must exceed low_freq_factor ({s.low_freq_factor}), got {s.high_freq_factor}",
                        s.high_freq_factor))
        return out

    def constants(self, m) -> list[Const]:
        out = [Const("ROPE_THETA", lit_float(self.theta), "base of the rotary frequencies")]
        s = self.scaling
        if s is not None:
            out.append(Const("ROPE_FACTOR", lit_float(s.factor), f"{s.kind} frequency scaling"))
        if s is not None and s.kind == "llama3":
            out += [Const("ROPE_LOW_FREQ_FACTOR", lit_float(s.low_freq_factor)),
                    Const("ROPE_HIGH_FREQ_FACTOR", lit_float(s.high_freq_factor)),
                    Const("ROPE_ORIGINAL_CONTEXT", lit_int(s.original_context_length),
                          "context length the frequencies were trained at")]
        return out

    def template_context(self, m) -> dict[str, Any]:
        return {"scaling": self.scaling.kind if self.scaling else ""}

    def describe(self, m) -> str:
        return f"rotary positions ({self.scaling.kind} scaling)" if self.scaling else "rotary positions"

    def saved_elements(self, m) -> int:
        a = m.attention
        return (a.n_heads + a.rotary_kv_heads) * a.rotary_width  # the rotated q and k (new tensors; v stays a view)

    def buffer_elements(self, m) -> int:
        head_dim = m.blocks()[0].attention.rotary_width if not m.layer_problems() else m.attention.rotary_width
        return 2 * m.context_length * head_dim  # cos and sin tables (one head width: see problems)

    @classmethod
    def strategy_overrides(cls, ctx):
        from hypothesis import strategies as st

        llama3 = st.tuples(st.floats(1.0, 16.0), st.floats(0.5, 2.0), st.floats(0.1, 4.0), st.integers(1, 4096)).map(
            lambda t: {"kind": "llama3", "factor": t[0], "low_freq_factor": t[1],
                       "high_freq_factor": t[1] + t[2], "original_context_length": t[3]})
        linear = st.floats(1.0, 16.0).map(lambda f: {"kind": "linear", "factor": f})
        return {"scaling": st.one_of(st.none(), llama3, linear)}

    @classmethod
    def invalid_cases(cls):
        return {"even_head_dim": _odd_head_dim}

    # ── HF transformers interop ──
    hf_block = "rotary"

    @classmethod
    def from_hf(cls, cfg):
        """transformers 5.x writes `rope_parameters` ({rope_type, rope_theta, ...}); older files `rope_theta` and
        `rope_scaling` ({type or rope_type, factor, ...}): both are read; a type archspec lacks is refused."""
        cfg.mark("rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor")
        given = {}
        for key in ("rope_parameters", "rope_scaling"):
            value = cfg.data.get(key)
            if value is not None and not isinstance(value, dict):
                raise cfg.refuse(key, f"expected a mapping, got {value!r}")
            if value is not None:
                given[key] = dict(value)
        why = _rope_contradiction(cfg, given["rope_parameters"], given["rope_scaling"]) if len(given) == 2 else None
        if why:  # two places for one setting that disagree: taking either would silently drop the other
            raise cfg.refuse("rope_scaling", f"{why}; give one, or make them agree")
        where = next(iter(given), "rope_parameters")
        params = {**given.get("rope_scaling", {}), **given.get("rope_parameters", {})}
        if any(isinstance(v, dict) for v in params.values()):
            raise cfg.refuse(where, "RoPE parameters per layer type: archspec has one rope for every layer")
        for key in ("rope_theta", "partial_rotary_factor"):  # top level and inside the mapping: they must agree
            if key in params and cfg.data.get(key) is not None and params[key] != cfg.data[key]:
                raise cfg.refuse(key, f"{cfg.data[key]!r} contradicts {where}.{key} {params[key]!r}")
            for value, at in ((params.get(key), f"{where}.{key}"), (cfg.data.get(key), key)):
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                    raise cfg.refuse(at, f"expected a number, got {printable(repr(value), 60)}")
        theta = params.pop("rope_theta", None)
        if theta is None:
            theta = cfg.data.get("rope_theta", cfg.hf.defaults.get("rope_theta", 10000.0))
        partial = params.pop("partial_rotary_factor", cfg.data.get("partial_rotary_factor"))
        if partial is not None and partial != 1.0:
            raise cfg.refuse("partial_rotary_factor", f"{partial}: archspec rotates every dimension of a head")
        rope_type = _rope_type(cfg, where, params)
        params.pop("rope_type", None)
        params.pop("type", None)
        out: dict[str, Any] = {"kind": "rope", "theta": float(theta)}
        if rope_type != "default":
            if rope_type not in _HF_FIELDS:
                raise cfg.refuse(where, f"rope_type {rope_type!r}: archspec has default, "
                                 f"{', '.join(_HF_FIELDS)} (rope.scaling)")
            scaling: dict[str, Any] = {"kind": rope_type}
            for hf_key, ours in _HF_FIELDS[rope_type].items():
                value = params.pop(hf_key, None)
                if value is None and hf_key == "original_max_position_embeddings":
                    value = cfg.data.get(hf_key) or cfg.data.get(cfg.key("context_length"))
                if value is None:
                    raise cfg.refuse(where, f"{hf_key}: required by rope_type {rope_type!r}")
                scaling[ours] = value
            out["scaling"] = scaling
        if params:
            raise cfg.refuse(where, f"{', '.join(sorted(params))}: not used by rope_type {rope_type!r}; "
                             "archspec does not map it")
        return out

    def to_hf(self, m, out, hf, path):
        params: dict[str, Any] = {"rope_type": self.scaling.kind if self.scaling else "default",
                                  "rope_theta": self.theta}
        if self.scaling is not None:
            for hf_key, ours in _HF_FIELDS[self.scaling.kind].items():
                params[hf_key] = getattr(self.scaling, ours)
        out["rope_parameters"] = params  # transformers 5.x
        out["rope_theta"] = self.theta  # and what older versions read
        out["rope_scaling"] = params if self.scaling else None


def _odd_head_dim(draw, data, spec):
    """rope on heads of odd width (it rotates pairs of dimensions): blamed on head_dim."""
    from hypothesis import strategies as st

    if type(spec.model.attention).rotary_field != "head_dim":  # another attention kind has its own case
        return None
    att = data["model"].setdefault("attention", {})
    att["positional"] = {"kind": "rope"}
    att["head_dim"] = 2 * draw(st.integers(0, 3)) + 1  # n_heads·head_dim ≤ 8·d_model holds for these sizes
    if att.get("n_heads", spec.model.attention.n_heads) * att["head_dim"] > 8 * spec.model.d_model:
        return None
    return ("model", "attention", "head_dim")
