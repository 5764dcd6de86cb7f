"""Multi-token prediction (DeepSeek-V3 §2.2, model.mtp): the spec field and its refusals, the generated MTPModule and
its losses, accounting that separates the main model from the modules, the loop's weighting, HF deepseek_v3's MTP
weights both ways, and self-speculative decoding with the model's own MTP modules (`sample --draft mtp`)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from archspec.accounting import account, mtp_breakdown
from archspec.codegen import generate
from archspec.errors import UserError
from archspec.spec import load_spec_dict, model_hash
from archspec.spec.model import MAX_MTP_DEPTH

BASE = {
    "name": "mtp-test",
    "model": {"vocab_size": 320, "context_length": 32, "d_model": 32, "n_layers": 2,
              "attention": {"n_heads": 4, "n_kv_heads": 2}, "ffn": {"kind": "glu", "activation": "silu", "hidden_dim": 64}},
    "train": {"seq_len": 32, "batch_size": 2},
}


def _spec(mtp=None, **model):
    data = copy.deepcopy(BASE)
    data["model"].update(model)
    if mtp is not None:
        data["model"]["mtp"] = mtp
    return load_spec_dict(data)


def _model(spec, seed: int = 0):
    torch.manual_seed(seed)
    return generate(spec, write=False).Model()


# ── the spec field ──────────────────────────────────────────────────────────────────────────────────────────────


def test_no_mtp_keeps_the_hash_and_mtp_is_part_of_it():
    plain = _spec()
    assert model_hash(_spec(None)) == model_hash(plain)
    written_null = copy.deepcopy(BASE)
    written_null["model"]["mtp"] = None
    assert model_hash(load_spec_dict(written_null)) == model_hash(plain)  # Since: null written = left out
    one = _spec({"depth": 1, "weight": 0.3})
    assert model_hash(one) != model_hash(plain)
    assert model_hash(_spec({"depth": 1})) == model_hash(one)  # the default weight written or not
    assert model_hash(_spec({"depth": 2})) != model_hash(one)
    assert model_hash(_spec({"depth": 1, "weight": 0.1})) != model_hash(one)


@pytest.mark.parametrize("mtp, field", [
    ({"depth": 0}, "model.mtp.depth"), ({"depth": -1}, "model.mtp.depth"), ({"depth": 10**6}, "model.mtp.depth"),
    ({"depth": 32}, "model.mtp.depth"),  # = train.seq_len: no target that far ahead
    ({"depth": "two"}, "model.mtp.depth"), ({"depth": True}, "model.mtp.depth"),
    ({"weight": -0.1}, "model.mtp.weight"), ({"weight": float("nan")}, "model.mtp.weight"),
    ({"weight": float("inf")}, "model.mtp.weight"), ({"weight": 1e9}, "model.mtp.weight"),
    ({"depth": 1, "lambda": 0.3}, "model.mtp.lambda"),
])
def test_bad_mtp_settings_are_refused_naming_the_field(mtp, field):
    with pytest.raises(UserError) as e:
        _spec(mtp)
    assert field in e.value.render()


@settings(max_examples=25, deadline=None)
@given(depth=st.integers(-10**9, 10**9), weight=st.floats(allow_nan=True, allow_infinity=True))
@example(depth=MAX_MTP_DEPTH, weight=0.0)
@example(depth=MAX_MTP_DEPTH + 1, weight=0.0)
def test_any_depth_and_weight_validates_or_is_refused_by_name(depth, weight):
    try:
        spec = _spec({"depth": depth, "weight": weight})
    except UserError as e:
        ok_depth = 1 <= depth <= MAX_MTP_DEPTH
        ok_weight = math.isfinite(weight) and 0 <= weight <= 100
        assert not (ok_depth and ok_weight)
        assert ("model.mtp.depth" in e.render()) or ("model.mtp.weight" in e.render())
        return
    assert 1 <= spec.model.mtp.depth <= MAX_MTP_DEPTH and 0 <= spec.model.mtp.weight <= 100


@pytest.mark.parametrize("train, field", [({"parallel": {"tp": 2}}, "train.parallel.tp"),
                                          ({"parallel": {"pp": 2}}, "train.parallel.pp")])
def test_split_models_are_refused_with_the_reason(train, field):
    data = copy.deepcopy(BASE)
    data["model"]["mtp"] = {"depth": 1}
    data["train"].update(train)
    with pytest.raises(UserError) as e:
        load_spec_dict(data)
    assert "model.mtp" in e.value.render() and field in e.value.render()


# ── the generated module and its losses ─────────────────────────────────────────────────────────────────────────


def test_generated_file_reads_as_mtp_modules_and_only_with_mtp():
    plain = generate(_spec(), write=False).source
    assert "MTPModule" not in plain and "self.mtp" not in plain and "auxiliary_weights" not in plain
    source = generate(_spec({"depth": 2}), write=False).source
    assert "class MTPModule(nn.Module):" in source
    assert "MTP_DEPTH = 2" in source
    assert "for k in range(1, MTP_DEPTH + 1):" in source and "def mtp_forward(" in source


def test_state_dict_keys_of_the_main_model_are_unchanged():
    plain = set(_model(_spec()).state_dict())
    with_mtp = set(_model(_spec({"depth": 2})).state_dict())
    assert plain <= with_mtp
    assert {k.split(".")[0] for k in with_mtp - plain} == {"mtp"}
    assert {k.split(".")[1] for k in with_mtp - plain} == {"0", "1"}


def _reference_losses(model, idx, targets):
    """DeepSeek-V3 §2.2 written out independently: h⁰ = the main model's normed last hidden state; depth k:
    h^k_i = Block(W [RMSNorm(Emb(t_{i+k})); RMSNorm(h^{k-1}_i)]) over i < T - k, P^k_{i+k+1} = Head(h^k_i)."""
    T = idx.size(1)
    seq = torch.cat([idx, targets[:, -1:]], dim=1)  # t_0 .. t_T
    h = model.final_norm(model.hidden_states(idx))
    out = []
    for k, module in enumerate(model.mtp, start=1):
        n = T - k
        emb = model.tok_emb(seq[:, k : k + n])
        x = module.proj(torch.cat([module.embed_norm(emb), module.hidden_norm(h[:, :n])], dim=-1))
        cos, sin = model.rope(n, 0)
        h = module.block(x, cos, sin)
        logits = model.lm_head(module.norm(h))
        out.append(F.cross_entropy(logits.flatten(0, 1), seq[:, k + 1 : k + 1 + n].flatten()))
    return out


def test_each_depth_predicts_the_token_k_plus_one_ahead():
    model = _model(_spec({"depth": 3, "weight": 0.5})).train()
    g = torch.Generator().manual_seed(1)
    window = torch.randint(0, 320, (2, 17), generator=g)
    idx, targets = window[:, :-1], window[:, 1:]
    _, main = model(idx, targets)
    aux = model.auxiliary_losses()
    assert sorted(aux) == ["mtp_loss_1", "mtp_loss_2", "mtp_loss_3"]
    for got, want in zip((aux[f"mtp_loss_{k}"] for k in (1, 2, 3)), _reference_losses(model, idx, targets)):
        torch.testing.assert_close(got, want)
    assert model.auxiliary_weights() == {f"mtp_loss_{k}": 0.5 / 3 for k in (1, 2, 3)}
    # depth k's loss reads no target beyond the window: changing the last target moves every depth's loss, and
    # depth k never sees tokens past targets[:, -1] (it has T - k positions)
    model.eval()
    assert model(idx).shape == (2, 16, 320)  # inference: the main model alone


def test_inference_output_is_the_main_models():
    """Adding MTP modules changes nothing the main model computes: same logits as the plain model with its weights."""
    plain, with_mtp = _model(_spec()), _model(_spec({"depth": 2}))
    state = {k: v for k, v in with_mtp.state_dict().items() if not k.startswith("mtp.")}
    plain.load_state_dict(state)
    idx = torch.randint(0, 320, (1, 12), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(plain.eval()(idx), with_mtp.eval()(idx))


def test_zero_weight_trains_the_main_model_as_without_mtp():
    """λ = 0: the main model's gradients are those of next-token prediction alone (the loop's weighted sum)."""
    plain, with_mtp = _model(_spec()), _model(_spec({"depth": 1, "weight": 0.0}))
    plain.load_state_dict({k: v for k, v in with_mtp.state_dict().items() if not k.startswith("mtp.")})
    window = torch.randint(0, 320, (2, 17), generator=torch.Generator().manual_seed(3))
    for model in (plain, with_mtp):
        model.train()
        _, loss = model(window[:, :-1], window[:, 1:])
        aux = model.auxiliary_losses() if hasattr(model, "auxiliary_losses") else {}
        weights = model.auxiliary_weights() if hasattr(model, "auxiliary_weights") else {}
        (loss + sum(weights.get(n, 1.0) * v for n, v in aux.items())).backward()
    for name, p in plain.named_parameters():
        torch.testing.assert_close(p.grad, dict(with_mtp.named_parameters())[name].grad)


# ── accounting ──────────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("depth", [1, 3])
def test_params_split_main_and_mtp_as_the_module_holds_them(depth):
    spec = _spec({"depth": depth})
    model = _model(spec)
    acc = account(spec)
    mtp = sum(p.numel() for n, p in model.named_parameters() if n.startswith("mtp."))
    assert acc.total == sum(p.numel() for p in model.parameters())
    assert acc.mtp_params == mtp and acc.by_component["mtp"] == mtp
    assert acc.main_total == account(_spec()).total
    assert acc.flops_forward == account(_spec()).flops_forward  # inference: the main model's forward
    assert acc.flops_train == 3 * (acc.flops_forward + acc.mtp_flops_forward)
    d = acc.to_dict()
    assert d["mtp"]["params"] == mtp and d["main"]["params"] == acc.total - mtp


def test_mtp_flops_match_the_flop_counter():
    """A training forward minus an inference forward = the MTP modules; depth k runs over T - k positions."""
    spec = _spec({"depth": 2})
    model = _model(spec)
    T = 16
    window = torch.randint(0, 320, (1, T + 1), generator=torch.Generator().manual_seed(4))

    def counted(train: bool) -> int:
        model.train(train)
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), counter:
            model(window[:, :-1], window[:, 1:])
        return counter.get_total_flops()

    extra = counted(True) - counted(False)
    # the math kernel multiplies the full score matrix: accounting at full attention, each depth at its length
    want = sum((T - k) * mtp_breakdown(spec.model, T - k, full_attention=True)[2] / 2 for k in (1, 2))
    assert abs(extra - want) <= 0.01 * want


def test_memory_plan_counts_the_mtp_modules():
    from archspec.memory import plan_memory

    plain, with_mtp = plan_memory(_spec()), plan_memory(_spec({"depth": 2}))
    assert with_mtp.params == plain.params + account(_spec({"depth": 2})).mtp_params
    assert with_mtp.activations > plain.activations


# ── HF deepseek_v3: the MTP layers past num_hidden_layers, both ways ───────────────────────────────────────────


def _deepseek_dir(tmp_path, shared_head_equal: bool = True):
    """A tiny DeepSeek-V3 checkpoint as DeepSeek publishes one: num_hidden_layers decoder layers, then one MTP layer
    (model.layers.N: a decoder layer — MoE, as the last — with enorm, hnorm, eh_proj, shared_head.norm, and copies of
    the embedding and head). transformers' model builds no MTP layer: the state dict is extended by hand."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file

    kw = dict(vocab_size=96, max_position_embeddings=32, hidden_size=32, intermediate_size=40, num_attention_heads=4,
              num_key_value_heads=4, q_lora_rank=12, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
              v_head_dim=6, first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
              n_group=2, topk_group=1, n_shared_experts=1, rope_interleave=True, bos_token_id=None, eos_token_id=None,
              pad_token_id=None, tie_word_embeddings=False)
    g = torch.Generator().manual_seed(11)
    big = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(num_hidden_layers=3, **kw))
    with torch.no_grad():
        for name, p in big.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g) if p.ndim == 1 and "norm" in name
                    else 0.1 * torch.randn(p.shape, generator=g))
    main_model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(num_hidden_layers=2,
                                                                                 num_nextn_predict_layers=1, **kw))
    state = big.state_dict()
    main_model.load_state_dict({k: v for k, v in state.items() if not k.startswith("model.layers.2.")}, strict=False)
    for name, buf in big.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buf.copy_(0.05 * torch.randn(buf.shape, generator=g))
    out = tmp_path / "hf-deepseek-mtp"
    main_model.save_pretrained(out)
    tensors = load_file(str(out / "model.safetensors"))
    big.save_pretrained(tmp_path / "big")  # the checkpoint's names (transformers fuses experts in memory)
    mtp = {k: v.clone() for k, v in load_file(str(tmp_path / "big" / "model.safetensors")).items()
           if k.startswith("model.layers.2.")}
    mtp.update({"model.layers.2.enorm.weight": 1.0 + 0.2 * torch.randn(32, generator=g),
                "model.layers.2.hnorm.weight": 1.0 + 0.2 * torch.randn(32, generator=g),
                "model.layers.2.eh_proj.weight": 0.1 * torch.randn(32, 64, generator=g),
                "model.layers.2.shared_head.norm.weight": 1.0 + 0.2 * torch.randn(32, generator=g),
                "model.layers.2.embed_tokens.weight": tensors["model.embed_tokens.weight"].clone(),
                "model.layers.2.shared_head.head.weight": tensors["lm_head.weight"].clone()
                if shared_head_equal else torch.randn(96, 32, generator=g)})
    tensors.update(mtp)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return main_model, out, mtp


def test_deepseek_v3_mtp_layer_imports_and_exports_under_its_names(tmp_path, capsys):
    from safetensors.torch import load_file

    from archspec.cli import main
    from archspec.spec import load_spec

    hf, src, mtp = _deepseek_dir(tmp_path)
    spec_path, ckpt = tmp_path / "ds.yaml", tmp_path / "ds.pt"
    assert main(["import-hf", str(src), "-o", str(spec_path), "--checkpoint", str(ckpt)]) == 0, capsys.readouterr().err
    assert "model.mtp.depth 1" in capsys.readouterr().err
    spec = load_spec(spec_path)
    assert spec.model.mtp.depth == 1
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["model"]
    ours = generate(spec, write=False).Model()
    ours.load_state_dict(state)  # strict: every MTP parameter came from the file
    assert sum(p.numel() for k, p in ours.named_parameters() if k.startswith("mtp.")) == account(spec).mtp_params
    torch.testing.assert_close(state["mtp.0.proj.weight"], mtp["model.layers.2.eh_proj.weight"])
    torch.testing.assert_close(state["mtp.0.embed_norm.weight"], mtp["model.layers.2.enorm.weight"])
    idx = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # the main model computes what transformers' does (it has no MTP layer)
        torch.testing.assert_close(ours.eval()(idx), hf.eval()(input_ids=idx).logits, atol=1e-4, rtol=0)

    out = tmp_path / "exported"
    assert main(["export-hf", str(ckpt), "-o", str(out)]) == 0, capsys.readouterr().err
    written = load_file(str(out / "model.safetensors"))
    assert set(mtp) <= set(written)
    for name, tensor in mtp.items():  # every MTP tensor back under its original name, equal
        assert torch.equal(written[name], tensor), name
    config = __import__("json").loads((out / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1 and config["num_hidden_layers"] == 2
    transformers = pytest.importorskip("transformers")
    back = transformers.AutoModelForCausalLM.from_pretrained(out)  # HF ignores the MTP layer's tensors
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(input_ids=idx).logits, ours(idx), atol=1e-4, rtol=0)


def test_deepseek_v3_mtp_head_that_is_not_the_models_is_refused(tmp_path, capsys):
    from archspec.cli import main

    _, src, _ = _deepseek_dir(tmp_path, shared_head_equal=False)
    code = main(["import-hf", str(src), "-o", str(tmp_path / "x.yaml"), "--checkpoint", str(tmp_path / "x.pt")])
    err = capsys.readouterr().err
    assert code == 2 and "model.layers.2.shared_head.head.weight differs" in err and "Traceback" not in err, err


def test_released_deepseek_v3_mtp_module_counts_as_transformers_counts_its_layer():
    """deepseek-ai/DeepSeek-V3's config (one MTP layer): the module is a MoE decoder layer as transformers builds
    layer 61 (counted on the meta device), plus eh_proj (2·7168 → 7168) and three norms; the main model keeps its
    671.0B / 37.6B (tests/test_hf_interop.py)."""
    import json
    import warnings
    from pathlib import Path

    transformers = pytest.importorskip("transformers")
    from archspec.hf import spec_from_config

    data = json.loads((Path(__file__).parent / "fixtures" / "deepseek-v3-config.json").read_text())
    data.pop("quantization_config", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = load_spec_dict(spec_from_config(data, "DeepSeek-V3/config.json", "v3"))
    acc = account(spec)
    assert spec.model.mtp.depth == 1 and acc.main_total == 671_026_404_352 and acc.main_active == 37_552_282_624
    small = {**data, "num_hidden_layers": 4, "first_k_dense_replace": 3}  # layer 3: a MoE layer like layer 61
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(transformers.DeepseekV3Config(**small))
    layer = sum(p.numel() for p in hf.model.layers[3].parameters())
    d = data["hidden_size"]
    assert acc.mtp_params == layer + 2 * d * d + 3 * d


# ── self-speculative decoding: sample --draft mtp ───────────────────────────────────────────────────────────────


def _drafts_without_caches(model, decided: list[int], drafts: list[int]) -> list[int]:
    """The drafts a round should make, computed over the whole sequence with no cache: depth 0 the model's normed
    hidden states at positions 0 .. n - 2, depth k reading depth k - 1's and the tokens k ahead (decided, then the
    round's own drafts), each draft the argmax at the last position."""
    n = len(decided)
    x = model.hidden_states(torch.tensor([decided[:-1]]))
    h, out = model.final_norm(x), []
    for k in range(1, len(drafts) + 1):
        seq = decided + out
        h, logits = model.mtp_forward(k, h, torch.tensor([seq[k : n - 1 + k]]))
        out.append(int(logits[0, -1].argmax()))
    return out


def _cyclic_model(depth: int):
    """A tiny model with `depth` MTP modules trained (plain torch, a few seconds) on a cycle of 7 tokens: the model and
    its modules then predict the cycle, so drafts are kept."""
    spec = _spec({"depth": depth, "weight": 1.0}, context_length=64)
    model = _model(spec, seed=0).train()
    cycle = torch.tensor([5, 17, 3, 99, 42, 7, 250])
    data = cycle.repeat(6)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        starts = torch.randint(0, 7, (4,), generator=g)
        window = torch.stack([data[s : s + 17] for s in starts.tolist()])
        _, loss = model(window[:, :-1], window[:, 1:])
        aux = model.auxiliary_losses()
        total = loss + sum(model.auxiliary_weights()[k] * v for k, v in aux.items())
        opt.zero_grad()
        total.backward()
        opt.step()
    return model.eval()


@pytest.mark.parametrize("depth, draft, prompt_len", [(1, 1, 1), (3, 2, 5)])
def test_mtp_draft_gives_the_models_greedy_output_and_drafts_as_without_caches(depth, draft, prompt_len, one_thread):
    """Random weights: drafts are rarely kept; the output is still the model's greedy output, and each round's drafts
    are what the modules compute over the whole sequence without caches (the caches hold what training saw)."""
    from archspec.sample import SpeculativeStats, mtp_speculative_stream

    spec = _spec({"depth": depth}, context_length=64)
    model = _model(spec, seed=depth).eval()
    idx = torch.randint(0, 320, (1, prompt_len), generator=torch.Generator().manual_seed(prompt_len))
    want = model.generate(idx, 16, temperature=0)[0, prompt_len:].tolist()
    stats, trace = SpeculativeStats(), []
    got = list(mtp_speculative_stream(model, idx, 16, depth=draft, stats=stats, trace=trace))
    assert got == want
    assert stats.drafted > 0 and len(trace) == stats.target_forwards - 1
    with torch.no_grad():
        for decided, drafts in trace:
            assert drafts == _drafts_without_caches(model, decided, drafts)


@pytest.fixture
def one_thread():
    """One torch thread: a few-row GEMM on two busy cores otherwise waits on the other thread (several times slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_trained_mtp_modules_draft_tokens_the_model_keeps(one_thread):
    from archspec.sample import SpeculativeStats, mtp_speculative_stream

    model = _cyclic_model(2)
    idx = torch.tensor([[5, 17, 3]])
    want = model.generate(idx, 24, temperature=0)[0, 3:].tolist()
    assert want[:7] == [99, 42, 7, 250, 5, 17, 3]  # it learned the cycle
    stats, trace = SpeculativeStats(), []
    got = list(mtp_speculative_stream(model, idx, 24, stats=stats, trace=trace))
    assert got == want
    assert stats.acceptance_rate > 0.8, stats
    assert stats.target_forwards <= 12  # about 24 / 3 forwards for 24 tokens (two drafts kept a round)
    with torch.no_grad():
        for decided, drafts in trace:
            assert drafts == _drafts_without_caches(model, decided, drafts)


def test_sample_draft_mtp_refuses_a_model_without_mtp_and_sampling(tmp_path, capsys):
    import yaml

    from archspec.cli import main

    data = copy.deepcopy(BASE)
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(data))
    code = main(["sample", str(tmp_path / "plain.yaml"), "--draft", "mtp", "--temperature", "0", "--max-new-tokens", "4"])
    err = capsys.readouterr().err
    assert code == 2 and "--draft mtp" in err and "model.mtp is not set" in err and "Traceback" not in err, err
    data["model"]["mtp"] = {"depth": 2}
    (tmp_path / "mtp.yaml").write_text(yaml.safe_dump(data))
    code = main(["sample", str(tmp_path / "mtp.yaml"), "--draft", "mtp", "--max-new-tokens", "4"])
    err = capsys.readouterr().err
    assert code == 2 and "--temperature 0" in err, err
    code = main(["sample", str(tmp_path / "mtp.yaml"), "--draft", "mtp", "--temperature", "0", "--max-new-tokens", "8",
                 "--prompt", "ab"])
    err = capsys.readouterr().err
    assert code == 0 and "MTP draft acceptance" in err, err


# ── bench/mtp.py: the ablation's figures (docs/mtp.md) ──


def _bench_mtp():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "mtp.py"
    spec = importlib.util.spec_from_file_location("bench_mtp", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_mtp_bench_runs_against_a_registry(tmp_path, monkeypatch, capsys):
    """Its imports are inside main(): a module archspec moved (archspec.train.cache → archspec.cache) broke it
    without any test noticing until the ablation was measured."""
    import json

    bench = _bench_mtp()
    monkeypatch.setenv("ARCHSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("sys.argv", ["mtp.py", "--registry", f"sqlite:///{tmp_path / 'r.db'}", "--json"])
    bench.main()
    assert json.loads(capsys.readouterr().out) == {"runs": [], "summary": []}


def test_the_mtp_bench_summary_is_welchs_interval_against_lambda_zero():
    from scipy import stats

    bench = _bench_mtp()
    base = [2.80, 2.85, 2.79]
    mtp = [2.72, 2.70, 2.76]
    rows = [{"mtp": {"depth": 1, "weight": 0.0}, "steps": 100, "seed": s, "val_loss": v} for s, v in enumerate(base)]
    rows += [{"mtp": {"depth": 1, "weight": 0.3}, "steps": 100, "seed": s, "val_loss": v, "acceptance_rate": 0.9}
             for s, v in enumerate(mtp)]
    rows += [{"mtp": {"depth": 1, "weight": 0.3}, "steps": 50, "seed": 0, "val_loss": 3.0}]  # another budget: apart
    summary = {(json_key["mtp"]["weight"], json_key["steps"]): json_key for json_key in bench.summarize(rows)}
    assert set(summary) == {(0.0, 100), (0.3, 100), (0.3, 50)}
    got = summary[(0.3, 100)]["val_loss"]
    want = stats.ttest_ind(mtp, base, equal_var=False).confidence_interval(0.95)
    assert got["mean"] == pytest.approx(sum(mtp) / 3)
    assert got["delta"] == pytest.approx(sum(mtp) / 3 - sum(base) / 3)
    assert got["ci95"] == pytest.approx([want.low, want.high])
    assert "delta" not in summary[(0.0, 100)]["val_loss"]  # the baseline is not compared with itself
    assert "delta" not in summary[(0.3, 50)]["val_loss"]  # no λ = 0 run at 50 steps
    assert "delta" not in summary[(0.3, 100)]["acceptance_rate"]  # the baseline has no such figure
