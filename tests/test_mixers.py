"""The token mixer is the unit (issue 43): attention kinds and the short causal convolution (LFM2's gated short conv)
are mixer kinds that answer the same contract (params, FLOPs, decoding-state bytes, saved bytes); a layer chooses
its mixer as it chooses any part; a conv layer holds no positions, no pattern, no `attn`.

Every figure the accounting gives for a mixer is checked against the generated module (numel, the cache's nbytes,
FlopCounterMode); cached decoding against the full forward; hashes of spellings against each other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from archspec.accounting import account, kv_cache_bytes
from archspec.cli import main
from archspec.codegen import generate
from archspec.kinds import MixerKind, families
from archspec.memory import block_saved_per_token
from archspec.spec import SpecError, load_spec_dict, model_hash, model_json
from archspec.testing.assertions import (assert_greedy_generation_is_argmax_of_full_forwards,
                                         assert_rollback_matches_full_forward)

ROOT = Path(__file__).resolve().parent.parent
BASE = {"vocab_size": 61, "context_length": 24, "d_model": 32, "n_layers": 4}
CONV = {"kind": "short_conv", "L_cache": 3}
CONV_ONLY = {**BASE, "mixer": CONV}
HYBRID = {**BASE, "attention": {"n_heads": 4, "n_kv_heads": 2},
          "layers": {"conv": {"select": [0, 1, 3], "mixer": CONV}}}
HYBRID_TWO_CONVS = {**BASE, "attention": {"n_heads": 4, "n_kv_heads": 2},
                    "layers": {"conv": {"select": [0, 1], "mixer": CONV},
                               "wide": {"select": [3], "mixer": {"kind": "short_conv", "L_cache": 5}}}}
CASES = {"conv-only": CONV_ONLY, "hybrid": HYBRID, "hybrid-two-convs": HYBRID_TWO_CONVS}


def _spec(model: dict, name: str = "mix"):
    return load_spec_dict({"name": name, "model": model})


def _model(model: dict, seed: int = 0):
    spec = _spec(model)
    torch.manual_seed(seed)
    return spec, generate(spec, write=False).Model().eval()


# ── the contract ─────────────────────────────────────────────────────────────────────────────────────────────────


def test_every_mixer_kind_answers_the_contract_and_a_kind_missing_a_member_cannot_exist():
    kinds = [cls for name in ("attention", "mixer") for cls in families()[name].members.values()]
    assert {"gqa", "mla", "short_conv"} <= {cls.model_fields["kind"].default for cls in kinds}
    assert all(issubclass(cls, MixerKind) and not cls.__abstractmethods__ for cls in kinds)

    class Half(MixerKind):  # declares some of the contract only
        def mixer_params(self, m):
            return 0

    with pytest.raises(TypeError, match="abstract"):
        Half()


@pytest.mark.parametrize("case", list(CASES))
def test_params_and_state_bytes_equal_the_generated_module(case):
    spec, model = _model(CASES[case])
    acc = account(spec)
    named = dict(model.named_parameters())
    assert acc.total == sum(p.numel() for p in model.parameters())
    assert acc.by_component["conv"] == sum(p.numel() for n, p in named.items() if ".conv." in n)
    assert acc.by_component.get("attention", 0) == sum(p.numel() for n, p in named.items() if ".attn." in n)
    assert ("attention" in acc.by_component) == any(b.token_mixer is b.attention for b in spec.model.blocks())
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        for T in (1, 7, spec.model.context_length):
            cache = model.new_cache(2, T, dtype=dtype)
            assert sum(c.nbytes for c in cache) == kv_cache_bytes(spec.model, T, name, 2)
    # a conv layer's state does not grow with the context; an attention layer's does
    conv_layers = [b for b in spec.model.blocks() if b.token_mixer is not b.attention]
    assert all(b.token_mixer.state_bytes_per_token(spec.model, 2) == 0 for b in conv_layers)
    assert acc.kv_cache_bytes_per_token == sum(b.attention.kv_cache_elements_per_token() * 2
                                               for b in spec.model.blocks() if b.token_mixer is b.attention)


@pytest.mark.parametrize("case", list(CASES))
def test_forward_flops_match_flop_counter(case):
    spec, model = _model(CASES[case])
    T = spec.model.context_length
    counter = FlopCounterMode(display=False)
    idx = torch.randint(0, spec.model.vocab_size, (1, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH), counter:
        model(idx)
    expected = account(spec, full_attention=True).flops_forward * T
    assert abs(counter.get_total_flops() - expected) <= 0.01 * expected
    assert account(spec).flops_by_component["conv"] > 0


def test_memory_plan_reads_the_mixer_through_the_contract():
    spec = _spec(HYBRID)
    m = spec.model
    for b in m.blocks():
        other = b.token_mixer.saved_bytes(m, 24, 4, "cpu")
        whole = block_saved_per_token(m, 24, "cpu", False, b)
        assert whole - other == block_saved_per_token(m, 24, "cpu", False, b) - b.token_mixer.saved_bytes(m, 24, 4, "cpu")
    conv, att = (next(b for b in m.blocks() if (b.token_mixer is b.attention) is want) for want in (False, True))
    assert conv.token_mixer.saved_bytes(m, 24, 4, "cpu") != att.token_mixer.saved_bytes(m, 24, 4, "cpu")
    # the two blocks differ by exactly what their mixers say they keep
    assert (block_saved_per_token(m, 24, "cpu", False, conv) - block_saved_per_token(m, 24, "cpu", False, att)
            == conv.token_mixer.saved_bytes(m, 24, 4, "cpu") - att.token_mixer.saved_bytes(m, 24, 4, "cpu"))


def test_dry_run_memory_plan_reaches_the_mixer_through_the_contract(tmp_path, capsys, monkeypatch):
    """`train --dry-run`'s activations move by exactly what the conv mixer says it keeps, in every layer and token."""
    from archspec.kinds.mixer import ShortConvSpec

    spec = tmp_path / "c.yaml"
    batch, seq = 2, 16
    spec.write_text(json.dumps({"name": "c", "model": {**CONV_ONLY, "vocab_size": 300},
                                "train": {"batch_size": batch, "seq_len": seq, "precision": "fp32"}}))

    def saved() -> int:
        assert main(["train", str(spec), "--dry-run", "--json", "--registry", f"sqlite:///{tmp_path}/r.db"]) == 0
        return json.loads(capsys.readouterr().out)["activations (saved)"]

    before = saved()
    original = ShortConvSpec.saved_bytes
    monkeypatch.setattr(ShortConvSpec, "saved_bytes", lambda self, *a: original(self, *a) + 1000)
    assert saved() - before == 1000 * batch * seq * CONV_ONLY["n_layers"]


@pytest.mark.parametrize("case", list(CASES))
def test_build_reports_each_mixer_under_its_own_column(case, tmp_path, capsys):
    path = tmp_path / "m.yaml"
    model = {**CASES[case], "vocab_size": 320}  # the default recipe's byte tokenizer needs 257 ids
    path.write_text(json.dumps({"name": "m", "model": model}))
    assert main(["build", str(path), "--out", str(tmp_path), "--no-record"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "│ conv " in out and ("keys per" in out) == (case != "conv-only")
    assert main(["build", str(path), "--out", str(tmp_path), "--no-record", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    acc = account(_spec(model))
    assert data["params"]["by_component"]["conv"] == acc.by_component["conv"] > 0
    assert data["kv_cache_bytes_per_token"] == acc.kv_cache_bytes_per_token


_PLUGIN_CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
import token_shift_mixer  # registers the kind: nothing else is patched

import torch
from archspec.accounting import account, kv_cache_bytes
from archspec.codegen import generate
from archspec.spec import load_spec_dict, model_hash

base = {"vocab_size": 53, "context_length": 12, "d_model": 16, "n_layers": 3, "attention": {"n_heads": 2}}
plain = load_spec_dict({"name": "p", "model": base})
assert plain.model.mixer is None                                    # null still means attention after the rebuild
for model in ({**base, "layers": {"s": {"select": [1], "mixer": {"kind": "token_shift"}}}},
              {k: v for k, v in base.items() if k != "attention"} | {"mixer": {"kind": "token_shift"}}):
    spec = load_spec_dict({"name": "t", "model": model})
    gen = generate(spec, out_dir=sys.argv[2])
    net = gen.Model().eval()
    acc = account(spec)
    assert acc.total == sum(p.numel() for p in net.parameters())
    assert acc.by_component["shift"] == sum(p.numel() for n, p in net.named_parameters() if ".shift." in n)
    assert "class TokenShift(nn.Module)" in gen.source
    idx = torch.randint(0, 53, (2, 12))
    with torch.no_grad():
        full = net(idx)
        cache = net.new_cache(2, 12, dtype=torch.float32)
        assert sum(c.nbytes for c in cache) == kv_cache_bytes(spec.model, 12, "fp32", 2)
        steps = [net(idx[:, :5], cache=cache)] + [net(idx[:, t:t + 1], cache=cache) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
print("OK")
"""


def test_a_mixer_kind_registered_from_outside_works_with_its_own_folder_only(tmp_path):
    """A toy mixer (tests/kinds_toy/token_shift_mixer.py, its template beside it) registered late: the spec takes it in
    model.mixer and in a layer group, codegen, accounting and decoding reach it through the contract alone."""
    import shutil
    import subprocess
    import sys

    plugin = tmp_path / "plugin"
    shutil.copytree(ROOT / "tests" / "kinds_toy", plugin)
    out = subprocess.run([sys.executable, "-c", _PLUGIN_CHILD, str(plugin), str(tmp_path / "gen")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stderr[-3000:]


# ── generation: the conv state ───────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("case", list(CASES))
def test_cached_decoding_equals_the_full_forward(case):
    spec, model = _model(CASES[case], seed=1)
    idx = torch.randint(0, spec.model.vocab_size, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, 24, dtype=torch.float32)
        steps = [model(idx[:, :6], cache=cache), model(idx[:, 6:9], cache=cache)]  # a prefill, then a chunk
        steps += [model(idx[:, t : t + 1], cache=cache) for t in range(9, 20)]  # then one position at a time
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    assert all(c.length == 20 for c in cache)


def test_the_conv_state_takes_back_rejected_positions():
    assert_rollback_matches_full_forward(_model(CONV_ONLY, seed=3)[1], 61)


def test_greedy_generation_of_a_hybrid_equals_argmax_of_full_forwards():
    assert_greedy_generation_is_argmax_of_full_forwards(_model(HYBRID, seed=5)[1], 61)


@pytest.mark.parametrize("k", [1, 3])
def test_speculative_decoding_through_conv_states_is_the_target_greedy(k):
    """A hybrid target with a conv-only draft: each round truncates both models' states to the tokens kept (a conv
    state takes back rejected drafts), and the output is token for token the target's greedy output."""
    from archspec.sample import SpeculativeStats, speculative_stream

    # untied: tied random models both predict their input token back, and would agree on everything
    _, target = _model({**HYBRID, "tie_embeddings": False}, seed=8)
    _, draft = _model({**CONV_ONLY, "tie_embeddings": False}, seed=9)
    prompt = torch.randint(0, 61, (1, 5), generator=torch.Generator().manual_seed(10))
    stats = SpeculativeStats()
    got = list(speculative_stream(target, draft, prompt, 14, k=k, stats=stats))
    assert got == target.generate(prompt, max_new_tokens=14, temperature=0)[0, 5:].tolist()
    assert stats.drafted > stats.accepted  # drafts were rejected, so states were taken back


# ── the generated file ───────────────────────────────────────────────────────────────────────────────────────────


def test_a_conv_layer_is_never_called_attention_and_keys_keep_attn_for_attention():
    spec = _spec(HYBRID_TWO_CONVS)
    g = generate(spec, write=False)
    src = g.source
    assert "class ShortConv(nn.Module)" in src and src.count("class ShortConv(") == 1  # one class, two configurations
    assert "class ShortConvBlock(" in src and "class AttentionBlock(" in src
    block = src[src.index("class ShortConvBlock("):src.index("class AttentionBlock(")]
    assert "attn" not in block and "conv_norm" in block  # its norms are named after its mixer too
    assert "cos" not in block.split("def forward")[1].split("self.conv(")[1].split(")")[0]  # no positions reach it
    keys = list(g.Model().state_dict())
    assert "blocks.0.conv.in_proj.weight" in keys and "blocks.2.attn.qkv_proj.weight" in keys
    assert not any(k.startswith("blocks.2.conv.") or k.startswith("blocks.0.attn.") for k in keys)
    conv_only = generate(_spec(CONV_ONLY), write=False).source
    assert "attn" not in conv_only and "Attention" not in conv_only and "KVCache" not in conv_only
    assert "apply_rope" not in conv_only and "cos" not in conv_only  # no positions at all
    assert "── short convolution" in conv_only


# ── spelling and identity ────────────────────────────────────────────────────────────────────────────────────────


def test_spellings_of_one_model_hash_alike():
    explicit_null = _spec({**HYBRID, "mixer": None})
    assert model_hash(explicit_null) == model_hash(_spec(HYBRID))
    as_range = _spec({**HYBRID, "layers": {"c": {"select": [0, 1, 3], "mixer": {"kind": "short_conv"}}}})  # default L
    assert model_hash(as_range) == model_hash(_spec(HYBRID))
    # a conv-only model: no attention, so no attention rule applies (8 default heads do not divide 36)
    assert _spec({**CONV_ONLY, "d_model": 36}).model.d_model == 36
    # a conv-only model: no attention and no positions in its identity
    canon = json.loads(model_json(_spec(CONV_ONLY)))
    assert "attention" not in canon and canon["mixer"] == {"kind": "short_conv", "L_cache": 3, "bias": False}
    # a canonical form reloads to itself
    for case in CASES.values():
        spec = _spec(case)
        again = _spec(json.loads(model_json(spec)))
        assert model_hash(again) == model_hash(spec)
        assert [b.token_mixer.kind for b in again.model.blocks()] == [b.token_mixer.kind for b in spec.model.blocks()]


def test_pure_attention_specs_keep_their_canonical_form():
    """No mixer field, no `mixer_n` group: what every spec written before mixers were a unit hashes over."""
    for path in sorted((ROOT / "specs").glob("*.yaml")):
        from archspec.spec import load_spec

        spec = load_spec(path)
        if all(b.token_mixer is b.attention for b in spec.model.blocks()):
            assert '"mixer"' not in model_json(spec), path.name


@settings(max_examples=15, deadline=None)
@given(layers=st.lists(st.booleans(), min_size=2, max_size=5).filter(lambda ls: any(ls) and not all(ls)),
       L=st.integers(2, 6))
def test_any_conv_attention_pattern_builds_counts_and_round_trips(layers, L):
    model = {**BASE, "n_layers": len(layers), "attention": {"n_heads": 2},
             "layers": {"c": {"select": [i for i, conv in enumerate(layers) if conv], "mixer": {**CONV, "L_cache": L}}}}
    spec = _spec(model)
    assert [b.token_mixer is not b.attention for b in spec.model.blocks()] == layers
    assert model_hash(_spec(json.loads(model_json(spec)))) == model_hash(spec)
    assert account(spec).total == sum(p.numel() for p in generate(spec, write=False).Model().parameters())


# ── bad input: exit 2, one line naming the field ─────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("model,field", [
    ({**BASE, "mixer": {**CONV, "positional": {"kind": "rope"}}}, "model.mixer.positional"),
    ({**BASE, "mixer": {**CONV, "sparsity": {"kind": "dense"}}}, "model.mixer.sparsity"),
    ({**BASE, "mixer": {**CONV, "L_cache": 1}}, "model.mixer.L_cache"),
    ({**BASE, "mixer": {"kind": "mamba"}}, "model.mixer"),
    ({**HYBRID, "layers": {"c": {"select": [0], "mixer": {"kind": "mamba"}}}}, "model.layers.c.mixer"),
    ({**HYBRID, "layers": {"c": {"select": [0], "mixer": {**CONV, "L_cache": 0}}}}, "model.layers.c.mixer.L_cache"),
    ({**CONV_ONLY, "attention": {"n_heads": 4}}, "model.attention"),
    ({**HYBRID, "layers": {**HYBRID["layers"], "a": {"select": [1], "attention": {"n_kv_heads": 1}}}},
     "model.layers.a.attention"),
    ({**BASE, "attention": {"n_heads": 4}, "layers": {"c": {"select": {"start": 0}, "mixer": CONV}}},
     "model.layers.c.mixer"),
    ({**HYBRID, "layers": {**HYBRID["layers"], "nope": {"select": [2], "attention": {"positional": {"kind": "none"}}}}},
     "model.layers.nope.attention.positional"),
], ids=["positional-under-conv", "sparsity-under-conv", "L_cache-1", "unknown-kind", "unknown-kind-in-group",
        "L_cache-0-in-group", "attention-beside-conv-only", "attention-on-conv-layers", "every-layer-by-group",
        "positions-off-in-every-attending-layer"])
def test_bad_mixer_input_exits_2_naming_the_field(model, field, tmp_path, capsys):
    with pytest.raises(SpecError) as err:
        _spec(model)
    assert any(line.startswith(field) for line in err.value.problems), err.value.problems
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps({"name": "bad", "model": model}))
    assert main(["build", str(path), "--out", str(tmp_path), "--no-record"]) == 2
    err_text = capsys.readouterr().err
    assert field in err_text and "Traceback" not in err_text


def test_registry_filters_know_the_canonical_mixer_groups():
    from archspec.spec import is_known_key

    assert is_known_key("model.mixer.L_cache") and is_known_key("model.layers.mixer_1.mixer.L_cache")
    assert is_known_key("model.layers.mixer_2.select.start") and not is_known_key("model.layers.mixer_1.mixer.nope")


def test_tensor_parallelism_is_refused_for_a_mixer_without_a_plan_naming_its_group():
    """The TP plan places each layer's mixer by its own attribute and plan: the conv has none, and says where."""
    from archspec.spec.parallel_plan import model_plan

    with pytest.raises(SpecError) as err:
        _spec_with_train({**HYBRID, "vocab_size": 320}, {"parallel": {"kind": "fsdp", "tp": 2}})
    assert any("model.layers.conv.mixer" in p and "short_conv" in p for p in err.value.problems), err.value.problems
    spec = _spec(HYBRID)
    where: dict[str, list] = {}
    for p in model_plan(spec.model):
        where.setdefault(p.module, []).append(p.unit)
    assert [u.kind for u in where["blocks.0.conv"]] == ["short_conv"] and "blocks.0.attn" not in where
    assert where["blocks.2.attn"][0] is spec.model.blocks()[2].attention and "blocks.0.conv_norm" in where


def _spec_with_train(model: dict, train: dict):
    return load_spec_dict({"name": "mix", "model": model, "train": train})


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_drawn_models_with_drawn_mixers_count_decode_and_round_trip(data):
    """Any drawn model (norms, FFN kinds, block shapes, µP, caps, ...) with a drawn mixer pattern (the strategies read
    the mixer family from the registry): exact params and state bytes, cached decoding equal to the full forward,
    and a canonical form that reloads to the same hash."""
    from archspec import testing as T

    model = data.draw(T.model_dicts(max_layers=3, max_context=16, per_layer=False))
    pattern = data.draw(T.mixer_patterns(model["n_layers"], model["d_model"], model["context_length"]))
    if "mixer" in pattern:
        model.pop("attention")  # no layer attends: the model has none
    spec = _spec({**model, **pattern})
    assert model_hash(_spec(json.loads(model_json(spec)))) == model_hash(spec)
    torch.manual_seed(0)
    net = generate(spec, write=False).Model().eval()
    assert account(spec).total == sum(p.numel() for p in net.parameters())
    if any(getattr(b.ffn, "capacity_factor", None) is not None for b in spec.model.blocks()):
        return  # a capacity-limited MoE drops by how many tokens a call holds: decoding step by step drops fewer
    T_ = min(spec.model.context_length, 9)
    idx = torch.randint(0, spec.model.vocab_size, (1, T_), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = net(idx)
        cache = net.new_cache(1, T_, dtype=torch.float32)
        assert sum(c.nbytes for c in cache) == kv_cache_bytes(spec.model, T_, "fp32", 1)
        steps = [net(idx[:, : T_ // 2], cache=cache)] if T_ > 1 else []
        steps += [net(idx[:, t : t + 1], cache=cache) for t in range(T_ // 2 if T_ > 1 else 0, T_)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-4, rtol=1e-4)


def test_the_errors_docs_mixers_quotes_are_the_ones_given():
    """docs/mixers.md quotes three refusals; each is what loading the spec says (it quoted pydantic's bare 'Extra inputs
    are not permitted', which no path printed)."""
    import re
    from pathlib import Path

    from archspec.spec import SpecError, load_spec_dict

    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "mixers.md").read_text().split())
    base = {"vocab_size": 64, "context_length": 16, "d_model": 32, "n_layers": 2}
    cases = {
        "model.mixer.positional": {**base, "mixer": {"kind": "short_conv", "positional": {"kind": "rope"}}},
        "model.layers.g.mixer": {**base, "attention": {"n_heads": 4},
                                 "layers": {"g": {"select": [0], "mixer": {"kind": "mamba"}}}},
        "model.mixer": {**base, "mixer": "short_conv"},
    }
    for path, model in cases.items():
        quoted = re.search(rf"`({re.escape(path)}: [^`]*)`", text)
        assert quoted, path
        with pytest.raises(SpecError) as e:
            load_spec_dict({"name": "t", "model": model})
        assert any(p.startswith(quoted.group(1)) for p in e.value.problems), (quoted.group(1), e.value.problems)


@pytest.mark.parametrize("where", ["model.mixer", "a layer group's mixer", "--set model.mixer"])
def test_a_mixer_must_name_its_kind(where):
    """The token mixers have no default kind (a conv, a linear attention and a state-space layer are not spellings of
    one thing): a mixer without `kind`, wherever it arrives, is refused naming the field and the kinds."""
    if where == "model.mixer":
        data, overrides, path = {**BASE, "mixer": {"L_cache": 3}}, (), "model.mixer"
    elif where == "--set model.mixer":
        data, overrides, path = dict(BASE), ("model.mixer={}",), "model.mixer"
    else:
        data = {**BASE, "attention": {"n_heads": 4}, "layers": {"c": {"select": [0], "mixer": {"L_cache": 3}}}}
        overrides, path = (), "model.layers.c.mixer"
    with pytest.raises(SpecError) as info:
        load_spec_dict({"name": "t", "model": data}, overrides)
    line = info.value.render()
    assert len(line.splitlines()) == 1
    assert f"{path}: kind is required: must be one of " in line and "'short_conv'" in line
