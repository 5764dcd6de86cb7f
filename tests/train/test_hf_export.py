"""`archspec export-hf` of a trained run writes its tokenizer (issue 33): for every tokenizer kind, AutoTokenizer gives
archspec's ids for any text, decodes them back, and pipeline("text-generation") continues a prompt greedily with the
generated module's own ids. Tiny runs of 2 steps on the CPU; no downloads."""

from __future__ import annotations

import contextlib
import io
import json
import random

import pytest
import torch

from archspec.cli import main
from archspec.train.checkpoint import load_checkpoint, save_checkpoint

transformers = pytest.importorskip("transformers")

TEXTS = ["hello world", "  two  spaces, a tab\tand\nnewlines\r\n", "héllo ☃ 𝄞 日本語 — ünïcödé", "don't . , ! ?",
         "a<|endoftext|>b", "\x00\x01\x7f", ""]


def _run(tmp_path, corpus_dir, tokenizer: str) -> tuple:
    """A 2-step run with `tokenizer`, its weights then stirred (lively greedy text, ids past the tokenizer's among
    them) and saved again as a training checkpoint; exported. (run directory, export directory)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: tiny\nmodel: {vocab_size: 320, context_length: 32, d_model: 32, n_layers: 2, "
        "attention: {n_heads: 2, n_kv_heads: 1}}\n"
        f"train: {{data: {{corpus: {{kind: files, paths: ['{corpus_dir}']}}, tokenizer: {tokenizer}}}, "
        "batch_size: 4, seq_len: 32, compile: none, warmup_steps: 1, lr: 3.0e-3}\n", encoding="utf-8")
    run = tmp_path / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["train", str(spec), "--steps", "2", "--no-compile", "-q", "--device", "cpu",
                     "--run-dir", str(run)]) == 0
    state = load_checkpoint(run / "checkpoint.pt")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for v in {id(t): t for t in state["model"].values()}.values():  # a tied matrix once
            if v.is_floating_point() and v.ndim == 2:
                v.add_(0.5 * torch.randn(v.shape, generator=g))
    save_checkpoint(run / "checkpoint.pt", {k: v for k, v in state.items() if k not in ("format", "digest")})
    out = tmp_path / "hf"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["export-hf", str(run), "-o", str(out)]) == 0
    return run, out


def _texts(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = list(TEXTS)
    for _ in range(100):  # random bytes, as text (invalid UTF-8 → U+FFFD, which is three bytes)
        out.append(bytes(rng.randrange(256) for _ in range(rng.randrange(40))).decode("utf-8", errors="replace"))
    for _ in range(50):  # random code points of every plane
        out.append("".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0xD800),
                                           rng.randrange(0xE000, 0x110000)])) for _ in range(rng.randrange(12))))
    return out


@pytest.fixture(params=["{kind: byte}", "{kind: bpe, vocab_size: 300}"], ids=["byte", "bpe"])
def exported(request, tmp_path, corpus_dir):
    return _run(tmp_path, corpus_dir, request.param)


def test_the_exported_tokenizer_gives_archspecs_ids_and_decodes_back(exported):
    from archspec.sample import load_model

    run, out = exported
    ours = load_model(str(run)).tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    assert theirs.eos_token == "<|endoftext|>" and theirs.eos_token_id == ours.eos_id
    assert len(theirs) == ours.vocab_size
    for text in _texts():
        ids = theirs(text)["input_ids"]
        assert ids == ours.encode_batch([text])[0].tolist(), text
        assert theirs.decode(ids) == text == ours.decode(ids)
    # EOS and the ids the model has past the tokenizer's (a padded vocabulary) decode to nothing, on both sides
    ids = ours.encode_batch(["ab"])[0].tolist()
    padded = ids[:1] + [ours.eos_id, ours.vocab_size, 319] + ids[1:]
    assert theirs.decode(padded, skip_special_tokens=True) == "ab" == ours.decode(padded)
    if ours.kind == "bpe":  # a run directory holds its BPE tokenizer.json: exported as it is
        assert (out / "tokenizer.json").read_text(encoding="utf-8") == (run / "tokenizer.json").read_text(
            encoding="utf-8")
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["model_max_length"] == 32
    generation = json.loads((out / "generation_config.json").read_text(encoding="utf-8"))
    assert generation["eos_token_id"] == ours.eos_id


def test_pipeline_continues_a_prompt_greedily_as_the_generated_module_does(exported, capsys):
    from archspec.console import terminal_text
    from archspec.sample import encode_prompt, load_model

    run, out = exported
    loaded = load_model(str(run))
    prompt, n = "def héllo(", 16
    ids = encode_prompt(loaded.tokenizer, prompt)
    want = loaded.model.generate(ids, n, temperature=0, eos_id=loaded.tokenizer.eos_id)[0].tolist()
    assert len(set(want[ids.shape[1]:])) > 2  # lively: not one token repeated

    pipe = transformers.pipeline("text-generation", model=str(out), tokenizer=str(out), device="cpu")
    got = pipe(prompt, max_new_tokens=n, do_sample=False, return_tensors=True)[0]["generated_token_ids"]
    assert list(got) == want
    text = pipe(prompt, max_new_tokens=n, do_sample=False, return_full_text=False)[0]["generated_text"]
    assert text == loaded.tokenizer.decode(want[ids.shape[1]:])
    # the model directory alone: the pipeline finds the tokenizer there, and greedy is the default
    assert transformers.pipeline("text-generation", model=str(out), device="cpu")(
        prompt, max_new_tokens=n)[0]["generated_text"] == prompt + text

    capsys.readouterr()  # `archspec sample` prints the same text (control characters escaped, as it streams)
    assert main(["sample", str(run), "--prompt", prompt, "--max-new-tokens", str(n), "--temperature", "0",
                 "--device", "cpu"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == terminal_text(text)


def test_a_bpe_run_saved_before_tokenizers_travelled_exports_its_model_with_a_caution(tmp_path, corpus_dir, capsys):
    """A checkpoint without its tokenizer and no tokenizer.json beside it: the model is still exported (it was before
    tokenizers were exported), and a caution says the tokenizer is left out."""
    run, _ = _run(tmp_path, corpus_dir, "{kind: bpe, vocab_size: 300}")
    state = load_checkpoint(run / "checkpoint.pt")
    save_checkpoint(run / "checkpoint.pt", {k: v for k, v in state.items() if k not in ("format", "digest", "tokenizer")})
    (run / "tokenizer.json").unlink()
    out = tmp_path / "old"
    capsys.readouterr()
    assert main(["export-hf", str(run), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "holds no tokenizer" in err and "exported without a tokenizer" in err
    assert (out / "config.json").is_file() and not (out / "tokenizer.json").exists()
