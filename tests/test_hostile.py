"""Hostile input (issue 2, items 3 and 5): no spec content can inject code into the generated source, and broken or
hostile spec files end in exit code 2 with one line per problem, never a traceback.

A generated module is checked against a benign twin (the same model, harmless strings): after blanking the module
docstring and the SPEC_JSON / SPEC_HASH literals their ASTs must be identical, so hostile text changed nothing but
the data it is allowed to live in; importing it must not run anything (a marker file stays absent).
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from archspec.cli import main
from archspec.codegen import generate, render
from archspec.spec import SpecError, canonical_dict, load_spec_dict, model_json, parse_spec, model_hash

ROOT = Path(__file__).resolve().parent.parent

BASE = {"name": "t", "model": {"vocab_size": 257, "context_length": 8, "d_model": 16, "n_layers": 1,
                               "attention": {"n_heads": 2}}}

# MARKER is replaced by a per-test file path: if any of these ran, the file would exist.
HOSTILE = [
    "x'; import os; os.system('echo pwned') #",
    'x"; import os; os.system("echo pwned") #',
    '"""\n__import__("pathlib").Path(MARKER).touch()\n"""',
    "'''\n__import__('pathlib').Path(MARKER).touch()\n'''",
    "\\\n__import__('pathlib').Path(MARKER).touch()  #",
    "')\n__import__('pathlib').Path(MARKER).touch()\nX = ('",
    '")\n__import__("pathlib").Path(MARKER).touch()\nX = ("',
    "\r\n__import__('pathlib').Path(MARKER).touch()\r\n",
    "\u2028__import__('pathlib').Path(MARKER).touch()\u2029\x0b\x0c\x1c\x1d\x1e\x85",
    "\x00\x1b[31mred\x1b[0m\x07\x08",
    "{{ 7 * 7 }}{% for x in [1] %}{{ x }}{% endfor %}{# c #}{{ cycler.__init__.__globals__.os }}",
    "__import__('pathlib').Path(MARKER).touch()",
    "é ü 中文 😀 \u202e\u2066 bidi \ufeff",
    "\\u0027\\x27\\N{APOSTROPHE}\\",
    "\ud800 lone surrogate",
    "a" * 3000,
    "",
]
IDS = [f"h{i}" for i in range(len(HOSTILE))]


def _with(data: dict, path: tuple, value) -> dict:
    out = json.loads(json.dumps(data))
    node = out
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return out


def _skeleton(src: str) -> str:
    """The module's AST with the docstring and the SPEC_JSON / SPEC_HASH values blanked."""
    tree = ast.parse(src)
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            node.value.value = "<docstring>"
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] in (["SPEC_JSON"],
                                                                                             ["SPEC_HASH"]):
            node.value = ast.Constant("<literal>")
    return ast.dump(tree)


def _string_assignments(src: str) -> set[str]:
    """Names assigned a string constant at module level."""
    out = set()
    for node in ast.parse(src).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {t.id for t in targets if isinstance(t, ast.Name)}
    return out


def _comment_lines(src: str) -> list[int]:
    """Line numbers of comments, counted outside the SPEC_JSON literal (whose length follows the spec's text)."""
    lines = src.splitlines()
    start = lines.index("SPEC_JSON = (")
    end = lines.index(")", start)
    kept = lines[:start] + lines[end + 1:]
    tokens = tokenize.generate_tokens(io.StringIO("\n".join(kept) + "\n").readline)
    return [tok.start[0] for tok in tokens if tok.type == tokenize.COMMENT]


def _assert_inert(spec, benign, tmp_path: Path, marker: Path, source: str | None = None) -> None:
    src = render(spec, source)
    assert _skeleton(src) == _skeleton(render(benign)), "hostile content changed the code"
    assert _string_assignments(src) == {"SPEC_JSON", "SPEC_HASH"}
    assert _comment_lines(src) == _comment_lines(render(benign))  # comments neither gained nor lost lines
    assert all(line.startswith("#") for line in src.splitlines()[:6])  # the banner stays comments
    module = generate(spec, out_dir=tmp_path / "gen", source=source).module
    assert not marker.exists(), "importing the generated module ran spec content"
    assert module.SPEC_JSON == model_json(spec)
    assert module.SPEC_HASH == model_hash(spec) == hashlib.sha256(module.SPEC_JSON.encode()).hexdigest()
    assert json.loads(module.SPEC_JSON) == canonical_dict(spec)["model"]


@pytest.fixture
def marker(tmp_path):
    return tmp_path / "pwned"


def _payload(text: str, marker: Path) -> str:
    return text.replace("MARKER", repr(str(marker)))


# ── strings in the spec ──────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("payload", HOSTILE + ["Upper", "a\n", "\nname", "../../etc/passwd", "a/b", "a b", "-x",
                                               "a" * 65, "__import__"], ids=IDS + [f"n{i}" for i in range(9)])
def test_hostile_names_are_refused_at_the_name(payload, marker):
    data = _with(BASE, ("name",), _payload(payload, marker))
    with pytest.raises(ValidationError) as info:
        parse_spec(data)
    assert [e["loc"] for e in info.value.errors()] == [("name",)]
    with pytest.raises(SpecError) as info:
        load_spec_dict(data)
    (line,) = info.value.problems
    assert line.startswith("name: ") and len(line.splitlines()) == 1  # a slug, or a string at all (surrogates)


@pytest.mark.parametrize("payload", HOSTILE, ids=IDS)
def test_hostile_strings_in_values_stay_inert_literals(payload, tmp_path, marker):
    """Corpus paths are the free text a spec may hold; they are recipe, so they never reach the source at all."""
    text = _payload(payload, marker)
    data = _with(BASE, ("train", "data", "corpus"), {"kind": "files", "paths": [text, text[::-1]]})
    try:
        spec = load_spec_dict(data)
    except SpecError as e:  # refusing is fine, at the field
        assert all(p.startswith("train.data.corpus.paths") for p in e.problems), e.problems
        return
    benign = load_spec_dict(_with(BASE, ("train", "data", "corpus"), {"kind": "files", "paths": ["a", "b"]}))
    _assert_inert(spec, benign, tmp_path, marker)
    assert spec.train.data.corpus.paths[0] == text


@pytest.mark.parametrize("payload", HOSTILE, ids=IDS)
def test_hostile_source_labels_stay_in_comments(payload, tmp_path, marker):
    """The spec file's path is printed in the banner: a file name can hold newlines and quotes too."""
    spec = load_spec_dict(BASE)
    _assert_inert(spec, spec, tmp_path, marker, source=_payload(payload, marker))


def test_spec_file_with_a_hostile_file_name_builds_safely(tmp_path, marker, capsys):
    hidden = repr(str(marker).replace("/", "|")) + ".replace('|', chr(47))"  # a file name holds no '/'
    name = "evil\n__import__('pathlib').Path(" + hidden + ").touch()\n\"\"\"'''.yaml"
    path = tmp_path / name
    path.write_text(json.dumps(BASE))
    out = tmp_path / "out"
    assert main(["build", str(path), "--out", str(out), "--no-record"]) == 0, capsys.readouterr().err
    src = (out / "t.py").read_text()
    assert _skeleton(src) == _skeleton(render(load_spec_dict(BASE)))
    assert not marker.exists()


# ── numbers and coercions ────────────────────────────────────────────────────────────────────────────────────────

REFUSED = object()


@pytest.mark.parametrize("path,value,expected", [
    # the least eps (archspec.kinds.base.EPS_MIN); a smaller one makes a norm of a zero vector NaN (forward or grad)
    (("model", "norm"), {"kind": "rmsnorm", "eps": 1e-20}, 1e-20),
    (("model", "norm"), {"kind": "rmsnorm", "eps": 1.1754943508222875e-38}, REFUSED),
    (("model", "norm"), {"kind": "rmsnorm", "eps": 5e-324}, REFUSED),
    (("train", "adam_eps"), 1e-40, REFUSED),
    (("model", "attention", "positional"), {"kind": "rope", "theta": 1e9}, 1e9),
    (("train", "grad_clip"), 1e308, 1e308),
    (("model", "norm", "eps"), 1e308, REFUSED),
    (("model", "attention", "positional"), {"kind": "rope", "theta": 1e308}, REFUSED),
    (("model", "attention", "positional"), {"kind": "sinusoidal", "base": float("inf")}, REFUSED),
    (("model", "dropout"), float("nan"), REFUSED),
    (("model", "dropout"), "nan", REFUSED),
    (("model", "dropout"), "-inf", REFUSED),
    (("model", "vocab_size"), 10**400, REFUSED),
    (("model", "context_length"), -(10**30), REFUSED),
    (("model", "norm", "eps"), 10**400, REFUSED),
    (("model", "d_model"), "9" * 5000, REFUSED),
    (("model", "d_model"), "16", 16),
    (("model", "d_model"), 16.0, 16),
    (("model", "d_model"), 16.5, REFUSED),
    (("model", "d_model"), "0x10", REFUSED),
    (("model", "tie_embeddings"), "false", REFUSED),  # a string is not a bool
    (("model", "tie_embeddings"), "False", REFUSED),  # a string is not a bool
    (("model", "tie_embeddings"), "no", REFUSED),  # a string is not a bool
    (("model", "tie_embeddings"), "off", REFUSED),  # a string is not a bool
    (("model", "tie_embeddings"), "0", REFUSED),  # a string is not a bool
    (("model", "tie_embeddings"), "true", REFUSED),  # a string is not a bool
    (("model", "tie_embeddings"), "maybe", REFUSED),
    (("model", "tie_embeddings"), "", REFUSED),
    (("model", "tie_embeddings"), 2, REFUSED),
    (("model", "attention", "bias"), "yes", REFUSED),  # quoted: a string, not YAML's yes
    (("train", "seed"), 2**31, REFUSED),
    (("train", "compile"), "None", REFUSED),
    (("model", "parametrization"), "MUP", REFUSED),
    (("model", "parametrization"), True, REFUSED),
    (("model", "mup_base_width"), 0, REFUSED),
    (("model", "mup_base_width"), 10**400, REFUSED),
    (("model", "mup_base_width"), 64, REFUSED),  # a base width under the standard parametrization means nothing
])
def test_hostile_numbers_are_refused_at_the_field_or_normalised(path, value, expected, tmp_path):
    data = _with(BASE, path, value)
    if expected is REFUSED:
        with pytest.raises(SpecError) as info:
            load_spec_dict(data)
        where = ".".join(path)
        assert any(p.startswith(where + ":") or p.startswith(where + ".") for p in info.value.problems), \
            info.value.problems
        assert all(len(p.splitlines()) == 1 for p in info.value.problems)
        return
    spec = load_spec_dict(data)
    got = canonical_dict(spec)
    for key in path:
        got = got[key]
    if isinstance(got, dict):
        got = next(v for k, v in got.items() if k != "kind" and v == expected)
    assert got == expected and type(got) is type(expected)  # "false" is False, not a truthy string
    module = generate(spec, out_dir=tmp_path).module
    m, a = spec.model, spec.model.attention
    constants = {"VOCAB_SIZE": m.vocab_size, "D_MODEL": m.d_model, "N_LAYERS": m.n_layers, "N_HEADS": a.n_heads,
                 "N_KV_HEADS": a.n_kv_heads, "HEAD_DIM": a.head_dim, "QKV_BIAS": a.qkv_bias, "OUT_BIAS": a.out_bias, "NORM_EPS": m.norm.eps,
                 "FFN_HIDDEN": m.ffn.hidden_dim, "FFN_BIAS": m.ffn.bias, "DROPOUT": m.dropout,
                 "CONTEXT_LENGTH": m.context_length}
    if a.positional.kind == "rope":
        constants["ROPE_THETA"] = a.positional.theta
    for name, want in constants.items():
        have = getattr(module, name)
        assert have == want and type(have) is type(want), (name, have, want)
    assert ("self.lm_head.weight = self.tok_emb.weight" in generate(spec, out_dir=tmp_path).source) is m.tie_embeddings


def test_bools_where_ints_are_expected_never_reach_the_source_as_bools(tmp_path):
    """`n_layers: true` (YAML `yes`) is refused or read as 1; the module never holds `N_LAYERS = True`."""
    try:
        spec = load_spec_dict(_with(BASE, ("model", "n_layers"), True))
    except SpecError as e:
        assert e.problems[0].startswith("model.n_layers:")
        return
    assert type(spec.model.n_layers) is int
    assert "N_LAYERS = 1\n" in render(spec)


# ── keys and messages ────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("key", ["__class__", "model_config", "model_fields", "__init__", "__dict__", "Kind",
                                 "kind ", "x'; import os #", "${HOME}", "{{ 7 * 7 }}"])
def test_unknown_keys_are_refused_by_path(key):
    with pytest.raises(SpecError) as info:
        load_spec_dict(_with(BASE, ("model", "norm", key), 1))
    (problem,) = info.value.problems
    assert problem.startswith(f"model.norm.{key}: unknown field; ")  # the path, whatever the key holds
    # a near miss is named ("did you mean"), else the valid fields of that place
    assert ("did you mean kind?" in problem if key.strip().lower() == "kind" else
            "valid here: eps, kind, unit_offset" in problem), problem
    assert problem.endswith("(`archspec schema` lists the valid fields)")


_TEXTS = {"newline": "a\nmodel.d_model: forged problem", "ansi": "x\x1b[2J\x1b[31m", "cr": "a\rb",
          "u2028": "a\u2028b"}


@pytest.mark.parametrize("where,text", [
    pytest.param(where, text, id=f"{label}-{where}")
    for label, text in _TEXTS.items() for where in ("key", "kind")
])
def test_problem_lines_stay_one_line_whatever_the_text(where, text):
    data = (_with(BASE, ("model", text), 1) if where == "key"
            else _with(BASE, ("train", "data", "corpus"), {"kind": text}))
    with pytest.raises(SpecError) as info:
        load_spec_dict(data)
    (line,) = info.value.problems
    assert len(line.splitlines()) == 1 and line.isprintable(), repr(line)


@pytest.mark.parametrize("kind", ["cycle", "tuple-key"])
def test_load_spec_dict_raises_only_spec_errors(kind):
    data = _with(BASE, ("name",), "t")
    if kind == "cycle":
        data["junk"] = data
    else:
        data[("a", "b")] = 1
    with pytest.raises(SpecError):
        load_spec_dict(data)


# ── spec files on the command line ───────────────────────────────────────────────────────────────────────────────

SPEC_OK = "name: t\nmodel: {vocab_size: 257, context_length: 8, d_model: 16, n_layers: 1, attention: {n_heads: 2}}\n"

FILES = {
    "invalid-yaml": (b"name: [unclosed\n", "invalid YAML"),
    "bad-indentation": (b"name: t\n  model: 1\n model: 2\n", "invalid YAML"),
    "tab-indent": (b"name: t\nmodel:\n\tvocab_size: 3\n", "invalid YAML"),
    "list": (b"- name: t\n- model: {}\n", "expected a mapping"),
    "scalar": (b"just some text\n", "expected a mapping"),
    "empty": (b"", "empty spec file"),
    "only-comments": (b"# nothing here\n", "expected a mapping"),
    "python-object-apply": (b"name: !!python/object/apply:os.system ['touch MARKER']\n", "invalid YAML"),
    "python-object-new": (b"!!python/object/new:subprocess.Popen [['touch', 'MARKER']]\n", "invalid YAML"),
    "python-name": (b"name: !!python/name:os.system\n", "invalid YAML"),
    "python-tuple": (b"name: !!python/tuple [a, b]\n", "invalid YAML"),
    "binary": (bytes(range(256)) * 4, "cannot read"),
    "nul-byte": (b"name: t\x00\n", "invalid YAML"),
    "utf16": ("name: t\n".encode("utf-16"), "cannot read"),
    "multi-document": (SPEC_OK.encode() + b"---\n" + SPEC_OK.encode(), "invalid YAML"),
}


def _run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("case", list(FILES))
def test_build_refuses_broken_or_hostile_yaml(case, tmp_path, marker, capsys):
    content, needle = FILES[case]
    path = tmp_path / "spec.yaml"
    path.write_bytes(content.replace(b"MARKER", str(marker).encode()))
    rc, out, err = _run(capsys, "build", str(path), "--out", str(tmp_path / "gen"), "--no-record")
    assert rc == 2 and "Traceback" not in out + err
    (line,) = err.strip().splitlines()  # one problem, one line
    assert line.startswith(f"error: {path}") and needle in line, line
    assert not marker.exists() and not (tmp_path / "gen").exists()


def test_build_lists_every_problem_of_a_spec_one_per_line(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text("name: Bad Name\nmodel: {d_model: 0, norm: {kind: batchnorm}, attention: {n_heads: '8x'}}\n")
    rc, out, err = _run(capsys, "build", str(path), "--no-record", "--out", str(tmp_path / "gen"))
    lines = err.strip().splitlines()
    assert rc == 2 and "Traceback" not in out + err
    assert lines[0] == f"error: {path}: invalid spec (4 problems)"
    assert [line.split(":")[0].strip() for line in lines[1:]] == [
        "name", "model.d_model", "model.norm", "model.attention.n_heads"]


def test_build_refuses_a_directory_and_a_missing_file(tmp_path, capsys):
    rc, out, err = _run(capsys, "build", str(tmp_path), "--no-record")
    assert rc == 2 and "Traceback" not in out + err and "is a directory" in err
    rc, out, err = _run(capsys, "build", str(tmp_path / "missing.yaml"), "--no-record")
    assert rc == 2 and "Traceback" not in out + err
    assert err.strip() == f"error: {tmp_path / 'missing.yaml'}: no such spec file"


def test_build_refuses_a_recursive_yaml_alias(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text("name: t\nmodel: &m\n  x: *m\n")
    rc, out, err = _run(capsys, "build", str(path), "--no-record", "--out", str(tmp_path / "gen"))
    assert rc == 2 and "Traceback" not in out + err


_LOAD_UNDER_MEMORY_LIMIT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 29, 1 << 29))  # 512 MiB: the spec itself is 1.5 kB
from archspec.errors import UserError
from archspec.spec import load_spec
try:
    load_spec(sys.argv[1])
except UserError as e:
    print(e.render())
    sys.exit(2)
"""


def test_build_refuses_a_yaml_alias_bomb(tmp_path):
    lines = ["name: bomb", 'l0: &l0 "' + "x" * 1000 + '"']
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    proc = subprocess.run([sys.executable, "-c", _LOAD_UNDER_MEMORY_LIMIT, str(path)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-500:]
    assert "more than 100,000 values once YAML aliases are expanded" in proc.stdout


def test_console_script_refuses_a_python_tag_without_running_it(tmp_path, marker):
    exe = Path(sys.executable).with_name("archspec")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "archspec"]
    path = tmp_path / "evil.yaml"
    path.write_text(f"name: !!python/object/apply:os.system ['touch {marker}']\n")
    proc = subprocess.run([*cmd, "build", str(path), "--no-record", "--out", str(tmp_path / "gen")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr.strip().startswith(f"error: {path}:1:7: invalid YAML: could not determine a constructor")
    assert not marker.exists()


# ── --set overrides ──────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("override,needle", [
    ("name=x'; import os; os.system('echo pwned') #", "name: must be a slug"),
    ("model.__class__=1", "model.__class__: unknown field"),
    ("model.d_model.x=1", "model.d_model is a int, not a mapping"),
    ("=1", "invalid key"),
    ("model..d_model=1", "invalid key"),
    ("model.attention={kind: !!python/name:os.system }", "cannot parse value"),
    ("model.norm.eps=.inf", "model.norm.eps:"),
    ("model.norm={kind: '\"\"\"; import os'}", "model.norm: kind must be one of"),
])
def test_hostile_overrides_are_refused(override, needle, tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC_OK)
    rc, out, err = _run(capsys, "build", str(path), "--set", override, "--no-record", "--out", str(tmp_path / "g"))
    assert rc == 2 and "Traceback" not in out + err and needle in err, err
    assert not (tmp_path / "g").exists()


def test_hostile_override_values_stay_inert(tmp_path, marker, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC_OK)
    evil = _payload('"""\\n__import__("pathlib").Path(MARKER).touch()\\n"""', marker).replace("'", "''")
    rc, _, err = _run(capsys, "build", str(path), "--no-record", "--out", str(tmp_path / "g"),
                      "--set", f"train.data.corpus={{kind: files, paths: ['{evil}']}}")
    assert rc == 0, err
    src = (tmp_path / "g" / "t.py").read_text()
    assert _skeleton(src) == _skeleton(render(load_spec_dict(BASE)))
    assert not marker.exists()


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_at_the_least_eps_a_norm_of_a_zero_vector_has_finite_gradients(norm, tmp_path):
    """The bound's reason: a sandwich post-norm over the zero output of the tokens an MoE drops (capacity 0.5), at
    EPS_MIN, gives finite logits and gradients (a Hypothesis draw at float32's smallest normal gave NaN gradients)."""
    from archspec.kinds.base import EPS_MIN

    spec = load_spec_dict({"name": "eps", "model": {
        "vocab_size": 16, "context_length": 4, "d_model": 8, "n_layers": 1,
        "attention": {"n_heads": 4, "n_kv_heads": 2, "positional": {"kind": "learned"}},
        "norm": {"kind": norm, "eps": EPS_MIN}, "block": {"norm_placement": "sandwich"},
        "ffn": {"kind": "moe", "n_experts": 2, "top_k": 1, "expert": {"kind": "glu"}, "capacity_factor": 0.5,
                "drop_policy": "probs"}}})
    torch.manual_seed(0)
    model = generate(spec, out_dir=tmp_path).module.Model().train()
    idx = torch.randint(0, 16, (4, 4), generator=torch.Generator().manual_seed(0))
    logits, loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(logits).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
