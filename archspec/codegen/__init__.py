"""Spec → standalone PyTorch module source (Jinja2), and the one way to import and instantiate it.

Logic lives here and in the units, layout in templates: each kind (archspec.kinds) renders its own template with
its own context of *literals* (numbers through lit_int/lit_float, known words, strings only as escaped Python
literals) into a `Part` (module code plus the lines it adds at its family's hook points), and
`templates/model.py.j2` assembles the parts into one file. Nothing here knows a kind by name.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import re
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import jinja2

from archspec.accounting import account
from archspec.errors import UserError
from archspec.kinds import Const, family, lit_float, lit_int
from archspec.kinds import attention as _attention_unit
from archspec.memory import available_memory_bytes, check_memory, memory_estimate_bytes  # noqa: F401 (moved there)
from archspec.spec import Spec, model_json, spec_hash
from archspec.spec.layers import unit_json

ATTENTION_TEMPLATE = Path(_attention_unit.__file__).with_name("attention.py.j2")

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
# Units' templates are written for one configuration (`class FeedForward`, `FFN_HIDDEN`). When layers differ, each
# configuration is rendered on its own and its top-level names, and those of its constants whose values differ
# between configurations, get a suffix (FeedForwardMoe, FFN_HIDDEN_GLU2): no template needs to know.


def _camel(word: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in re.split(r"[^A-Za-z0-9]+", word) if p)


def _suffixes(words: list[str]) -> list[str]:
    """Class-name suffixes for configurations labelled `words` (their kinds): `Glu`, `Moe`; `Glu1`, `Glu2` for
    repeats. A single configuration gets none."""
    if len(words) == 1:
        return [""]
    counts = Counter(words)
    seen: Counter = Counter()
    out = []
    for w in words:
        seen[w] += 1
        out.append(_camel(w) + (str(seen[w]) if counts[w] > 1 else ""))
    return out


def _top_level_names(body: str) -> list[str]:
    names = []
    for node in ast.parse(body).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def _rename(text: str, mapping: dict[str, str]) -> str:
    if not mapping:
        return text
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(mapping, key=len, reverse=True))) + r")\b")
    return pattern.sub(lambda mt: mapping[mt.group(1)], text)


@dataclass
class Config:
    """One configuration of a family: its rendered part, constants, and the name of the class it defines."""

    part: Part
    constants: list[Const]
    cls: str


def _configs(units: list[Any], labels: list[str], render_one, constants_of, base_cls: str) -> list[Config]:
    """Render each configuration; rename per configuration when there are several."""
    parts = [render_one(u) for u in units]
    consts = [constants_of(u) for u in units]
    if len(units) == 1:
        return [Config(parts[0], consts[0], base_cls)]
    values: dict[str, set[str]] = {}
    for cs in consts:
        for c in cs:
            values.setdefault(c.name, set()).add(c.value)
    suffixes = _suffixes(labels)
    out = []
    for part, cs, sfx in zip(parts, consts, suffixes):
        upper = "_" + sfx.upper()
        mapping = {name: name + sfx for name in _top_level_names(part.body)}
        mapping.update({c.name: c.name + upper for c in cs if len(values[c.name]) > 1})
        renamed = Part(_rename(part.body, mapping), {k: _rename(v, mapping) for k, v in part.hooks.items()})
        out.append(Config(renamed, [Const(mapping.get(c.name, c.name), c.value, c.why) for c in cs], base_cls + sfx))
    return out


def _merge_constants(configs: list[Config]) -> list[Const]:
    seen: dict[str, Const] = {}
    for cfg in configs:
        for c in cfg.constants:
            seen.setdefault(c.name, c)
    return list(seen.values())


def _distinct(units: list[Any]) -> list[Any]:
    """One of each configuration, in order of first use (equal by canonical JSON)."""
    out: dict[str, Any] = {}
    for u in units:
        out.setdefault(unit_json(u), u)
    return list(out.values())


def _shared_code(units: list[Any], m: Any) -> dict[str, str]:
    """Helper code several units share (`shared_templates`), by family: each file rendered once, in first-use order,
    however many units (kinds, or per-layer configurations) name it."""
    out: dict[str, list[str]] = {name: [] for name in ("norm", "positional", "sparsity", "ffn")}
    seen: set = set()
    for unit in units:
        for path in unit.shared_template_paths(m):
            if path not in seen:
                seen.add(path)
                out.setdefault(type(unit).family, []).append(_ENV.get_template(f"unit:{path}").render().strip("\n"))
    return {name: "\n\n\n".join(code) for name, code in out.items()}


def _context(spec: Spec, source: str) -> dict[str, Any]:
    m, a = spec.model, spec.model.attention
    acc = account(spec)
    groups = m.block_groups()  # [(BlockSpec, layers)] in order of first use

    positional = _unit_part(a.positional, m)
    norms = _distinct([m.norm] + [b.norm for b, _ in groups])  # the model-wide norm is also the final norm
    ffns = _distinct([b.ffn for b, _ in groups])
    attentions = _distinct([b.attention for b, _ in groups])
    sparsities = _distinct([att.sparsity for att in attentions])

    norm_cfgs = _configs(norms, [u.kind for u in norms], lambda u: _unit_part(u, m),
                         lambda u: u.constants(m), "Norm")
    ffn_cfgs = _configs(ffns, [u.kind for u in ffns], lambda u: _unit_part(u, m), lambda u: u.constants(m),
                        "FeedForward")
    sparsity_cfgs = _configs(sparsities, [u.kind for u in sparsities],
                             lambda u: _unit_part(u, m, {"gqa": False}), lambda u: u.constants(m), "")

    def render_attention(att: Any) -> Part:
        ctx = att.template_context(m)
        # The attend hook depends on the attention's layout (GQA), so the pattern is rendered for it.
        sparsity = _configs(sparsities, [u.kind for u in sparsities], lambda u: _unit_part(u, m, ctx),
                            lambda u: u.constants(m), "")[sparsities.index(att.sparsity)].part
        body = _render_unit(f"unit:{ATTENTION_TEMPLATE}", (),
                            {"unit": att, **ctx, "positional": positional, "sparsity": sparsity}).body
        return Part(body, {})

    attention_cfgs = _configs(attentions, [att.sparsity.kind for att in attentions], render_attention,
                              lambda att: att.constants(m), "Attention")

    consts = [
        Const("VOCAB_SIZE", lit_int(m.vocab_size)),
        Const("CONTEXT_LENGTH", lit_int(m.context_length), "longest sequence; sizes position tables"),
        Const("D_MODEL", lit_int(m.d_model), "width of the residual stream"),
        Const("N_LAYERS", lit_int(m.n_layers)),
        *_merge_constants(attention_cfgs),
        *_merge_constants(norm_cfgs),
        *a.positional.constants(m),
        *_merge_constants(sparsity_cfgs),
        *_merge_constants(ffn_cfgs),
        *([Const("EMBEDDING_SCALE", lit_float(math.sqrt(m.d_model)), "sqrt(D_MODEL): token embeddings are scaled by "
                 "it (model.embedding_scale)")] if m.embedding_scale == "sqrt_d_model" else []),
        Const("DROPOUT", lit_float(m.dropout), "on embeddings, attention weights and residual branches"),
        Const("INIT_STD", "0.02", "GPT-2 initialisation"),
    ]

    blocks = []
    for j, (b, layers) in enumerate(groups):
        blocks.append({
            "name": "Block" if len(groups) == 1 else f"Block{j}",
            "norm": norm_cfgs[norms.index(b.norm)].cls,
            "attention": attention_cfgs[attentions.index(b.attention)].cls,
            "ffn": ffn_cfgs[ffns.index(b.ffn)].cls,
            "layers": _comment_safe(_layer_list(layers)),
        })
    model_methods = list(dict.fromkeys(c.part.hooks.get("model_methods", "") for c in ffn_cfgs if
                                       c.part.hooks.get("model_methods")))
    if len(model_methods) > 1:
        raise ValueError("codegen: FFN configurations add different Model methods; a kind's model_methods must not "
                         "depend on its configuration")

    tied = "tied" if m.tie_embeddings else "untied"
    if m.embedding_scale == "sqrt_d_model":
        tied += " sqrt(d_model)-scaled"
    if len(groups) == 1:
        b = groups[0][0]  # every layer's components (a group may override the model-wide ones for all layers)
        ba = b.attention
        layer_desc = (f"{ba.n_heads} heads ({ba.n_kv_heads} KV heads, {ba.layout}), {b.norm.describe(m)}, "
                      f"{b.ffn.describe(m)}, {a.positional.describe(m)}, {ba.sparsity.describe(m)}")
    else:
        layer_desc = f"{a.positional.describe(m)}, {len(groups)} block configurations (see the Block classes)"
    summary = (
        f"{spec.name}: decoder-only transformer, {m.n_layers} layers, d_model {m.d_model}, {layer_desc}, "
        f"{tied} embeddings. {acc.total:,} parameters ({acc.total - acc.embedding:,} non-embedding)."
    )
    cjson = model_json(spec)  # the model alone: a name or recipe change regenerates nothing but the banner
    return {
        "name": _comment_safe(spec.name),
        "source": _comment_safe(source),
        "summary": "\n".join(textwrap.wrap(_comment_safe(summary), 110, break_on_hyphens=False)),
        "spec_hash": _comment_safe(spec_hash(spec)),
        "spec_hash_literal": repr(spec_hash(spec)),
        "spec_json_chunks": _str_chunks(cjson),
        "constants": consts,
        "positional": positional,
        "norms": norm_cfgs,
        "sparsities": sparsity_cfgs,
        "attentions": attention_cfgs,
        "ffns": ffn_cfgs,
        "model_methods": model_methods[0] if model_methods else "",
        "blocks": blocks,
        "layout": ", ".join(str(next(j for j, (_, ls) in enumerate(groups) if i in ls)) for i in range(m.n_layers)),
        "final_norm": norm_cfgs[0].cls,
        "shared": _shared_code(m.units(), m),
        "tie_embeddings": bool(m.tie_embeddings),
        "past_context": _attention_unit.past_context_refusal(m) is None,
        "embedding_scale": m.embedding_scale == "sqrt_d_model",
    }


def _layer_list(layers: list[int]) -> str:
    if len(layers) > 2 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"layers {layers[0]}-{layers[-1]}"
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(map(str, layers))


def render(spec: Spec, source: str | None = None) -> str:
    """The generated module's source. Deterministic: the same spec and source label give the same bytes."""
    context = _context(spec, source or f"the spec {spec.name!r}")
    text = _ENV.get_template("model.py.j2").render(**context, from_file=source is not None)
    # Normalise blank lines the includes leave behind (at most two in a row, as black would).
    lines, blank = [], 0
    for line in text.splitlines():
        blank = blank + 1 if not line.strip() else 0
        if blank <= 2:
            lines.append(line.rstrip())
    return "\n".join(lines).rstrip() + "\n"


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
    else:
        import tempfile

        tmpdir = Path(tempfile.mkdtemp(prefix="archspec-gen-"))
        path = tmpdir / f"{spec.name}.py"
        path.write_text(text, encoding="utf-8")
    module = import_source(path, text)
    return Generated(spec=spec, source=text, path=path, source_hash=hashlib.sha256(text.encode()).hexdigest(),
                     module=module)
