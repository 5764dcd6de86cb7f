"""Spec → standalone PyTorch module source (Jinja2), and the one way to import and instantiate it.

Logic lives here, layout in `templates/`: this module turns a validated spec into a context of *literals* (numbers
rendered with repr, enum words checked against known sets, strings only as escaped Python literals), and the
templates place them. Each union member picks its own template file: `templates/<family>/<kind>.py.j2`, so a new
kind is a new file plus one context entry.
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
from archspec.spec import Spec, canonical_json, spec_hash

TEMPLATES = Path(__file__).parent / "templates"
DEFAULT_OUT = Path("generated")

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,  # Python source, not HTML: every value is made a safe literal before it reaches a template
)

# Every word that may reach the source, per family. A kind outside these sets is a bug, not user input (pydantic
# already refused it), but the check keeps the "nothing from a spec but known words" promise local and visible.
_KNOWN = {
    "norm": {"layernorm", "rmsnorm"},
    "positional": {"learned", "sinusoidal", "rope", "none"},
    "sparsity": {"dense"},
    "ffn": {"mlp", "glu"},
}
_ACTIVATIONS = {"relu": "F.relu({})", "gelu": "F.gelu({})", "silu": "F.silu({})", "sigmoid": "torch.sigmoid({})"}
_GLU_NAMES = {"silu": "SwiGLU", "gelu": "GEGLU", "relu": "ReGLU", "sigmoid": "GLU"}
_NORM_NAMES = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}


def _known(family: str, word: str) -> str:
    if word not in _KNOWN[family]:
        raise ValueError(f"codegen: no template for {family} kind {word!r}")
    return word


def _int(x: Any) -> str:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"expected int, got {x!r}")
    return str(int(x))


def _float(x: Any) -> str:
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"non-finite value {x!r}")
    return repr(x)


def _bool(x: Any) -> str:
    if not isinstance(x, bool):
        raise TypeError(f"expected bool, got {x!r}")
    return repr(x)


def _str_chunks(s: str, width: int = 100) -> list[str]:
    """A long string as repr'd chunks for implicit concatenation inside parentheses (each chunk is a literal)."""
    return [repr(s[i : i + width]) for i in range(0, len(s), width)] or ["''"]


def _comment_safe(s: str) -> str:
    """Text for a `#` comment or docstring: printable ASCII only, so no newline or quote can end it."""
    return "".join(c if c.isascii() and c.isprintable() and c not in "\"\\" else "?" for c in s)


@dataclass(frozen=True)
class Const:
    name: str
    value: str  # a Python literal
    why: str = ""

    @property
    def line(self) -> str:
        return f"{self.name} = {self.value}" + (f"  # {self.why}" if self.why else "")


def _attention_family(n_heads: int, n_kv_heads: int) -> str:
    if n_kv_heads == n_heads:
        return "MHA"
    if n_kv_heads == 1:
        return "MQA"
    return "GQA"


def _context(spec: Spec, source: str) -> dict[str, Any]:
    m, a, f, n = spec.model, spec.model.attention, spec.model.ffn, spec.model.norm
    norm_kind = _known("norm", n.kind)
    pos_kind = _known("positional", a.positional.kind)
    sparsity_kind = _known("sparsity", a.sparsity.kind)
    ffn_kind = _known("ffn", f.kind)
    family = _attention_family(a.n_heads, a.n_kv_heads)
    acc = account(spec)

    consts = [
        Const("VOCAB_SIZE", _int(m.vocab_size)),
        Const("CONTEXT_LENGTH", _int(m.context_length), "longest sequence; sizes position tables"),
        Const("D_MODEL", _int(m.d_model), "width of the residual stream"),
        Const("N_LAYERS", _int(m.n_layers)),
        Const("N_HEADS", _int(a.n_heads), "query heads"),
        Const("N_KV_HEADS", _int(a.n_kv_heads), {
            "MHA": "= N_HEADS: multi-head attention",
            "MQA": "1: multi-query attention, one K/V head for all queries",
            "GQA": f"grouped-query attention, {a.n_heads // a.n_kv_heads} query heads per K/V head",
        }[family]),
        Const("HEAD_DIM", _int(a.head_dim)),
        Const("ATTN_BIAS", _bool(a.bias)),
        Const("FFN_HIDDEN", _int(f.hidden_dim), f"{f.hidden_dim / m.d_model:.3g} × D_MODEL"),
        Const("FFN_BIAS", _bool(f.bias)),
        Const("NORM_EPS", _float(n.eps)),
    ]
    if pos_kind == "rope":
        consts.append(Const("ROPE_THETA", _float(a.positional.theta), "base of the rotary frequencies"))
    if pos_kind == "sinusoidal":
        consts.append(Const("SINUSOID_BASE", _float(a.positional.base)))
    consts += [
        Const("DROPOUT", _float(m.dropout), "on embeddings, attention weights and residual branches"),
        Const("INIT_STD", "0.02", "GPT-2 initialisation"),
    ]

    rope = pos_kind == "rope"
    tied = "tied" if m.tie_embeddings else "untied"
    ffn_desc = (_GLU_NAMES[f.activation] if ffn_kind == "glu" else f"{f.activation.upper()} MLP")
    summary = (
        f"{spec.name}: decoder-only transformer, {m.n_layers} layers, d_model {m.d_model}, {a.n_heads} heads "
        f"({a.n_kv_heads} KV heads, {family}), {_NORM_NAMES[norm_kind]}, {ffn_desc} FFN (hidden {f.hidden_dim}),\n"
        f"{pos_kind} positions, {a.sparsity.kind} attention, {tied} embeddings. "
        f"{acc.total:,} parameters ({acc.total - acc.embedding:,} non-embedding)."
    )
    cjson = canonical_json(spec)
    return {
        "name": _comment_safe(spec.name),
        "source": _comment_safe(source),
        "summary": "\n".join(textwrap.wrap(_comment_safe(summary.replace("\n", " ")), 110, break_on_hyphens=False)),
        "spec_hash": _comment_safe(spec_hash(spec)),
        "spec_hash_literal": repr(spec_hash(spec)),
        "spec_json_chunks": _str_chunks(cjson),
        "constants": consts,
        "norm_kind": norm_kind,
        "norm_bias": bool(getattr(n, "bias", False)),
        "positional_kind": pos_kind,
        "positional_mode": {"learned": "add", "sinusoidal": "add", "rope": "rope", "none": "none"}[pos_kind],
        "sparsity_kind": sparsity_kind,
        "ffn_kind": ffn_kind,
        "rope": rope,
        "rope_params": ", cos: torch.Tensor, sin: torch.Tensor" if rope else "",
        "rope_args": ", cos, sin" if rope else "",
        "gqa": a.n_kv_heads != a.n_heads,
        "attention_family": family,
        "activation_name": f.activation,
        "activation_call": lambda arg: _ACTIVATIONS[f.activation].format(arg),
        "glu_name": _GLU_NAMES.get(f.activation, "GLU"),
        "tie_embeddings": bool(m.tie_embeddings),
        "sinusoid_scale": bool(getattr(a.positional, "scale_embeddings", False)),
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


def available_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_estimate_bytes(spec: Spec, for_training: bool = False) -> int:
    """fp32 weights (+ gradients and two AdamW moments when training) and the fixed buffers."""
    acc = account(spec)
    m = spec.model
    buffers = m.context_length * (m.d_model if m.attention.positional.kind == "sinusoidal" else 0)
    buffers += 2 * m.context_length * m.attention.head_dim if m.attention.positional.kind == "rope" else 0
    per_param = 16 if for_training else 4
    return acc.total * per_param + 4 * buffers


def check_memory(spec: Spec, for_training: bool = False, device: str = "cpu") -> None:
    if device != "cpu":
        return  # device memory is checked by the allocator; the estimate below is about host RAM
    need, have = memory_estimate_bytes(spec, for_training), available_memory_bytes()
    if need > have:
        gib = 1 << 30
        what = "weights, gradients and AdamW state" if for_training else "fp32 weights"
        raise UserError(
            f"{spec.name}: needs about {need / gib:.1f} GiB for {what} ({account(spec).total:,} parameters), "
            f"but this machine has {have / gib:.1f} GiB available; shrink the model or use a larger machine"
        )
