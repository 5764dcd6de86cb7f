"""Spec → standalone PyTorch module source (Jinja2), and the one way to import and instantiate it.

Logic lives here and in the units, layout in templates: each kind (archspec.kinds) renders its own template with
its own context of *literals* (numbers through lit_int/lit_float, known words, strings only as escaped Python
literals) into a `Part` (module code plus the lines it adds at its family's hook points), and
`templates/model.py.j2` assembles the parts into one file. Nothing here knows a kind by name.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import sys
import textwrap
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
from archspec.spec import Spec, canonical_json, spec_hash

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


def _context(spec: Spec, source: str) -> dict[str, Any]:
    m, a = spec.model, spec.model.attention
    acc = account(spec)

    consts = [
        Const("VOCAB_SIZE", lit_int(m.vocab_size)),
        Const("CONTEXT_LENGTH", lit_int(m.context_length), "longest sequence; sizes position tables"),
        Const("D_MODEL", lit_int(m.d_model), "width of the residual stream"),
        Const("N_LAYERS", lit_int(m.n_layers)),
        *a.constants(m),
    ]
    for unit in m.units():
        consts += unit.constants(m)
    consts += [
        Const("DROPOUT", lit_float(m.dropout), "on embeddings, attention weights and residual branches"),
        Const("INIT_STD", "0.02", "GPT-2 initialisation"),
    ]

    parts = {"norm": _unit_part(m.norm, m), "positional": _unit_part(a.positional, m), "ffn": _unit_part(m.ffn, m)}
    attention_ctx = a.template_context(m)
    parts["sparsity"] = _unit_part(a.sparsity, m, attention_ctx)
    parts["attention"] = _render_unit(
        f"unit:{ATTENTION_TEMPLATE}", (),
        {"unit": a, **attention_ctx, "positional": parts["positional"], "sparsity": parts["sparsity"]})

    tied = "tied" if m.tie_embeddings else "untied"
    summary = (
        f"{spec.name}: decoder-only transformer, {m.n_layers} layers, d_model {m.d_model}, {a.n_heads} heads "
        f"({a.n_kv_heads} KV heads, {a.layout}), {m.norm.describe(m)}, {m.ffn.describe(m)}, "
        f"{a.positional.describe(m)}, {a.sparsity.describe(m)}, {tied} embeddings. "
        f"{acc.total:,} parameters ({acc.total - acc.embedding:,} non-embedding)."
    )
    cjson = canonical_json(spec)
    return {
        "name": _comment_safe(spec.name),
        "source": _comment_safe(source),
        "summary": "\n".join(textwrap.wrap(_comment_safe(summary), 110, break_on_hyphens=False)),
        "spec_hash": _comment_safe(spec_hash(spec)),
        "spec_hash_literal": repr(spec_hash(spec)),
        "spec_json_chunks": _str_chunks(cjson),
        "constants": consts,
        "parts": parts,
        "tie_embeddings": bool(m.tie_embeddings),
    }


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


def import_source(path: Path) -> ModuleType:
    """Import a generated file under a unique module name (one per content hash), without touching sys.path."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    mod_name = f"archspec_generated_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # dataclasses/pickling/torch.compile look modules up by name
    try:
        spec.loader.exec_module(module)
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
    module = import_source(path)
    return Generated(spec=spec, source=text, path=path, source_hash=hashlib.sha256(text.encode()).hexdigest(),
                     module=module)
