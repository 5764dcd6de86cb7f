"""`archspec sample` (issue 15): from a run id, a checkpoint copied anywhere (the tokenizer travels inside it), or a
bare spec; streaming, reproducible, refusing what does not fit; speculative with --draft."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys

import pytest

from archspec.cli import main
from archspec.train.checkpoint import load_checkpoint

PROMPT = "def "


def _spec_file(tmp_path, corpus_dir, tokenizer: str = "{kind: bpe, vocab_size: 300}", name: str = "tiny") -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nmodel: {{vocab_size: 320, context_length: 32, d_model: 32, n_layers: 2, "
        f"attention: {{n_heads: 2, n_kv_heads: 1}}}}\n"
        f"train: {{data: {{corpus: {{kind: files, paths: ['{corpus_dir}']}}, tokenizer: {tokenizer}}}, "
        f"batch_size: 4, seq_len: 32, compile: none, warmup_steps: 1, lr: 3.0e-3}}\n")
    return str(path)


def _sample(capsys, *args) -> tuple[int, str, str]:
    rc = main(["sample", *args, "--device", "cpu"])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus_dir, cache):
    """One short BPE run for the module, recorded in a registry of its own: (run id, run directory, registry URL)."""
    root = tmp_path_factory.mktemp("sample-run")
    spec = _spec_file(root, corpus_dir)
    registry = f"sqlite:///{root}/registry.db"
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setenv("ARCHSPEC_CACHE", str(cache))
        rc = main(["train", spec, "--steps", "6", "--no-compile", "--json", "-q", "--device", "cpu",
                   "--run-dir", str(root / "run"), "--registry", registry])
    assert rc == 0
    return json.loads(out.getvalue().strip().splitlines()[-1])["run_id"], root / "run", registry


@pytest.fixture
def bpe_run(trained, tmp_path):
    """The module's run, copied: a test may change its files."""
    run_id, run_dir, registry = trained
    shutil.copytree(run_dir, tmp_path / "run")
    return run_id, tmp_path / "run"


def test_a_bpe_run_samples_by_id_and_from_its_checkpoint_alone_on_an_empty_cache(trained, bpe_run, tmp_path, capsys,
                                                                                    monkeypatch):
    run_id, _, registry = trained
    _, run_dir = bpe_run
    state = load_checkpoint(run_dir / "checkpoint.pt")
    assert state["tokenizer"]["kind"] == "bpe" and '"<|endoftext|>"' in state["tokenizer"]["json"]
    assert (run_dir / "tokenizer.json").read_text(encoding="utf-8") == state["tokenizer"]["json"]

    rc, by_id, err = _sample(capsys, run_id, "--registry", registry, "--prompt", PROMPT, "--max-new-tokens", "12",
                             "--temperature", "0")
    assert rc == 0, err
    assert "12 tokens in" in err or "stopped at EOS" in err
    assert f"checkpoint {trained[1] / 'checkpoint.pt'}" in err
    rc, _, err = _sample(capsys, "zzzz-unknown", "--registry", registry)
    assert rc == 2 and "no run 'zzzz-unknown'" in err
    rc, from_dir, err = _sample(capsys, str(run_dir), "--prompt", PROMPT, "--max-new-tokens", "12",
                                "--temperature", "0")
    assert rc == 0 and from_dir == by_id, err

    # Another machine: only the checkpoint file, an empty cache, and no way to read the corpus or train a tokenizer.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(run_dir / "checkpoint.pt", elsewhere / "model.pt")
    empty_cache = tmp_path / "empty-cache"
    empty_cache.mkdir()
    monkeypatch.setenv("ARCHSPEC_CACHE", str(empty_cache))
    monkeypatch.chdir(elsewhere)

    def refuse(*a, **k):
        raise AssertionError("sampling a checkpoint must not need the corpus or the data cache")

    monkeypatch.setattr("archspec.train.data.open_corpus", refuse)
    monkeypatch.setattr("archspec.train.tokenizer.build_tokenizer", refuse)
    rc, copied, err = _sample(capsys, "model.pt", "--prompt", PROMPT, "--max-new-tokens", "12", "--temperature", "0")
    assert rc == 0, err
    assert copied == by_id
    assert list(empty_cache.iterdir()) == []  # nothing was written to the cache

    # The model as its own draft: greedy speculative output is the model's own, every draft token accepted.
    rc, speculative, err = _sample(capsys, "model.pt", "--prompt", PROMPT, "--max-new-tokens", "12",
                                   "--temperature", "0", "--draft", "model.pt", "--draft-tokens", "3")
    assert rc == 0, err
    assert speculative == by_id
    assert "draft acceptance 100.0%" in err


def test_a_bare_spec_streams_random_weights_reproducibly(tmp_path, corpus_dir, capsys, monkeypatch):
    spec = _spec_file(tmp_path, corpus_dir, tokenizer="{kind: byte}")
    args = [spec, "--prompt", "x = ", "--max-new-tokens", "20", "--temperature", "1.0", "--top-k", "50"]
    rc, first, err = _sample(capsys, *args, "--seed", "3")
    assert rc == 0, err and "random weights, seed 3" in err
    assert _sample(capsys, *args, "--seed", "3")[1] == first
    assert _sample(capsys, *args, "--seed", "4")[1] != first

    writes: list[str] = []

    class Recorder:
        def write(self, text):
            writes.append(text)

        def flush(self):
            writes.append("<flush>")

    monkeypatch.setattr(sys, "stdout", Recorder())
    assert _sample(capsys, spec, "--prompt", "ab", "--max-new-tokens", "8", "--temperature", "0", "-q")[0] == 0
    assert writes.count("<flush>") >= 8  # one write and flush per token as it comes, not one at the end


def test_prompt_plus_new_tokens_beyond_the_context_is_refused_with_the_numbers(tmp_path, corpus_dir, capsys):
    spec = _spec_file(tmp_path, corpus_dir, tokenizer="{kind: byte}")
    rc, out, err = _sample(capsys, spec, "--prompt", "a" * 30, "--max-new-tokens", "10")
    assert rc == 2 and "Traceback" not in err
    assert "prompt (30 tokens) + --max-new-tokens 10 = 40 exceeds context_length 32" in err
    assert "lower --max-new-tokens to 2" in err


def test_bad_sources_and_drafts_exit_2(tmp_path, corpus_dir, capsys, bpe_run):
    run_id, run_dir = bpe_run
    byte_spec = _spec_file(tmp_path, corpus_dir, tokenizer="{kind: byte}", name="bytes")
    for args, message in [
        (["nope.pt"], "nope.pt: no such file"),
        (["zzzz-not-a-run"], "no registry at"),
        ([str(tmp_path)], "a directory without checkpoint.pt"),
        ([str(run_dir), "--draft", byte_spec], "a draft must share the tokenizer"),
        ([str(run_dir), "--set", "model.n_layers=1"], "--set applies to a spec"),
        ([byte_spec, "--top-p", "0"], "--top-p"),
    ]:
        rc, _, err = _sample(capsys, *args, "--registry", f"sqlite:///{tmp_path}/registry.db")
        assert rc == 2, (args, err)
        assert message in err and "Traceback" not in err, (args, err)


def test_a_checkpoint_without_a_stored_tokenizer_falls_back_to_the_run_directory(bpe_run, capsys):
    """Checkpoints written before tokenizers travelled inside them: the run directory's tokenizer.json serves."""
    from archspec.train.checkpoint import save_checkpoint

    _, run_dir = bpe_run
    state = load_checkpoint(run_dir / "checkpoint.pt")
    rc, before, _ = _sample(capsys, str(run_dir), "--prompt", PROMPT, "--max-new-tokens", "6", "--temperature", "0")
    save_checkpoint(run_dir / "checkpoint.pt", {k: v for k, v in state.items() if k not in ("format", "digest",
                                                                                             "tokenizer")})
    rc, after, err = _sample(capsys, str(run_dir), "--prompt", PROMPT, "--max-new-tokens", "6", "--temperature", "0")
    assert rc == 0 and after == before, err
    (run_dir / "tokenizer.json").unlink()
    rc, _, err = _sample(capsys, str(run_dir), "--prompt", PROMPT)
    assert rc == 2 and "holds no tokenizer" in err


# ── weights checkpoints (import-hf) ─────────────────────────────────────────────────────────────────────────────


def test_a_weights_checkpoint_samples_as_the_run_whose_weights_it_holds(bpe_run, tmp_path, capsys):
    """A weights checkpoint (the format import-hf writes: the model and its tokenizer files) of the run's weights and
    tokenizer samples exactly what the run samples; without a tokenizer it is refused, naming why."""
    from archspec.train.checkpoint import save_weights

    _, run_dir = bpe_run
    state = load_checkpoint(run_dir / "checkpoint.pt")
    files = {"tokenizer.json": state["tokenizer"]["json"],
             "tokenizer_config.json": json.dumps({"eos_token": {"content": "<|endoftext|>"}})}
    save_weights(tmp_path / "w.pt", state["spec"], state["spec_hash"], state["model"], files, source="a test")
    args = ["--prompt", PROMPT, "--max-new-tokens", "12", "--temperature", "0"]
    rc, from_run, err = _sample(capsys, str(run_dir), *args)
    assert rc == 0, err
    rc, from_weights, err = _sample(capsys, str(tmp_path / "w.pt"), *args)
    assert rc == 0, err
    assert from_weights == from_run
    assert f"weights checkpoint {tmp_path / 'w.pt'} (from a test)" in err

    save_weights(tmp_path / "bare.pt", state["spec"], state["spec_hash"], state["model"], {})
    rc, _, err = _sample(capsys, str(tmp_path / "bare.pt"), *args)
    assert rc == 2 and "a weights checkpoint without a tokenizer" in err and "Traceback" not in err


def test_sample_reads_what_import_hf_writes_and_continues_as_hf_does(tmp_path, capsys):
    """An HF Llama directory with a tokenizer (its EOS named in tokenizer_config.json) → `import-hf --checkpoint` →
    `sample CHECKPOINT`: greedy text equal to HF's own greedy generate from the same prompt."""
    transformers = pytest.importorskip("transformers")
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "</s>"] + [f"w{i}" for i in range(46)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    config = transformers.LlamaConfig(vocab_size=48, max_position_embeddings=32, hidden_size=32, intermediate_size=40,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      bos_token_id=None, eos_token_id=1, pad_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        hf.lm_head.weight.normal_(0.0, 1.0)  # lively logits: greedy text that changes from token to token
    src = tmp_path / "hf-llama"
    hf.save_pretrained(src)
    (src / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    (src / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}), encoding="utf-8")
    assert main(["import-hf", str(src), "-o", str(tmp_path / "llama.yaml"), "--checkpoint",
                 str(tmp_path / "llama.pt")]) == 0, capsys.readouterr().err
    capsys.readouterr()

    prompt = "w3 w7 w1 w12"
    rc, out, err = _sample(capsys, str(tmp_path / "llama.pt"), "--prompt", prompt, "--max-new-tokens", "10",
                           "--temperature", "0")
    assert rc == 0, err
    ids = torch.tensor([tok.encode(prompt).ids])
    want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)[0, 4:]
    assert out.strip() == tok.decode(want.tolist(), skip_special_tokens=True)
    assert (want == 1).any() == ("stopped at EOS" in err)


# ── past the context ────────────────────────────────────────────────────────────────────────────────────────────


def test_a_windowed_spec_samples_past_its_context_and_a_dense_one_says_why_not(tmp_path, corpus_dir, capsys):
    windowed = _spec_file(tmp_path, corpus_dir, tokenizer="{kind: byte}", name="windowed")
    text = open(windowed, encoding="utf-8").read().replace("n_kv_heads: 1}", "n_kv_heads: 1, sparsity: "
                                                           "{kind: sliding_window, window: 8}}")
    open(windowed, "w", encoding="utf-8").write(text)
    rc, out, err = _sample(capsys, windowed, "--prompt", "a" * 30, "--max-new-tokens", "40", "--temperature", "0")
    assert rc == 0, err
    assert "40 tokens in" in err and "past context_length 32: every layer reads a bounded distance back" in err
    assert "KV cache" in err

    dense = _spec_file(tmp_path, corpus_dir, tokenizer="{kind: byte}", name="dense")
    rc, _, err = _sample(capsys, dense, "--prompt", "a" * 30, "--max-new-tokens", "40")
    assert rc == 2 and "exceeds context_length 32" in err and "layer 0 has dense causal attention" in err


def test_a_model_without_attention_reports_a_fixed_decoding_state_not_a_kv_cache(tmp_path, corpus_dir, capsys):
    """A conv-only model samples past its context with a state of fixed size: the summary called it a 'KV cache' of
    as many positions as were generated, and said every layer 'attends within a window'."""
    spec = _spec_file(tmp_path, corpus_dir, tokenizer="{kind: byte}", name="conv")
    text = open(spec, encoding="utf-8").read().replace("attention: {n_heads: 2, n_kv_heads: 1}",
                                                       "mixer: {kind: short_conv}")
    open(spec, "w", encoding="utf-8").write(text)
    rc, _, err = _sample(capsys, spec, "--prompt", "a" * 30, "--max-new-tokens", "40", "--temperature", "0")
    assert rc == 0, err
    assert "KV cache" not in err and "attends" not in err
    assert "decoding state 512 bytes (fixed at any length, fp32)" in err  # 2 layers · d 32 · (L_cache 3 - 1) · 4 B
