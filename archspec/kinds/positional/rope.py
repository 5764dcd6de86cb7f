"""Rotary position embedding (Su et al., 2021), with optional frequency scaling for longer contexts: `linear`
(position interpolation, Chen et al., 2023), `llama3` (Llama 3.1's per-band rescaling of the frequencies) or `yarn`
(Peng et al., 2023; DeepSeek-V3). Two pair layouts: `half` rotates each (i, i + d/2) pair (LLaMA, NeoX), `interleaved`
each (2i, 2i + 1) pair (GPT-J, GLM); `partial` rotates the first int(partial · width) dimensions of each head only
(NeoX's rotary_pct, GLM's 0.5, Phi's partial_rotary_factor) and passes the rest through.

The width it rotates within is the attention's `rotary_width` (standard attention: head_dim; an attention kind with a
separate rope part gives that part's width), and the rendered tables and `apply_rope` are ROTARY_DIM wide (the name
HEAD_DIM is kept when every dimension of a head rotates)."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import Field

from archspec.errors import printable
from archspec.kinds.hf import HFUnsupported, put_fact
from archspec.kinds.base import Const, PositionalKind, Since, Strict, TPPlan, kind_union, lit_float, lit_int, register
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


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature for a context stretched by `factor`: 0.1 · mscale · ln(factor) + 1 (1 when
    factor ≤ 1), transformers' `get_mscale` / DeepSeek's `yarn_get_mscale`. The rope unit multiplies cos and sin by
    `YarnRopeScaling.attention_scale()`; DeepSeek-V3's attention also multiplies its softmax scale by
    yarn_mscale(factor, mscale_all_dim)², which belongs to that attention kind."""
    if factor <= 1:
        return 1.0
    return 0.1 * mscale * math.log(factor) + 1.0


class YarnRopeScaling(Strict):
    """YaRN (Peng et al., 2023), as transformers' `_compute_yarn_parameters`: frequencies that turn more than
    beta_fast times over original_context_length are kept, those that turn fewer than beta_slow times are divided by
    `factor`, a linear ramp over the pairs between; cos and sin are multiplied by an attention factor (given, or
    from mscale / mscale_all_dim: see `attention_scale`)."""

    kind: Literal["yarn"] = "yarn"
    factor: float = Field(4.0, ge=1.0, le=1024.0)
    original_context_length: int = Field(4096, ge=1, le=MAX_CONTEXT)
    beta_fast: float = Field(32.0, gt=0.0, le=1024.0, description="rotations above which a frequency is kept")
    beta_slow: float = Field(1.0, gt=0.0, le=1024.0, description="rotations below which it is fully interpolated")
    mscale: float | None = Field(None, ge=0.0, le=100.0, description="with mscale_all_dim: the attention factor's "
                                 "numerator yarn_mscale(factor, mscale) (transformers ignores one without the other)")
    mscale_all_dim: float | None = Field(None, ge=0.0, le=100.0, description="the attention factor's denominator "
                                         "yarn_mscale(factor, mscale_all_dim)")
    attention_factor: float | None = Field(None, gt=0.0, le=100.0, description="cos and sin multiplied by this "
                                           "(default: from factor, mscale and mscale_all_dim)")
    truncate: bool = Field(True, description="the ramp's ends rounded outward to whole pairs (gpt-oss: false)")

    def attention_scale(self) -> float:
        """What cos and sin are multiplied by, transformers' rule: attention_factor when given; else, when mscale and
        mscale_all_dim are both set and non-zero, yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim);
        else yarn_mscale(factor)."""
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.mscale and self.mscale_all_dim:
            return float(yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor, self.mscale_all_dim))
        return yarn_mscale(self.factor)


RopeScaling = kind_union(Llama3RopeScaling, LinearRopeScaling, YarnRopeScaling, default="llama3")

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
    "yarn": {"factor": "factor", "original_max_position_embeddings": "original_context_length",
             "beta_fast": "beta_fast", "beta_slow": "beta_slow", "mscale": "mscale", "mscale_all_dim": "mscale_all_dim",
             "attention_factor": "attention_factor", "truncate": "truncate"},
}
# Keys a rope type may leave out, and what transformers then uses (None: the spec's None, the same rule). yarn's
# beta_fast and beta_slow are read as `value or default` there: 0 means the default too.
_HF_OPTIONAL = {"yarn": {"beta_fast": 32.0, "beta_slow": 1.0, "mscale": None, "mscale_all_dim": None,
                         "attention_factor": None, "truncate": True}}


def rotary_width(m) -> int | None:
    """The width the rope unit rotates within (the attention's `rotary_width`: one for every layer, see problems)."""
    att = m.blocks()[0].attention if not m.layer_problems() else m.attention
    return getattr(att, "rotary_width", None)


@register
class RopePositional(PositionalKind):
    kind: Literal["rope"] = "rope"  # rotary embeddings applied to q and k in every layer (RoFormer, LLaMA)
    theta: float = Field(10000.0, gt=1.0, le=1e9)
    scaling: RopeScaling | None = Field(None, description="frequency scaling: linear | llama3 | yarn (default: none)")
    partial: Annotated[float, Since("0.4")] = Field(
        1.0, gt=0.0, le=1.0, description="fraction of each head rotated: the first int(partial · head_dim) "
        "dimensions (even, at least 2); the rest pass through (NeoX's rotary_pct, GLM's 0.5)")
    layout: Annotated[Literal["half", "interleaved"], Since("0.4")] = Field(
        "half", description="which dimensions pair up: half = (i, i + d/2) (LLaMA, NeoX); interleaved = (2i, 2i + 1) "
        "(GPT-J, GLM); d = the rotated dimensions")

    head_dim_multiple = 2  # rotates pairs of dimensions
    relative = True  # q·k depends on the offset alone; angles past the table are computed when asked for
    in_attention = True  # applied in each layer's attention: a layer group may switch it off

    def tensor_parallel(self, m):
        """The angle tables are buffers of the whole sequence (no parameters); each rank rotates its own heads."""
        return TPPlan()

    @classmethod
    def head_dim_step(cls, fields: dict[str, Any]) -> int:
        """The smallest step of head widths whose every multiple rotates an even number (≥ 2) of dimensions at this
        `partial` (int(partial · width), transformers' rounding), for the strategies."""
        partial = fields.get("partial", 1.0)
        for step in (2, 4, 8, 16, 32, 64, 128):
            if all(int(partial * step * k) % 2 == 0 and int(partial * step * k) >= 2 for k in range(1, 17)):
                return step
        raise ValueError(f"no head width step rotates an even number of dimensions at partial {partial}")

    def rotated_dims(self, m) -> int | None:
        """ROTARY_DIM: the dimensions rotated in each head, int(partial · rotary_width) as transformers rounds it
        (`int(head_dim * partial_rotary_factor)`), or None when the width is not known (a spec with other errors)."""
        width = rotary_width(m)
        return None if width is None else int(self.partial * width)

    def problems(self, m, path):
        out = []
        hd, field = m.attention.rotary_width, type(m.attention).rotary_field  # the width rotated, and its field
        rotated = None if hd is None else int(self.partial * hd)
        if hd is not None and self.partial == 1.0 and hd % 2:
            out.append((("model", "attention", field), f"must be even for rope (rotates pairs), got {hd}", hd))
        elif rotated is not None and (rotated % 2 or rotated < 2):
            out.append(((*path, "partial"), f"rotates int({self.partial} · {hd}) = {rotated} dimensions of each head "
                        f"({field} {hd}); rope rotates pairs: that must be even and at least 2", self.partial))
        elif m.layers and not m.layer_problems():
            # One rotary table serves every layer: a layer group may not change the head width under rope.
            found = {b.attention.rotary_width for b in m.blocks()}
            widths = sorted(found - {None})  # None: a layer's heads do not divide its width (reported there)
            if None not in found and len(widths) > 1:
                out.append((("model", "layers"), f"every layer must have one head_dim under rope (one rotary table "
                            f"serves all layers), got {widths}; keep n_heads·head_dim per layer, or set head_dim",
                            widths))
        s = self.scaling
        if s is not None and s.kind == "llama3" and s.high_freq_factor <= s.low_freq_factor:
            out.append(((*path, "scaling", "high_freq_factor"),
                        f"must exceed low_freq_factor ({s.low_freq_factor}), got {s.high_freq_factor}",
                        s.high_freq_factor))
        if s is not None and s.kind == "yarn" and s.beta_fast <= s.beta_slow:
            out.append(((*path, "scaling", "beta_fast"),
                        f"must exceed beta_slow ({s.beta_slow}), got {s.beta_fast}", s.beta_fast))
        return out

    def _dim_name(self, m) -> str:
        """The name the template writes for the rotated width: the attention's own constant for it (HEAD_DIM) when
        every dimension rotates, so a fully rotating model's file reads as before; else ROTARY_DIM."""
        name = getattr(m.attention, "rotary_width_name", None)
        return name if name and self.partial == 1.0 else "ROTARY_DIM"

    def constants(self, m) -> list[Const]:
        out = [Const("ROPE_THETA", lit_float(self.theta), "base of the rotary frequencies")]
        if self._dim_name(m) == "ROTARY_DIM":
            width = getattr(m.attention, "rotary_width_name", None) or "the rotary width"
            out.append(Const("ROTARY_DIM", lit_int(self.rotated_dims(m)),
                             f"int({lit_float(self.partial)} · {width}): dimensions rotated, the rest pass through"))
        s = self.scaling
        if s is not None:
            out.append(Const("ROPE_FACTOR", lit_float(s.factor), f"{s.kind} frequency scaling"))
        if s is not None and s.kind == "llama3":
            out += [Const("ROPE_LOW_FREQ_FACTOR", lit_float(s.low_freq_factor)),
                    Const("ROPE_HIGH_FREQ_FACTOR", lit_float(s.high_freq_factor)),
                    Const("ROPE_ORIGINAL_CONTEXT", lit_int(s.original_context_length),
                          "context length the frequencies were trained at")]
        if s is not None and s.kind == "yarn":
            out += [Const("ROPE_ORIGINAL_CONTEXT", lit_int(s.original_context_length),
                          "context length the frequencies were trained at"),
                    Const("ROPE_BETA_FAST", lit_float(s.beta_fast), "rotations above which a frequency is kept"),
                    Const("ROPE_BETA_SLOW", lit_float(s.beta_slow), "rotations below which it is interpolated"),
                    Const("ROPE_ATTENTION_FACTOR", lit_float(s.attention_scale()),
                          "cos and sin scaled by it (" + ("given" if s.attention_factor is not None else
                                                          "0.1·ln(factor) + 1, with mscale's ratio") + ")")]
        return out

    def template_context(self, m) -> dict[str, Any]:
        s = self.scaling
        return {"scaling": s.kind if s else "", "rot": self._dim_name(m), "partial": self.partial < 1.0,
                "interleaved": self.layout == "interleaved", "truncate": bool(s is not None and s.kind == "yarn"
                                                                              and s.truncate)}

    def describe(self, m) -> str:
        words = [f"{self.scaling.kind} scaling"] if self.scaling else []
        if self.layout == "interleaved":
            words.append("interleaved pairs")
        if self.partial < 1.0:
            words.append(f"{self.partial:g} of each head")
        return f"rotary positions ({', '.join(words)})" if words else "rotary positions"

    def saved_elements(self, m) -> int:
        a = m.attention
        # The rotated q and k, rotary_width wide (new tensors: with partial rotation the concatenation of the rotated
        # and the passed dimensions; v stays a view).
        return (a.n_heads + a.rotary_kv_heads) * a.rotary_width

    def buffer_elements(self, m) -> int:
        return 2 * m.context_length * self.rotated_dims(m)  # cos and sin tables, ROTARY_DIM wide (one: see problems)

    @classmethod
    def strategy_overrides(cls, ctx):
        from hypothesis import strategies as st

        llama3 = st.tuples(st.floats(1.0, 16.0), st.floats(0.5, 2.0), st.floats(0.1, 4.0), st.integers(1, 4096)).map(
            lambda t: {"kind": "llama3", "factor": t[0], "low_freq_factor": t[1],
                       "high_freq_factor": t[1] + t[2], "original_context_length": t[3]})
        linear = st.floats(1.0, 16.0).map(lambda f: {"kind": "linear", "factor": f})
        optional = st.one_of(st.none(), st.floats(0.0, 2.0))
        yarn = st.tuples(st.floats(1.0, 64.0), st.integers(1, 4096), st.floats(0.5, 4.0), st.floats(0.5, 64.0),
                         optional, optional, st.one_of(st.none(), st.floats(0.5, 2.0)), st.booleans()).map(
            lambda t: {k: v for k, v in {
                "kind": "yarn", "factor": t[0], "original_context_length": t[1], "beta_slow": t[2],
                "beta_fast": t[2] + t[3], "mscale": t[4], "mscale_all_dim": t[5], "attention_factor": t[6],
                "truncate": t[7]}.items() if v is not None})
        # Fractions whose rotated width is even at every multiple of a small step (head_dim_step): the strategies
        # then draw head widths that fit; NeoX's 0.25, GLM's 0.5, and 1 (every dimension).
        return {"scaling": st.one_of(st.none(), llama3, linear, yarn),
                "partial": st.sampled_from([1.0, 0.75, 0.5, 0.375, 0.25]),
                "layout": st.sampled_from(["half", "interleaved"])}

    @classmethod
    def invalid_cases(cls):
        return {"even_head_dim": _odd_head_dim, "even_rotated_dims": _odd_rotated_dims}

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
            theta = cfg.data.get("rope_theta")
        if theta is None:  # absent or null: the type's default, as transformers takes it
            theta = cfg.hf.defaults.get("rope_theta", 10000.0)
        partial = params.pop("partial_rotary_factor", cfg.data.get("partial_rotary_factor"))
        if partial is None:  # GLM's config assumes 0.5 when the key is absent
            partial = cfg.hf.defaults.get("partial_rotary_factor", 1.0)
        if partial != 1.0 and not cfg.fact("partial_rotary"):
            raise cfg.refuse("partial_rotary_factor", f"{partial}: {cfg.hf.model_type}'s rotary embedding ignores it "
                             "in transformers (it rotates every dimension), so a model with it is not the one meant")
        if not 0.0 < partial <= 1.0:
            raise cfg.refuse("partial_rotary_factor", f"{partial}: expected a fraction in (0, 1]")
        rope_type = _rope_type(cfg, where, params)
        params.pop("rope_type", None)
        params.pop("type", None)
        out: dict[str, Any] = {"kind": "rope", "theta": float(theta)}
        if partial != 1.0:
            out["partial"] = float(partial)
        if cfg.fact("rope_interleaved"):  # (2i, 2i + 1) pairs: fixed by the type (GLM) or its key (DeepSeek-V3)
            out["layout"] = "interleaved"
        if rope_type != "default":
            if rope_type not in _HF_FIELDS:
                raise cfg.refuse(where, f"rope_type {rope_type!r}: archspec has default, "
                                 f"{', '.join(_HF_FIELDS)} (rope.scaling)")
            scaling: dict[str, Any] = {"kind": rope_type}
            optional = _HF_OPTIONAL.get(rope_type, {})
            for hf_key, ours in _HF_FIELDS[rope_type].items():
                present = hf_key in params
                value = params.pop(hf_key, None)
                if value is None and hf_key == "original_max_position_embeddings":
                    value = cfg.data.get(hf_key) or cfg.data.get(cfg.key("context_length"))
                if hf_key in optional:
                    if hf_key in ("beta_fast", "beta_slow"):
                        value = value or optional[hf_key]  # transformers reads `value or default`: 0 is the default
                    elif value is None:
                        value = optional[hf_key]
                    if value is None:
                        continue
                if value is None and rope_type == "yarn" and hf_key == "factor" and present:
                    continue  # null: transformers takes the ratio of the context lengths (below)
                if value is None:
                    raise cfg.refuse(where, f"{hf_key}: required by rope_type {rope_type!r}")
                scaling[ours] = value
            if rope_type == "yarn" and "factor" not in scaling:
                scaling["factor"] = cfg.take("context_length", int) / scaling["original_context_length"]
            out["scaling"] = scaling
        if params:
            raise cfg.refuse(where, f"{', '.join(sorted(params))}: not used by rope_type {rope_type!r}; "
                             "archspec does not map it")
        return out

    def to_hf(self, m, out, hf, path):
        if self.scaling is not None and hf.facts.get("default_rope_only"):
            raise HFUnsupported(f"{'.'.join((*path, 'scaling'))}: {self.scaling.kind} cannot be expressed as "
                                f"{hf.model_type} (its rotary embedding has no such scaling)")
        if self.partial != 1.0 and not hf.facts.get("partial_rotary"):
            raise HFUnsupported(f"{'.'.join((*path, 'partial'))}: {self.partial} cannot be expressed as "
                                f"{hf.model_type} (its rotary embedding rotates every dimension)")
        if isinstance(hf.facts.get("rope_interleaved"), str):  # a config key says which (DeepSeek-V3's rope_interleave)
            put_fact(out, hf, "rope_interleaved", self.layout == "interleaved", (*path, "layout"))
        elif (self.layout == "interleaved") != bool(hf.facts.get("rope_interleaved")):
            has = "interleaved" if hf.facts.get("rope_interleaved") else "half"
            raise HFUnsupported(f"{'.'.join((*path, 'layout'))}: {self.layout} cannot be expressed as "
                                f"{hf.model_type} (its rotary pairs are always {has})")
        params: dict[str, Any] = {"rope_type": self.scaling.kind if self.scaling else "default",
                                  "rope_theta": self.theta}
        if self.scaling is not None:
            for hf_key, ours in _HF_FIELDS[self.scaling.kind].items():
                value = getattr(self.scaling, ours)
                if value is not None:
                    params[hf_key] = value
        if hf.facts.get("partial_rotary"):  # always written: GLM assumes 0.5 without it
            params["partial_rotary_factor"] = self.partial
            out["partial_rotary_factor"] = self.partial  # and where older versions read it
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


def _odd_rotated_dims(draw, data, spec):
    """A rotary fraction that rotates an odd number of a head's dimensions (int(0.375 · 8) = 3): blamed on partial."""
    if type(spec.model.attention).rotary_field != "head_dim":  # the width is another field there (mla's rope part)
        return None
    att = data["model"].setdefault("attention", {})
    att["positional"] = {"kind": "rope", "partial": 0.375}
    att["head_dim"] = 8
    if att.get("n_heads", spec.model.attention.n_heads) * 8 > 8 * spec.model.d_model:
        return None
    return ("model", "attention", "positional", "partial")
