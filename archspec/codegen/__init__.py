"""Spec → standalone PyTorch module source (Jinja2), and the one way to import and instantiate it.

Logic lives here and in the units, layout in templates: each kind (archspec.kinds) renders its own template with
its own context of *literals* (numbers through lit_int/lit_float, known words, strings only as escaped Python
literals) into a `Part` (module code plus the lines it adds at its family's hook points), and
`templates/model.py.j2` assembles the parts into one file. Nothing here knows a kind by name.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import linecache
import math
import os
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import jinja2

from archspec.accounting import account
from archspec.codegen.formatter import format_source
from archspec.errors import UserError
from archspec.kinds import Const, family, lit_float, lit_int
from archspec.kinds.attention import past_context_refusal
from archspec.spec import Spec, model_json, model_hash
from archspec.spec.layers import unit_json

TEMPLATES = Path(__file__).parent / "templates"
DEFAULT_OUT = Path("generated")


def _load_template(name: str):
    """`unit:<path>` names a unit's own template file (beside its class); anything else is in templates/."""
    if name.startswith("unit:"):
        path = Path(name[len("unit:"):])
    else:
        path = TEMPLATES / name
    try:
        source = path.read_text(encoding="utf-8")
    except OSError:
        return None
    return source, str(path), lambda: True


_ENV = jinja2.Environment(
    loader=jinja2.FunctionLoader(_load_template),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,  # Python source, not HTML: every value is made a safe literal before it reaches a template
)


def _str_chunks(s: str, width: int = 100) -> list[str]:
    """A long string as repr'd chunks for implicit concatenation inside parentheses (each chunk is a literal)."""
    return [repr(s[i : i + width]) for i in range(0, len(s), width)] or ["''"]


def _comment_safe(s: str) -> str:
    """Text for a `#` comment or docstring: printable ASCII only, so no newline or quote can end it."""
    return "".join(c if c.isascii() and c.isprintable() and c not in "\"\\" else "?" for c in s)


@dataclass(frozen=True)
class Part:
    """A unit rendered: its module code (`body`) and the lines it adds at its family's hook points."""

    body: str
    hooks: dict[str, str]

    def __getattr__(self, name: str) -> str:
        try:
            return self.hooks[name]
        except KeyError:
            raise AttributeError(name) from None


def _render_unit(template_name: str, hook_names: tuple[str, ...], context: dict[str, Any]) -> Part:
    module = _ENV.get_template(template_name).make_module(context)
    hooks = {}
    for hook in hook_names:
        macro = getattr(module, hook, None)
        hooks[hook] = str(macro()).strip("\n") if macro is not None else ""
    return Part(body=str(module), hooks=hooks)


def _unit_part(unit: Any, m: Any, extra: dict[str, Any] | None = None) -> Part:
    fam = family(type(unit).family)
    if fam.members.get(unit.kind) is not type(unit):
        raise ValueError(f"codegen: {fam.name} kind {unit.kind!r} is not registered")  # a bug, not user input
    context = {"unit": unit, **(extra or {}), **unit.template_context(m)}
    return _render_unit(f"unit:{type(unit).template_path()}", fam.hooks, context)


# ── several configurations of one family (per-layer variation) ──────────────────────────────────────────────────
# Units' templates are written for one configuration (`class FeedForward`, `FFN_HIDDEN`). When layers differ:
# - configurations whose code is the same and differ only in constants share one class, which takes those constants
#   as constructor arguments (`FeedForward(ffn_hidden=FFN_HIDDEN_LAYERS_1_3)`);
# - configurations with other code get a class each, named by kind (`WindowAttention`, `MoEFeedForward`);
# - a constant whose value differs between layers keeps its plain name for the value most layers use, and is named by
#   its layers for the others (`FFN_HIDDEN_LAYERS_1_3 = 480`); a function or constant of module level that two
#   configurations define alike is renamed the same way. No template needs to know.


def _layer_suffix(layers: list[int]) -> str:
    """A name's tail that says which layers use it: LAYER_0, LAYERS_1_3, LAYERS_1_TO_7, LAYERS_1_3_5_ETC."""
    if len(layers) == 1:
        return f"LAYER_{layers[0]}"
    if len(layers) > 2 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"LAYERS_{layers[0]}_TO_{layers[-1]}"
    if len(layers) > 4:
        return "LAYERS_" + "_".join(map(str, layers[:3])) + "_ETC"
    return "LAYERS_" + "_".join(map(str, layers))


def _top_level_names(body: str) -> list[str]:
    names = []
    for node in ast.parse(body).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def _objects(body: str) -> list[tuple[str, str]]:
    """Module-level objects built by a call (`SLIDING_WINDOW = SparsePattern(...)`): (name, the called name)."""
    out = []
    for node in ast.parse(body).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
            out += [(t.id, node.value.func.id) for t in node.targets if isinstance(t, ast.Name)]
    return out


def _rename(text: str, mapping: dict[str, str]) -> str:
    if not mapping:
        return text
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(mapping, key=len, reverse=True))) + r")\b")
    return pattern.sub(lambda mt: mapping[mt.group(1)], text)


@dataclass
class Config:
    """One configuration of a family as the file builds it: the code its class lives in (shared by configurations
    that differ only in constants), the constants it uses, its class, and the constructor arguments that make it
    this configuration (keyword → constant name)."""

    part: Part
    constants: list[Const]
    cls: str
    args: dict[str, str]
    arg_types: dict[str, str] = field(default_factory=dict)  # argument → its annotation

    def call(self, *leading: str, values: dict[str, str] | None = None) -> str:
        """`Cls(leading..., arg=value, ...)`: the constants it was configured with, or the `values` given."""
        given = self.args if values is None else values
        return f"{self.cls}({', '.join([*leading, *(f'{k}={v}' for k, v in given.items())])})"


def _class_span(body: str, cls: str) -> tuple[int, int]:
    """Where `class cls` starts and ends in `body` (character offsets)."""
    tree = ast.parse(body)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    offsets = [0, *itertools.accumulate(len(line) + 1 for line in body.split("\n"))]  # where each line starts
    return offsets[node.lineno - 1], offsets[node.end_lineno]


def _with_arguments(body: str, cls: str, params: dict[str, tuple[str, str]]) -> str | None:
    """`class cls` taking `params` (constant name → (argument, type)) as constructor arguments in place of the
    module constants; None when a constant is also used outside the class (module code cannot read `self`)."""
    start, end = _class_span(body, cls)
    inside, outside = body[start:end], body[:start] + body[end:]
    if any(re.search(rf"\b{name}\b", outside) for name in params):
        return None
    inside = _rename(inside, {name: f"self.{arg}" for name, (arg, _) in params.items()})
    signature = ", ".join(f"{arg}: {kind}" for arg, kind in params.values())
    inside, n = re.subn(r"def __init__\(self((?:, [^)]*)?)\) -> None:", lambda mt: f"def __init__(self{mt.group(1)}, "
                        f"{signature}) -> None:", inside, count=1)
    stores = "".join(f"\n        self.{arg} = {arg}" for arg, _ in params.values())
    inside, m = re.subn(r"(\n        super\(\).__init__\(\))", lambda mt: mt.group(1) + stores, inside, count=1)
    if not (n and m):
        return None
    return body[:start] + inside + body[end:]


def _configs(units: list[Any], labels: list[str], render_one, constants_of, base_cls: str,
             layers: list[list[int]], refs: list[dict[str, tuple[str, str]]] | None = None,
             main: int | None = None) -> list[Config]:
    """Render each configuration (`labels[i]`: its kind's class-name prefix; `layers[i]`: the layers it serves) and lay
    out the classes as described above. `refs[i]`: module-level objects the code names by a generic name, with the
    name and type they have for configuration i (an attention's sparsity pattern): like constants, an object that
    differs between configurations of one class becomes a constructor argument."""
    if not units:  # no layer uses this family (a model without attention has no sparsity pattern)
        return []
    parts = [render_one(u) for u in units]
    consts = [constants_of(u) for u in units]
    if len(units) == 1:
        mapping = {name: actual for name, (actual, _) in (refs or [{}])[0].items() if name != actual}
        part = Part(_rename(parts[0].body, mapping), {h: _rename(v, mapping) for h, v in parts[0].hooks.items()})
        return [Config(part, consts[0], base_cls, {})]
    if main is None:  # the configuration most layers use keeps the plain names
        main = max(range(len(units)), key=lambda i: (len(layers[i]), -i))
    refs = refs or [{} for _ in units]
    ref_types = {name: kind for r in refs for name, (_, kind) in r.items()}

    # Constants: one name per distinct value; the plain name for the main configuration's value (or the commonest).
    values: dict[str, dict[int, Const]] = {}
    for i, cs in enumerate(consts):
        for c in cs:
            values.setdefault(c.name, {})[i] = c
    named: dict[tuple[str, int], str] = {}  # (constant, unit) → the name it has in the file
    for name, by_unit in values.items():
        by_value: dict[str, list[int]] = {}
        for i, c in by_unit.items():
            by_value.setdefault(c.value, []).append(i)
        plain = by_unit[main].value if main in by_unit else max(by_value, key=lambda v: sum(len(layers[i]) for i in by_value[v]))
        for value, us in by_value.items():
            tail = "" if value == plain else "_" + _layer_suffix(sorted(j for i in us for j in layers[i]))
            for i in us:
                named[(name, i)] = name + tail
    for i, r in enumerate(refs):
        named.update({(name, i): actual for name, (actual, _) in r.items()})
    names_of = [[c.name for c in consts[i]] + list(refs[i]) for i in range(len(units))]

    # Configurations with the same code (constants by their plain names) share a class.
    code = [p.body + "\0" + json.dumps(p.hooks, sort_keys=True) for p in parts]
    groups: list[list[int]] = []
    for i in range(len(units)):
        same = next((g for g in groups if code[g[0]] == code[i]), None)
        (same.append(i) if same is not None else groups.append([i]))
    if not base_cls:  # module-level code only (a sparsity pattern): nothing can take arguments
        groups = [[i] for i in range(len(units))]
    for g in list(groups):  # a shared constant that module-level code also reads cannot become an argument
        varying = {n for i in g for n in names_of[i] if len({named[(n, j)] for j in g}) > 1}
        if len(g) > 1 and varying and _with_arguments(parts[g[0]].body, base_cls, {n: (n.lower(), "int") for n in varying}) is None:
            groups[groups.index(g)] = [g[0]]
            groups += [[i] for i in g[1:]]
    groups.sort(key=lambda g: g[0])

    prefixes = [labels[g[0]] for g in groups]
    names = [base_cls if len(groups) == 1 else prefix + base_cls for prefix in prefixes]
    plain = list(names)
    for k, name in enumerate(plain):  # two groups of one kind (other code): numbered, in order of first use
        if plain.count(name) > 1:
            names[k] = name + str(plain[: k + 1].count(name))

    defined = [set(_top_level_names(parts[g[0]].body)) - {base_cls} for g in groups]
    out: list[Config | None] = [None] * len(units)
    for k, g in enumerate(groups):
        first = g[0]
        varying = sorted({n for i in g for n in names_of[i] if len({named[(n, j)] for j in g}) > 1})
        value_of = {c.name: c.value for c in consts[first]}
        params = {n: (n.lower(), ref_types[n] if n in ref_types else _py_type(value_of[n])) for n in varying}
        body = parts[first].body
        if params:
            body = _with_arguments(body, base_cls, params)
        # Module-level names another group also defines: named by this group's layers (the main group keeps its own).
        clashes = {n for n in defined[k] if any(n in d for j, d in enumerate(defined) if j != k)}
        mapping = {} if main in g else {n: n + ("_" + _layer_suffix(sorted(x for i in g for x in layers[i]))).lower()
                                         if not n.isupper() else n + "_" + _layer_suffix(sorted(x for i in g for x in layers[i]))
                                         for n in clashes}
        if base_cls:
            mapping[base_cls] = names[k]
        mapping.update({n: named[(n, first)] for n in names_of[first] if n not in params})
        hooks = {h: _rename(v, mapping) for h, v in parts[first].hooks.items()}
        shared = Part(_rename(body, mapping), hooks)
        for i in g:
            args = {params[n][0]: named[(n, i)] for n in varying}
            out[i] = Config(shared, [Const(named[(c.name, i)], c.value, _rename(c.why, {c.name: named[(c.name, i)]}))
                                     for c in consts[i]], names[k], args,
                            {arg: kind for arg, kind in params.values()})
    return out  # type: ignore[return-value]


def _py_type(literal: str) -> str:
    """The annotation of a constant's literal (lit_int, lit_float, lit_bool wrote it)."""
    if literal in ("True", "False"):
        return "bool"
    return "float" if any(ch in literal for ch in ".e") else "int"  # repr of a float always has one


def _classes(configs: list[Config]) -> list[Config]:
    """One configuration per class the file defines (configurations that share a class share its code)."""
    return list({id(c.part): c for c in configs}.values())


def _merge_constants(configs: list[Config]) -> list[Const]:
    """Every configuration's constants once, a per-layer value (`FFN_HIDDEN_LAYERS_1_3`) right after the plain one."""
    seen: dict[str, Const] = {}
    for cfg in configs:
        for c in cfg.constants:
            seen.setdefault(c.name, c)
    plain = [c for c in seen.values() if not re.search(r"_LAYERS?_\d", c.name)]
    variants = [c for c in seen.values() if c not in plain]
    out = []
    for c in plain:
        out += [c, *(v for v in variants if re.sub(r"_LAYERS?_\d.*$", "", v.name) == c.name)]
    return out + [v for v in variants if v not in out]


def _distinct(units: list[Any]) -> list[Any]:
    """One of each configuration, in order of first use (equal by canonical JSON)."""
    out: dict[str, Any] = {}
    for u in units:
        out.setdefault(unit_json(u), u)
    return list(out.values())


def _context(spec: Spec, source: str) -> dict[str, Any]:
    m, a = spec.model, spec.model.attention
    acc = account(spec)
    groups = m.block_groups()  # [(BlockSpec, layers)] in order of first use

    positional = _unit_part(a.positional, m)
    norms = _distinct([m.norm] + [b.norm for b, _ in groups])  # the model-wide norm is also the final norm
    ffns = _distinct([b.ffn for b, _ in groups if type(b.ffn).sublayer])  # a block may have no channel mixer
    # Each layer's token mixer: its attention, or another mixer kind (archspec.kinds.base.MixerKind).
    attending = [(b, ls) for b, ls in groups if b.token_mixer is b.attention]
    attentions = _distinct([b.attention for b, _ in attending])
    sparsities = _distinct([att.sparsity for att in attentions])
    others = _distinct([b.token_mixer for b, _ in groups if b.token_mixer is not b.attention])

    def layers_of(units: list[Any], component, among: list | None = None) -> list[list[int]]:
        return [sorted(i for b, ls in (groups if among is None else among)
                       if unit_json(component(b)) == unit_json(u) for i in ls) for u in units]

    def prefixes(units: list[Any]) -> list[str]:
        return [type(u).class_prefix() for u in units]

    norm_layers = layers_of(norms, lambda b: b.norm)
    # The model-wide norm (also the final norm) keeps the plain names; a layer group's norm is named by its layers.
    norm_cfgs = _configs(norms, prefixes(norms), lambda u: _unit_part(u, m), lambda u: u.constants(m), "Norm",
                         norm_layers, main=0)
    ffn_cfgs = _configs(ffns, prefixes(ffns), lambda u: _unit_part(u, m), lambda u: u.constants(m), "FeedForward",
                        layers_of(ffns, lambda b: b.ffn))
    sparsity_layers = layers_of(sparsities, lambda b: b.attention.sparsity, attending)
    sparsity_cfgs = _configs(sparsities, prefixes(sparsities), lambda u: _unit_part(u, m, dict(gqa=False)),
                             lambda u: u.constants(m), "", sparsity_layers)

    def own_positions(att: Any) -> bool:
        return unit_json(att.positional) == unit_json(a.positional)

    def render_attention(att: Any) -> Part:
        ctx = att.template_context(m)
        # The attend hook depends on the attention's layout (GQA), so the pattern is rendered for it; under its own
        # names (SLIDING_WINDOW): the pattern object a configuration uses is one of its refs.
        sparsity = _unit_part(att.sparsity, m, ctx)
        if "scale=ATTN_SCALE" in ctx.get("scores", "") and "ATTN_SCALE" not in sparsity.attend + sparsity.decode:
            raise UserError(f"the {att.sparsity.kind} pattern's attention call takes no scale (its template does not "
                            "pass `scores`): it cannot score by ATTN_SCALE, which model.attention.scale and "
                            "model.parametrization: mup need")
        pattern = next((name for name, called in _objects(sparsity.body) if called == "SparsePattern"), "")
        # A layer with positions off (a layer group's positional) takes the model's block arguments (the shared
        # tables), and applies its own kind's hooks inside attention (none: nothing).
        layer_positional = positional if own_positions(att) else Part(positional.body, {
            **_unit_part(att.positional, m).hooks, **{h: positional.hooks[h] for h in ("block_params", "block_args")}})
        body = _render_unit(f"unit:{type(att).template_path()}", (), {"unit": att, **ctx, "positional": layer_positional,
                                                                     "sparsity": sparsity, "pattern": pattern,
                                                                     "cache_class": att.cache_class}).body
        return Part(body, {})

    def pattern_refs(att: Any) -> dict[str, tuple[str, str]]:
        """The module-level objects of the attention's pattern (its SparsePattern), as the file names them."""
        own = _objects(_unit_part(att.sparsity, m, dict(gqa=False)).body)
        in_file = _objects(sparsity_cfgs[sparsities.index(att.sparsity)].part.body)
        return {name: (actual, kind) for (name, kind), (actual, _) in zip(own, in_file)}

    labels = [("" if own_positions(att) else type(att.positional).class_prefix()) + att.class_label()
              for att in attentions]
    attention_cfgs = _configs(attentions, labels, render_attention,
                              lambda att: att.constants(m), "Attention", layers_of(attentions, lambda b: b.attention,
                                                                                   attending),
                              [pattern_refs(att) for att in attentions]) if attentions else []
    # Other mixers: one family of classes per kind (`ShortConv`), configurations of a kind as the other families'.
    other_cfgs: dict[type, list[Config]] = {}
    for cls in dict.fromkeys(type(u) for u in others):
        units = [u for u in others if type(u) is cls]
        other_cfgs[cls] = _configs(units, [u.class_label() for u in units], lambda u: _unit_part(u, m),
                                   lambda u: u.constants(m), cls.base_class,
                                   layers_of(units, lambda b: b.token_mixer,
                                             [(b, ls) for b, ls in groups if b.token_mixer is not b.attention]))

    def mixer_cfg(b: Any) -> Config:
        if b.token_mixer is b.attention:
            return attention_cfgs[attentions.index(b.attention)]
        units = [u for u in others if type(u) is type(b.token_mixer)]
        return other_cfgs[type(b.token_mixer)][units.index(b.token_mixer)]

    consts = [
        Const("VOCAB_SIZE", lit_int(m.vocab_size)),
        Const("CONTEXT_LENGTH", lit_int(m.context_length), "longest sequence; sizes position tables"),
        Const("D_MODEL", lit_int(m.d_model), "width of the residual stream"),
        Const("N_LAYERS", lit_int(m.n_layers)),
        *_merge_constants(attention_cfgs),
        *(c for cfgs in other_cfgs.values() for c in _merge_constants(cfgs)),
        *_merge_constants(norm_cfgs),
        *a.positional.constants(m),
        *_merge_constants(sparsity_cfgs),
        *_merge_constants(ffn_cfgs),
        *([Const("EMBEDDING_SCALE", lit_float(math.sqrt(m.d_model)), "sqrt(D_MODEL): token embeddings are scaled by "
                 "it (model.embedding_scale)")] if m.embedding_scale == "sqrt_d_model" else []),
        *([Const("LOGIT_SOFTCAP", lit_float(m.logit_softcap), "logits = cap · tanh(logits / cap), within (-cap, cap) "
                 "(Gemma 2)")] if m.logit_softcap is not None else []),
        Const("DROPOUT", lit_float(m.dropout), "on embeddings, attention weights and residual branches" if attentions
              else "on embeddings and residual branches"),
        Const("INIT_STD", "0.02", "GPT-2 initialisation"),
        *_parametrization_constants(m),
        *_mtp_constants(m),
        *(m.media.constants(m) if m.media is not None else []),  # media input (model.media): cross-attention
    ]

    blocks, layer_calls = _blocks(groups, [(norm_cfgs[norms.index(b.norm)], mixer_cfg(b),
                                            ffn_cfgs[ffns.index(b.ffn)] if type(b.ffn).sublayer else _NO_FFN)
                                           for b, _ in groups], m.n_layers, positional.hooks["block_args"])
    model_methods = list(dict.fromkeys(c.part.hooks.get("model_methods", "") for c in ffn_cfgs if
                                       c.part.hooks.get("model_methods")))
    if len(model_methods) > 1:
        raise ValueError("codegen: FFN configurations add different Model methods; a kind's model_methods must not "
                         "depend on its configuration")
    if m.mtp is not None and model_methods and re.search(r"\bdef auxiliary_losses\(", model_methods[0]):
        # The Model's auxiliary_losses gathers MTP's losses and the FFN kind's (renamed ffn_losses)
        model_methods[0] = _rename(model_methods[0], {"auxiliary_losses": "ffn_losses"})

    tied = "tied" if m.tie_embeddings else "untied"
    if m.embedding_scale == "sqrt_d_model":
        tied += " sqrt(d_model)-scaled"
    if m.embedding_norm:
        tied += " normalised"
    if len(groups) == 1 and not attending:
        b = groups[0][0]
        layer_desc = f"{b.token_mixer.describe(m)}, {b.norm.describe(m)}, {b.ffn.describe(m)}, no positions"
        if b.block != type(b.block)():
            layer_desc += f", {b.block.describe()}"
    elif len(groups) == 1:
        b = groups[0][0]  # every layer's components (a group may override the model-wide ones for all layers)
        ba = b.attention
        layer_desc = (f"{ba.doc_summary()}, {b.norm.describe(m)}, "
                      f"{b.ffn.describe(m)}, {a.positional.describe(m)}, {ba.sparsity.describe(m)}")
        if b.block != type(b.block)():  # the pre-norm sequential block is what every file said before
            layer_desc += f", {b.block.describe()}"
    else:
        layer_desc = f"{a.positional.describe(m)}, {len(groups)} block configurations (see the Block classes)"
    summary = (
        f"{spec.name}: decoder-only transformer, {m.n_layers} layers, d_model {m.d_model}, {layer_desc}, "
        f"{tied} embeddings. {acc.total:,} parameters ({acc.total - acc.embedding:,} non-embedding)."
    )
    if m.media is not None:  # media input (model.media): what reads it
        summary += (f" Media input: {m.media.cross_attention.describe(m)}"
                    + (", a Perceiver resampler" if m.media.resampler else "") + ".")
    cjson = model_json(spec)  # the model alone: a name or recipe change regenerates nothing but the banner
    return {
        "name": _comment_safe(spec.name),
        "source": _comment_safe(source),
        "summary": "\n".join(textwrap.wrap(_comment_safe(summary), 110, break_on_hyphens=False)),
        "spec_hash": _comment_safe(model_hash(spec)),
        "spec_hash_literal": repr(model_hash(spec)),
        "spec_json_chunks": _str_chunks(cjson),
        "constants": consts,
        "positional": positional,
        "norms": _classes(norm_cfgs),
        "sparsities": _classes(sparsity_cfgs),
        "attentions": _classes(attention_cfgs),
        # the other mixers' sections: (title, classes), one per kind
        "mixer_sections": [(_section(cls.section), _classes(cfgs)) for cls, cfgs in other_cfgs.items()],
        "attention_section": _section("attention"),
        # Model.new_cache reads each block's mixer by the one attribute its blocks share, or by their `mixer` property
        "mixer_attr": family("attention").base.attribute if not others else "mixer",
        "ffns": _classes(ffn_cfgs),
        "model_methods": model_methods[0] if model_methods else "",
        "blocks": blocks,
        "layer_calls": layer_calls,
        "final_norm": norm_cfgs[0].call("D_MODEL") if m.final_norm else "",
        "model_norm": norm_cfgs[0].call("D_MODEL"),  # the model-wide norm, e.g. on the embeddings
        "lm_head_bias": bool(m.lm_head_bias),
        "logit_softcap": m.logit_softcap is not None,
        "tie_embeddings": bool(m.tie_embeddings),
        "past_context": past_context_refusal(m) is None,
        "embedding_scale": m.embedding_scale == "sqrt_d_model",
        "embedding_norm": m.embedding_norm,
        "mup": m.parametrization == "mup",
        # multi-token prediction: each depth's block is built as the last layer's (its configuration, its arguments)
        "mtp": {"block": layer_calls[-1][0], "cache_class": m.blocks()[-1].token_mixer.cache_class,
                "ffn_losses": "def ffn_losses(" in (model_methods or [""])[0]}
        if m.mtp is not None else None,
        # media input (model.media): the gated cross-attention layers and the resampler, one section of their own
        "media": _render_unit(f"unit:{type(m.media.cross_attention).template_path()}", (),
                              {"unit": m.media, "norm": norm_cfgs[0].call("D_MODEL")}).body if m.media else "",
        "media_section": _section("media"),
        "media_resampler": bool(m.media and m.media.resampler),
    }


def _mtp_constants(m: Any) -> list[Const]:
    """Multi-token prediction's numbers (DeepSeek-V3 §2.2); none without it."""
    if m.mtp is None:
        return []
    return [
        Const("MTP_DEPTH", lit_int(m.mtp.depth), "multi-token prediction modules: depth k predicts the token k + 1 "
              "ahead"),
        Const("MTP_WEIGHT", lit_float(m.mtp.weight), "λ: loss = main + λ / MTP_DEPTH · Σ_k (depth k's loss)"),
    ]


def _parametrization_constants(m: Any) -> list[Const]:
    """µP's numbers (Yang et al. 2022, Table 3 for Adam, as the `mup` package applies it), relative to the base width;
    the standard parametrization has none. ATTN_SCALE is the attention kinds' (ScoreOptions.effective_scale)."""
    if m.parametrization != "mup":
        return []
    mult = m.d_model / m.mup_base_width
    return [
        Const("MUP_BASE_WIDTH", lit_int(m.mup_base_width), "µP's base width: at it, µP is the standard init and rates"),
        Const("WIDTH_MULT", lit_float(mult), "D_MODEL / MUP_BASE_WIDTH: every inner width is taken to grow with it"),
        Const("HIDDEN_INIT_SCALE", lit_float(1.0 / math.sqrt(mult)), "1/sqrt(WIDTH_MULT): hidden matrices start at "
              "their standard std times it, ∝ 1/sqrt(fan_in)"),
        Const("HIDDEN_LR_MULT", lit_float(1.0 / mult), "1/WIDTH_MULT: hidden matrices' Adam learning rate times it "
              "(Model.lr_multipliers)"),
        Const("OUTPUT_MULT", lit_float(1.0 / mult), "1/WIDTH_MULT: the logits times it; the head keeps its init and "
              "rate"),
    ]


def _section(title: str) -> str:
    """A section rule of the generated file: `# ── title ───…`, 110 characters wide."""
    head = f"# ── {title} "
    return head + "─" * (110 - len(head))


# A block without a channel mixer (FFNKind.sublayer false: Mamba-2's block is norm → mixer → residual): no class.
_NO_FFN = Config(Part("", {}), [], "", {})


def _blocks(groups: list, parts: list[tuple[Config, Config, Config]], n_layers: int,
            position_args: str) -> tuple[list[dict], list]:
    """The Block classes, one per block shape (its norm placement and residual layout, its norm class, and the
    attribute its token mixer is kept under: `attn`, `conv`), each taking its token mixer and its FFN as constructor
    arguments, so that layers of one shape with other parts share the class (`Block(WindowAttention(), FeedForward())`
    beside `Block(Attention(), MoEFeedForward())`); and how each layer is built: [(constructor call, first layer, last
    layer)] in runs. Named by what tells the classes apart: the shape (`PostNormBlock`, `ParallelBlock`; the pre-norm
    sequential block is plain `Block`, or `PreNormBlock` beside blocks of other shapes), the mixer kind
    (`ShortConvBlock` beside `AttentionBlock`), the norm."""
    shapes = [b.block for b, _ in groups]
    mixers = [b.token_mixer for b, _ in groups]
    keys = [(triple[0].cls, type(mx).attribute, bool(type(mx).takes_positions), unit_json(shape), bool(triple[2].cls))
            for triple, shape, mx in zip(parts, shapes, mixers)]  # the last: whether the block has an FFN
    distinct = list(dict.fromkeys(keys))
    shape_of = dict(zip(keys, shapes))
    mixer_of = dict(zip(keys, mixers))
    mixed = len({k[3] for k in distinct}) > 1
    mixer_kinds = len({k[1:3] for k in distinct}) > 1  # attention beside a conv: each named
    norm_kinds = len({k[0] for k in distinct}) > 1

    def label(k: tuple) -> str:
        norm = k[0].removesuffix("Norm") if norm_kinds else ""
        mixer = type(mixer_of[k]).base_class if mixer_kinds else ""
        return norm + mixer + (shape_of[k].label() or ("PreNorm" if mixed else "")) + "Block"

    plain = [label(k) for k in distinct]
    names = {k: name + (str(plain[: i + 1].count(name)) if plain.count(name) > 1 else "")
             for i, (k, name) in enumerate(zip(distinct, plain))}
    blocks, calls = {}, {}
    for (b, layers), (norm, mixer, ffn), key in zip(groups, parts, keys):
        attr = type(b.token_mixer).attribute  # the block's attribute holding its mixer (`attn`, `conv`)
        block = blocks.setdefault(key, {
            "name": names[key],
            # the parts come built; a norm's own constructor arguments (a per-layer constant) are the block's
            "signature": f", {attr}: nn.Module" + (", ffn: nn.Module" if ffn.cls else "")
                         + "".join(f", {arg}: {norm.arg_types[arg]}" for arg in norm.args),
            "norm": norm.call("D_MODEL", values={arg: arg for arg in norm.args}),
            "mixer": attr,
            "ffn": "ffn" if ffn.cls else "",  # "": a block without a channel mixer (ffn: {kind: none})
            "attr": attr,
            "mixer_args": position_args if type(b.token_mixer).takes_positions else "",
            "cache_classes": [],
            "placement": b.block.norm_placement, "parallel": b.block.parallel, "shared_norm": b.block.shared_norm,
            "norm_modules": ", ".join(f"self.{n}" for n in b.norms()),
            "layers": [],
        })
        block["layers"] += layers
        if b.token_mixer.cache_class not in block["cache_classes"]:
            block["cache_classes"].append(b.token_mixer.cache_class)
        norm_args = "".join(f", {arg}={const}" for arg, const in norm.args.items())
        call = f"{names[key]}({mixer.call()}{', ' + ffn.call() if ffn.cls else ''}{norm_args})"
        calls.update({i: call for i in layers})
    runs: list[list] = []
    for i in range(n_layers):
        if runs and runs[-1][0] == calls[i]:
            runs[-1][2] = i
        else:
            runs.append([calls[i], i, i])
    for block in blocks.values():
        block["layers"] = _comment_safe(_layer_list(sorted(block["layers"])))
        block["cache_class"] = " | ".join(block.pop("cache_classes"))
    return list(blocks.values()), [tuple(r) for r in runs]


def _layer_list(layers: list[int]) -> str:
    if len(layers) > 2 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"layers {layers[0]}-{layers[-1]}"
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(map(str, layers))


_IMPORT_MARK = "# <archspec.runtime imports>"
_KERNELS = {"sparse_attention": "sparse attention", "score_mod_attention": "attention with modified scores",
            "grouped_mm": "the MoE grouped GEMM", "ssd": "the Mamba-2 scan"}


def _runtime_import(text: str) -> tuple[str, str]:
    """The import line of the archspec.runtime names the rendered file uses, and the kernels it names among them:
    a file imports (and so reads as using) only what it calls."""
    from archspec import runtime as _runtime  # torch: only when a model is rendered, not when archspec.codegen loads
    names = {node.id for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Name)}  # code, not comments
    used = [name for name in _runtime.__all__ if name in names]
    if not used:
        return "", ""
    used.sort(key=lambda n: (not n.isupper(), not n[:1].isupper(), n.lower()))  # constants, classes, functions
    line = "from archspec.runtime import " + ", ".join(used)  # the formatter wraps a long one
    kernels = "".join(f", {_KERNELS[n]}" for n in used if n in _KERNELS)
    return line, kernels


def render(spec: Spec, source: str | None = None) -> str:
    """The generated module's source. Deterministic: the same spec and source label give the same bytes."""
    context = _context(spec, source or f"the spec {spec.name!r}")
    text = _ENV.get_template("model.py.j2").render(**context, from_file=source is not None,
                                                   runtime_import=_IMPORT_MARK, runtime_kernels="# <kernels>")
    line, kernels = _runtime_import(text)
    about = textwrap.fill(f"The architecture, top to bottom; its kernels (caches, decode loop{kernels}) are "
                          "archspec.runtime's.", width=118, initial_indent="# ", subsequent_indent="# ")
    text = text.replace(_IMPORT_MARK, line).replace("# <kernels>", about)
    return format_source(text)  # one layout for every file: blank lines the includes leave, widths, quotes


def source_label(path: str | Path | None) -> str | None:
    """How the banner names the spec file: relative to the working directory when inside it, POSIX separators."""
    if path is None:
        return None
    p = Path(path)
    try:
        p = p.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    return p.as_posix()


@dataclass
class Generated:
    spec: Spec
    source: str
    path: Path
    source_hash: str
    module: ModuleType

    @property
    def Model(self):  # noqa: N802 (the class the file defines)
        return self.module.Model


def import_source(path: Path, text: str | None = None) -> ModuleType:
    """Import a generated file under a unique module name (one per content hash), without touching sys.path.

    `text`: the source archspec rendered for `path`; it is what runs, so a file swapped on disk between the write
    and the import (a shared run directory) is never executed."""
    source = path.read_text(encoding="utf-8") if text is None else text
    digest = hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]
    mod_name = f"archspec_generated_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    module = ModuleType(mod_name)
    module.__file__ = str(path)
    linecache.cache[str(path)] = (len(source), None, source.splitlines(True), str(path))  # tracebacks, inspect
    sys.modules[mod_name] = module  # dataclasses/pickling/torch.compile look modules up by name
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 (archspec's own rendered source)
    except BaseException:
        del sys.modules[mod_name]
        raise
    return module


def generate(spec: Spec, out_dir: str | Path = DEFAULT_OUT, write: bool = True,
             source: str | Path | None = None) -> Generated:
    """Render `spec` to `<out_dir>/<name>.py` (atomically, only if changed) and import it."""
    text = render(spec, source_label(source))
    path = Path(out_dir) / f"{spec.name}.py"
    if write:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                tmp = path.with_suffix(f".py.tmp{os.getpid()}")
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, path)
        except OSError as e:
            raise UserError(f"{path}: cannot write generated module: {e}") from None
    else:  # nothing on disk: the module runs from the text, and tracebacks and inspect read it from linecache
        path = Path(f"<archspec generated {spec.name}>")
    module = import_source(path, text)
    return Generated(spec=spec, source=text, path=path, source_hash=hashlib.sha256(text.encode()).hexdigest(),
                     module=module)
