"""Kinds are units (issue 8): each norm, positional, attention pattern and FFN lives in one place, and a kind
registered from outside archspec, through the public API alone, is seen by the spec, the JSON Schema, filters,
`--set`, the strategies, codegen and accounting."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest
import torch
import torch.nn.functional as F
import yaml
from hypothesis import given, settings

from archspec import testing as T
from archspec.accounting import account
from archspec.codegen import generate
from archspec.data import data_families
from archspec.kinds import families
from archspec.spec import json_schema, load_spec_dict, model_hash
from tests.tiny import TINY_GQA, tiny_spec

ROOT = Path(__file__).resolve().parent.parent
TOY = Path(__file__).resolve().parent / "kinds_toy"


def _spec(**model):
    return tiny_spec("k", base=TINY_GQA, **model)  # vocab 61, d_model 32: the tests below draw and shape by these


# ── one place per kind ───────────────────────────────────────────────────────────────────────────────────────────

_BUILTIN_KINDS = {k for fam in families().values() for k in fam.members}
_OUTSIDE_UNITS = [p for p in (ROOT / "archspec").rglob("*.py") if "kinds" not in p.relative_to(ROOT / "archspec").parts[:1]]


@pytest.mark.parametrize("path", _OUTSIDE_UNITS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_model_kind_is_named_outside_its_unit(path):
    """Nothing outside archspec/kinds dispatches on a model kind: no `kind == "rope"`, no set of known kinds.
    (spec/model.py re-exports the built-in classes by import, which names modules, not kind strings.)"""
    source = path.read_text(encoding="utf-8")
    hf_vocabulary: set[str] = set()
    if path.relative_to(ROOT).parts[:2] == ("archspec", "hf"):
        # archspec/hf/ speaks transformers' vocabulary: a word that a transformers config defines (`sliding_window`
        # is MistralConfig's) is an HF field there, not our kind; `"ffn": "mlp"` names transformers' module
        # (model.layers.N.mlp), not our FFN kind; `"o": "dense"` the output projection's module of GPT-NeoX and Phi
        # (attention.dense), not our sparsity kind.
        from transformers import MistralConfig, Qwen2Config
        from transformers.models.mpt.configuration_mpt import MptAttentionConfig

        # BLOOM's attention output projection is the module `dense` (transformer.h.N.self_attention.dense); MPT's
        # attn_config has an `alibi` switch, transformers' word for that building block too
        source = source.replace('"ffn": "mlp"', "").replace('"o": "dense"', "")
        hf_vocabulary = {w for w in _BUILTIN_KINDS for c in (MistralConfig(), Qwen2Config(), MptAttentionConfig())
                         if hasattr(c, w)}
        # a kind named after the model that introduced it (`mamba2`) is also that model's transformers type
        from transformers import CONFIG_MAPPING

        hf_vocabulary |= {w for w in _BUILTIN_KINDS if w in CONFIG_MAPPING}
    words = "|".join(sorted(_BUILTIN_KINDS - {"none"} - hf_vocabulary))
    hits = [m.group(0) for m in re.finditer(rf"[\"']({words})[\"']", source)]
    assert not hits, f"{path.name} names model kinds {hits}: that knowledge belongs in the kind's unit"


_MIXER_ATTRIBUTES = {cls.attribute for name in ("attention", "mixer") for cls in families()[name].members.values()}


@pytest.mark.parametrize("path", _OUTSIDE_UNITS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_mixer_or_its_attribute_is_named_outside_its_unit(path):
    """Nothing outside archspec/kinds reaches for a token mixer's module by name (`block.attn`, `"conv"`) or names a
    mixer kind (issue 43): a layer's mixer is `BlockSpec.token_mixer`, its module the block attribute the kind names
    (`MixerKind.attribute`). archspec/hf speaks transformers' vocabulary, whose role table names HF's modules
    (`"attn": "self_attn"`, LFM2's `conv`): it is left out."""
    if path.relative_to(ROOT).parts[:2] == ("archspec", "hf"):
        return
    source = path.read_text(encoding="utf-8")
    mixers = {k for name in ("attention", "mixer") for k in families()[name].members}
    words = "|".join(sorted(_MIXER_ATTRIBUTES | mixers))
    hits = [m.group(0) for m in re.finditer(rf"[\"']({words})[\"']|\bblocks?(\[\w+\])?\.({words})\b(?!_)", source)]
    assert not hits, f"{path.name} names mixers or their modules {hits}: ask the layer's token_mixer"
    assert {"attn", "conv"} <= _MIXER_ATTRIBUTES and "short_conv" in mixers  # the guard knows what it guards


def _ffn_module_attributes() -> set[str]:
    """The attributes the FFN kinds' templates give their modules (`self.router = ...`, `register_buffer("...")`),
    less the projection names every FFN, HF mapping and TP plan shares (`up_proj`, ...) and `top_k` / `parallel`."""
    names: set[str] = set()
    for template in (ROOT / "archspec" / "kinds" / "ffn").glob("*.j2"):
        text = template.read_text(encoding="utf-8")
        names |= set(re.findall(r"\bself\.([a-z_]+)(?:: [^=\n]+)? = ", text)) | set(re.findall(r'register_buffer\("([a-z_]+)"', text))
    from archspec.runtime.protocol import HOOKS  # a Model-level hook may share a module attribute's name

    return names - {"up_proj", "down_proj", "gate_proj", "top_k", "parallel"} - set(HOOKS)


_FFN_ATTRIBUTES = _ffn_module_attributes()
# Modules whose job is a kind's module, by design: expert parallelism and the TP plans place their styles on the
# experts submodule, testing/ counts a built module's active parameters;
# archspec/hf speaks transformers' vocabulary (its role tables name HF's modules: `"router": "gate"`).
_FFN_ATTRIBUTE_USERS = {"archspec/train/expert_parallel.py", "archspec/train/tensor_parallel.py",
                        "archspec/testing/assertions.py"}


@pytest.mark.parametrize("path", _OUTSIDE_UNITS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_ffn_module_attribute_is_reached_for_outside_its_unit(path):
    """Nothing outside archspec/kinds reaches into a MoE's module by attribute name (`block.ffn.router`,
    `getattr(ffn, "router_losses")`): a trainer calls the generated model's declared hooks
    (archspec.runtime.protocol.TrainingHooks: auxiliary_losses, after_micro_batch, after_optimizer_step,
    router_stats). Code tokens only: a docstring may name them."""
    import io
    import tokenize

    rel = str(path.relative_to(ROOT))
    if rel in _FFN_ATTRIBUTE_USERS or rel.startswith("archspec/hf/") or path.suffix != ".py":
        return
    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline))
    hits = [f"{rel}:{tok.start[0]}: {tok.string}" for prev, tok in zip(tokens, tokens[1:])
            if not tok.line.lstrip().startswith(("from ", "import "))  # a module path (archspec.runtime.experts)
            and (tok.type == tokenize.NAME and prev.string == "." and tok.string in _FFN_ATTRIBUTES)
            or (tok.type == tokenize.STRING and tok.string.strip("'\"") in _FFN_ATTRIBUTES)]
    assert not hits, f"reaches for a FFN kind's module attributes: {hits}; call the model's TrainingHooks"
    assert {"router", "experts", "router_losses", "selection_bias"} <= _FFN_ATTRIBUTES  # the guard knows its names


# ── one place per data kind (issue 24): corpora and tokenizers are units of archspec/data ────────────────────────

_DATA_KINDS = {k for fam in data_families().values() for k in fam.members}
_OUTSIDE_DATA_UNITS = [p for p in (ROOT / "archspec").rglob("*.py") if p.relative_to(ROOT / "archspec").parts[0] != "data"]


@pytest.mark.parametrize("path", _OUTSIDE_DATA_UNITS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_data_kind_is_named_outside_its_unit(path):
    """Nothing outside archspec/data dispatches on a corpus or tokenizer kind: no `kind == "mqar"`, no tuple of
    task names, no `{"kind": "bpe", ...}` written by hand; choices and field names come from the registry."""
    source = path.read_text(encoding="utf-8")
    words = "|".join(sorted(_DATA_KINDS))
    hits = [m.group(0) for m in re.finditer(rf"[\"']({words})[\"']", source)]
    assert not hits, \
        f"{path.name} names data kinds {hits}: that knowledge belongs in the kind's unit (archspec/data)"


def test_data_kinds_are_the_registry():
    """The spec's unions, the probe's --task choices, the registry's probe.<task> fields and the strategies are the
    registered data kinds, in registration order."""
    from archspec.cli.probe import probe_cmd
    from archspec.data import corpus_kinds, task_kinds, tokenizer_kinds
    from archspec.registry.query import resolve_field
    from archspec.spec.train import DataSpec
    from archspec.train.tokenizer import tokenizer_state_problems

    assert list(T.union_members(DataSpec, "corpus")) == list(corpus_kinds())
    assert list(T.union_members(DataSpec, "tokenizer")) == list(tokenizer_kinds())
    assert set(T.CORPUS_KINDS) == set(corpus_kinds()) and set(T.TOKENIZER_KINDS) == set(tokenizer_kinds())
    task = next(p for p in probe_cmd.params if p.name == "task")
    assert tuple(task.type.choices) == tuple(task_kinds()) and task_kinds()
    assert all(cls.task for cls in task_kinds().values())
    for kind in task_kinds():
        assert resolve_field(f"probe.{kind}.accuracy", "runs").kind == "probe"
    kinds = " or ".join(repr(k) for k in tokenizer_kinds())
    assert tokenizer_state_problems({"kind": "nope"}) == [f"tokenizer: expected a mapping with kind {kinds}"]


_DATA_CHILD = textwrap.dedent('''
    from typing import Literal
    import jsonschema
    from archspec.data import TaskCorpusKind, register
    from archspec.data.base import FIRST_SYMBOL

    @register
    class Copy(TaskCorpusKind):  # registered after the spec classes are built: they are rebuilt in place
        kind: Literal["copy"] = "copy"
        vocab: int = 8
        train_examples: int = 16
        val_examples: int = 8
        seed: int = 0
        probe_help = "copy the first token"

        def fit_problems(self, seq_len, where, length_name):
            return [] if seq_len >= 2 else [(where, f"needs {length_name} >= 2", seq_len)]

        def fill(self, rng, tokens, answers, seq_len):
            import numpy as np
            tokens[:] = FIRST_SYMBOL + rng.integers(0, self.vocab, tokens.shape)
            tokens[:, -1] = tokens[:, 0]
            answers[:, -1] = True
            return np.full(len(tokens), -1, dtype=np.int64)

        @property
        def chance(self):
            return 1.0 / self.vocab

    from archspec import testing as T
    from archspec.cli.probe import probe_cmd
    from archspec.spec import json_schema, known_keys, load_spec_dict
    from archspec.train.data import build_data

    raw = {"name": "toy", "model": {"vocab_size": 260, "context_length": 8, "d_model": 16, "n_layers": 1,
           "attention": {"n_heads": 2}}, "train": {"data": {"corpus": {"kind": "copy", "vocab": 5}}}}
    spec = load_spec_dict(raw)
    assert spec.train.data.corpus.vocab == 5
    jsonschema.validate(raw, json_schema())
    assert "train.data.corpus.vocab" in known_keys()
    assert "copy" in T.CORPUS_KINDS
    assert "copy" in next(p for p in probe_cmd.params if p.name == "task").type.choices
    data = build_data(spec, None)
    x, y = data.sampler.next_batch()
    assert (y[:, -1] == x[:, 0]).all() and (y[:, :-1] == -100).all()
    bad = dict(raw, train={"data": {"corpus": {"kind": "copy"}, "tokenizer": {"kind": "bpe", "vocab_size": 260}}})
    try:
        load_spec_dict(bad)
    except Exception as e:
        assert any("copy corpus is written in the byte tokenizer's ids" in p for p in e.problems), e.problems
    else:
        raise AssertionError("a task with a BPE tokenizer was accepted")
    print("OK")
''')


def test_a_data_kind_registered_late_works_everywhere():
    out = subprocess.run([sys.executable, "-c", _DATA_CHILD], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stderr[-3000:]


def test_every_kind_has_its_template_beside_it():
    for fam in families().values():
        assert fam.default is None or fam.default in fam.members
        for kind, cls in fam.members.items():
            assert cls.template_path().is_file(), (fam.name, kind)
            assert cls.template_path().parent == Path(sys.modules[cls.__module__].__file__).parent


# ── the toy kind, registered from a temporary module through the public API only ────────────────────────────────

_CHILD = textwrap.dedent('''
    import sys
    sys.path.insert(0, sys.argv[1])
    import relu2_ffn  # registers the kind: nothing else is patched

    import jsonschema, torch
    from hypothesis import find
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    from archspec import testing as T
    from archspec.accounting import account
    from archspec.codegen import generate
    from archspec.spec import json_schema, known_keys, load_spec_dict
    from archspec.registry.query import resolve_field

    raw = {"name": "toy", "model": {"vocab_size": 53, "context_length": 12, "d_model": 24, "n_layers": 2,
           "attention": {"n_heads": 4, "n_kv_heads": 2}, "ffn": {"kind": "relu2", "hidden_dim": 40, "gain": 1.5}}}
    spec = load_spec_dict(raw)
    gen = generate(spec, out_dir=sys.argv[2])
    model = gen.Model()
    acc = account(spec)
    assert acc.total == sum(p.numel() for p in model.parameters()), (acc.total, "numel")
    assert acc.by_component["ffn"] == sum(p.numel() for n, p in model.named_parameters() if ".ffn." in n)
    T.assert_causal(model, 53, 12, position=5)
    idx = torch.randint(0, 53, (1, 12))
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), counter:
        model(idx)
    full = account(spec, full_attention=True).flops_forward * 12
    assert abs(counter.get_total_flops() - full) <= 0.01 * full, (counter.get_total_flops(), full)
    assert "RELU2_GAIN = 1.5" in gen.source

    from archspec.ablate.report import RunResult, VariantResult, table_rows
    from archspec.kinds import metric_kinds
    toy = relu2_ffn.SquaredReLUSpec
    assert toy in metric_kinds() and metric_kinds(type(u) for u in spec.model.units()) == [toy]
    with torch.no_grad():
        model(idx)
    metrics = toy.eval_metrics(toy.eval_stats(model))                   # its metrics, as the loop records them
    assert list(metrics) == ["relu2.active"] and 0 < metrics["relu2.active"] <= 1
    runs = [RunResult("r", 0, "FINISHED", 3.0, None, [], 1, {"val_loss": 3.0, **metrics})]
    rows = table_rows([VariantResult(0, "", {}, 1, 1, 1, 1, runs)], 0)   # and the ablation table shows them
    assert rows[0]["active units"].startswith("active=")

    jsonschema.validate(raw, json_schema())                              # the schema knows it
    assert "model.ffn.gain" in known_keys()                              # registry filters may name its fields
    assert resolve_field("params.model.ffn.gain", "runs").kind == "param"
    base = dict(raw, model={k: v for k, v in raw["model"].items() if k != "ffn"})
    over = load_spec_dict(base, ["model.ffn.kind=relu2", "model.ffn.gain=3"])   # --set reaches it
    assert over.model.ffn.kind == "relu2" and over.model.ffn.gain == 3.0
    assert "relu2" in T.FFN_KINDS                                        # the strategies draw it
    drawn = find(T.valid_specs(ffn_kinds=["relu2"]), lambda s: s.model.ffn.kind == "relu2" and s.model.ffn.gain != 1)
    assert account(drawn).total == sum(p.numel() for p in generate(drawn, out_dir=sys.argv[2]).Model().parameters())
    print("OK")
''')


def test_a_kind_registered_from_a_temporary_module_works_everywhere(tmp_path):
    plugin = tmp_path / "plugin"
    shutil.copytree(TOY, plugin)
    out = subprocess.run([sys.executable, "-c", _CHILD, str(plugin), str(tmp_path / "gen")], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stderr[-3000:]


def test_registration_refuses_a_kind_without_a_template_or_a_family():
    from typing import Literal

    from archspec.kinds import FFNKind, Strict, register

    class NoTemplate(FFNKind):
        kind: Literal["no-template"] = "no-template"

    with pytest.raises(FileNotFoundError, match="no template"):
        register(NoTemplate)

    class NotAKind(Strict):
        kind: Literal["x"] = "x"

    with pytest.raises(TypeError, match="must subclass"):
        register(NotAKind)
    assert "no-template" not in families()["ffn"].members


# ── the two real kinds added through the units ───────────────────────────────────────────────────────────────────


def test_gelu_tanh_is_the_tanh_approximation(tmp_path):
    """GPT-2's gelu_new, written here from its formula, not from torch's `approximate="tanh"`."""
    spec = _spec(ffn={"kind": "mlp", "activation": "gelu_tanh", "hidden_dim": 48, "bias": True})
    torch.manual_seed(0)
    ffn = generate(spec, out_dir=tmp_path).module.FeedForward()
    x = torch.randn(2, 5, 32)
    h = ffn.up_proj(x)
    gelu_new = 0.5 * h * (1.0 + torch.tanh((2.0 / torch.pi) ** 0.5 * (h + 0.044715 * h.pow(3))))
    torch.testing.assert_close(ffn(x), ffn.down_proj(gelu_new), atol=1e-6, rtol=1e-5)
    assert not torch.allclose(ffn(x), ffn.down_proj(F.gelu(h)), atol=1e-7)  # not the erf GELU


@pytest.mark.parametrize("bias,qkv,out", [(True, None, None), (False, True, False), (True, None, False),
                                          (False, None, True)])
def test_separate_qkv_and_output_bias(bias, qkv, out, tmp_path):
    att = {"bias": bias, **({"qkv_bias": qkv} if qkv is not None else {}), **({"out_bias": out} if out is not None else {})}
    spec = _spec(attention=att)
    want_qkv = bias if qkv is None else qkv
    want_out = bias if out is None else out
    a = spec.model.attention
    assert (a.qkv_bias, a.out_bias, a.bias) == (want_qkv, want_out, want_qkv and want_out)
    model = generate(spec, out_dir=tmp_path).Model()
    attn = model.blocks[0].attn
    assert (attn.qkv_proj.bias is not None, attn.o_proj.bias is not None) == (want_qkv, want_out)
    assert account(spec).total == sum(p.numel() for p in model.parameters())


def test_one_bias_flag_and_two_flags_are_one_model():
    assert model_hash(_spec(attention={"bias": True})) == model_hash(_spec(attention={"qkv_bias": True, "out_bias": True}))
    assert model_hash(_spec(attention={"bias": True})) != model_hash(_spec(attention={"qkv_bias": True}))


def test_rope_tables_stay_fp32_when_the_model_is_cast_to_bf16(tmp_path):
    model = generate(_spec(), out_dir=tmp_path).Model()
    cos32 = model.rope.cos.clone()
    model = model.to(torch.bfloat16)
    assert model.rope.cos.dtype == torch.float32 and torch.equal(model.rope.cos, cos32)
    assert model.tok_emb.weight.dtype == torch.bfloat16
    logits = model(torch.randint(0, 61, (1, 8)))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()


def test_each_module_initialises_its_own_parameters(tmp_path):
    """GPT-2 init from the modules themselves: residual projections scaled, biases zero, norm gains one."""
    spec = _spec(n_layers=8, d_model=64, attention={"bias": True},
                 ffn={"kind": "mlp", "hidden_dim": 1024, "bias": True}, norm={"kind": "layernorm"})
    torch.manual_seed(0)
    model = generate(spec, out_dir=tmp_path).Model()
    block = model.blocks[3]
    resid = 0.02 / (2 * 8) ** 0.5
    assert abs(block.ffn.down_proj.weight.std().item() - resid) < 0.1 * resid
    assert abs(block.ffn.up_proj.weight.std().item() - 0.02) < 0.1 * 0.02
    assert abs(block.attn.o_proj.weight.std().item() - resid) < 0.15 * resid
    assert block.attn.qkv_proj.bias.abs().max() == 0 and block.ffn.up_proj.bias.abs().max() == 0
    assert torch.equal(block.attn_norm.weight, torch.ones(64)) and torch.equal(block.attn_norm.bias, torch.zeros(64))


# ── the JSON Schema accepts exactly what archspec accepts ────────────────────────────────────────────────────────

_VALIDATOR = jsonschema.Draft202012Validator(json_schema())


@pytest.mark.parametrize("path", sorted((ROOT / "specs").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_preset_validates_against_the_schema(path):
    _VALIDATOR.validate(yaml.safe_load(path.read_text()))


@settings(max_examples=40, deadline=None)
@given(T.spec_dicts())
def test_every_drawn_spec_validates_against_the_schema(raw):
    errors = [e.message for e in _VALIDATOR.iter_errors(raw)]
    assert not errors, errors


@pytest.mark.parametrize("model", [
    {"norm": {"bias": True}},                     # omitted kind means rmsnorm, which has no bias
    {"ffn": {"activation": "gelu_fast"}},
    {"attention": {"qkv_bias": 1}},
    {"attention": {"positional": {"kind": "wobble"}}},  # no such kind (alibi, the example before, is one now)
])
def test_the_schema_refuses_what_archspec_refuses(model):
    raw = {"name": "bad", "model": model}
    assert list(_VALIDATOR.iter_errors(raw))
    with pytest.raises(Exception):
        load_spec_dict(raw)


def test_each_activation_is_one_record_and_the_tables_agree_with_it():
    """Adding an activation is one `Activation` entry: the literals, calls, names and HF maps are derived from it."""
    from typing import get_args

    from archspec.kinds.ffn import activations as A

    names = [a.name for a in A.ACTIVATIONS]
    assert list(get_args(A.ActivationName)) == names
    assert list(get_args(A.MLPActivation)) == [a.name for a in A.ACTIVATIONS if a.mlp_name is not None]
    for a in A.ACTIVATIONS:
        assert A.call(a.name, "x") == a.expr.format("x") and "{}" in a.expr
        assert A.FROM_HF[A.TO_HF[a.name]] == a.name  # export then import is lossless
        assert all(A.FROM_HF[hf] == a.name for hf in a.hf_names)
    assert len(set(A.GLU_NAMES.values())) == len(names) and len(set(A.MLP_NAMES.values())) == len(A.MLP_NAMES)
