"""`archspec quantize` on a trained run: --json keys and exact bytes, the val loss on the run's own validation set, the
quantized checkpoint (digest, safe load), the evaluation and its filter, sampling from it, and every refusal (exit 2,
one line): unknown scheme, group size not dividing, --resume / export-hf of a quantized checkpoint, a file that is no
checkpoint, a tampered one."""

from __future__ import annotations

import contextlib
import io
import json
import sysconfig
from pathlib import Path

import pytest
import torch

from archspec.cli import main
from archspec.registry import Registry

pytest.importorskip("torchao")

MODEL = ("{vocab_size: 320, context_length: 32, d_model: 64, n_layers: 2, attention: {n_heads: 2, n_kv_heads: 1}, "
         "ffn: {kind: glu, hidden_dim: 128}}")
KEYS = {"scheme", "group_size", "quantized_modules", "weight_bytes_before", "weight_bytes_after",
        "quantized_bytes_before", "quantized_bytes_after", "val_loss_before", "val_loss_after", "val_loss_delta",
        "checkpoint"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One run trained for a few steps on a few stdlib modules: (run id, run dir, registry URL, cache)."""
    root = tmp_path_factory.mktemp("quant")
    corpus = root / "corpus"
    corpus.mkdir()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("bisect.py", "colorsys.py", "copy.py", "heapq.py", "textwrap.py", "string.py"):
        (corpus / name.replace(".py", ".txt")).write_text((stdlib / name).read_text(encoding="utf-8"))
    spec = root / "q.yaml"
    spec.write_text(f"name: q\nmodel: {MODEL}\ntrain: {{data: {{corpus: {{kind: files, paths: ['{corpus}']}}, "
                    "val_fraction: 0.2}, batch_size: 4, seq_len: 32, steps: 6, compile: none, warmup_steps: 0, "
                    "eval_interval: 3, eval_tokens: 512, lr: 3.0e-3}\n")
    registry = f"sqlite:///{root}/registry.db"
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setenv("ARCHSPEC_CACHE", str(root / "cache"))
        rc = main(["train", str(spec), "--json", "-q", "--device", "cpu", "--run-dir", str(root / "run"),
                   "--registry", registry])
    assert rc == 0
    return json.loads(out.getvalue().strip().splitlines()[-1])["run_id"], root / "run", registry, root / "cache"


@pytest.fixture
def cli(run, capsys, monkeypatch):
    monkeypatch.setenv("ARCHSPEC_CACHE", str(run[3]))
    monkeypatch.setenv("ARCHSPEC_REGISTRY", run[2])

    def call(*args: str) -> tuple[int, str, str]:
        rc = main(list(args))
        out = capsys.readouterr()
        return rc, out.out, out.err
    return call


def _one_line_error(rc: int, err: str, *needles: str) -> None:
    assert rc == 2, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], err


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantize_json_checkpoint_and_evaluation(run, cli, scheme):
    run_id, run_dir, registry, _ = run
    rc, out, err = cli("quantize", run_id[:8], "--scheme", scheme, "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert set(d) == KEYS
    assert d["scheme"] == scheme and d["group_size"] == (None if scheme == "int8" else 64)  # 128 does not divide 64
    assert len(d["quantized_modules"]) == 10 and not any("norm" in m or "emb" in m or "lm_head" in m
                                                         for m in d["quantized_modules"])
    # the run's own validation set: before quantization the loss is the one the run recorded at its last step
    with Registry(registry) as reg:
        recorded = reg.get_run(run_id)
    assert d["val_loss_before"] == pytest.approx(recorded.metrics["val_loss"], abs=1e-5)
    assert d["val_loss_delta"] == pytest.approx(d["val_loss_after"] - d["val_loss_before"])
    assert abs(d["val_loss_delta"]) < 0.1 * d["val_loss_before"]
    # bytes from the tensors of the file written
    path = Path(d["checkpoint"])
    assert path.parent == run_dir and path.is_file()
    state = torch.load(path, weights_only=True)
    assert state["format"] == "archspec-quantized/1" and isinstance(state["digest"], str)
    stored = {k: v for k, v in state["model"].items()}
    q_bytes = sum(t.numel() * t.element_size() for k, t in stored.items()
                  if any(k.startswith(m.rpartition(".")[0] + ".") for m in d["quantized_modules"]))
    assert q_bytes == d["quantized_bytes_after"]
    storages = {t.untyped_storage().data_ptr(): t.numel() * t.element_size() for t in stored.values()}
    assert sum(storages.values()) == d["weight_bytes_after"]  # the tied embedding and head: one matrix, once
    assert d["weight_bytes_before"] - d["weight_bytes_after"] == d["quantized_bytes_before"] - d["quantized_bytes_after"]
    with Registry(registry) as reg:
        evaluation = [e for e in reg.evaluations(run_id) if e["task"] == f"quant.{scheme}"][-1]
        assert evaluation["metrics"]["val_loss_delta"] == pytest.approx(d["val_loss_delta"])
        assert evaluation["checkpoint"] == str(path)
        assert "blocks.0.attn_norm.weight" not in evaluation["params"]["weights"]
        assert set(evaluation["params"]["kept"]) == {"tok_emb.weight", "lm_head.weight"}
        near = d["val_loss_delta"] + 1e-3
        assert [r.id for r in reg.runs(where=f"quant.{scheme}.val_loss_delta < {near}")] == [run_id]
        assert [r.id for r in reg.runs(where=f"quant.{scheme}.val_loss_delta > {near}")] == []
    rc, out, err = cli("sample", str(path), "--prompt", "def ", "--max-new-tokens", "5", "--temperature", "0", "-q")
    assert rc == 0, err
    rc, out2, err = cli("sample", run_id, "--quantize", scheme, "--prompt", "def ", "--max-new-tokens", "5",
                        "--temperature", "0", "-q")
    assert rc == 0 and out2 == out, err  # the same weights, quantized here or read from the file


def test_quantized_checkpoints_are_refused_where_full_precision_is_needed(run, cli, tmp_path):
    run_id, run_dir, _, _ = run
    rc, out, err = cli("quantize", run_id, "--scheme", "int4", "--group-size", "32", "--json")
    assert rc == 0, err
    path = json.loads(out)["checkpoint"]
    rc, _, err = cli("train", str(run_dir.parent / "q.yaml"), "--resume", path, "--device", "cpu")
    _one_line_error(rc, err, "quantized checkpoint", "cannot be resumed", "checkpoint.pt")
    rc, _, err = cli("export-hf", path, "-o", str(tmp_path / "hf"))
    _one_line_error(rc, err, "quantized checkpoint", "cannot be exported")
    rc, _, err = cli("quantize", path, "--scheme", "int8")
    _one_line_error(rc, err, "already quantized")
    # a tampered checkpoint: one weight changed, the stored digest kept
    state = torch.load(path, weights_only=True)
    name = next(k for k in state["model"] if k.endswith(".packed"))
    state["model"][name][0, 0] ^= 0x11
    tampered = tmp_path / "tampered.pt"
    torch.save(state, tampered)
    rc, _, err = cli("sample", str(tampered), "--prompt", "a", "--max-new-tokens", "2")
    _one_line_error(rc, err, "does not match the digest")
    assert "archspec quantize" in err and "resume" not in err  # the remedy for a quantized file, not a resume
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint at all")
    rc, _, err = cli("quantize", str(junk), "--scheme", "int8")
    _one_line_error(rc, err, "not a readable checkpoint")


def test_bad_schemes_and_group_sizes_exit_2_naming_what_is_valid(run, cli):
    run_id = run[0]
    rc, _, err = cli("quantize", run_id, "--scheme", "int3")
    _one_line_error(rc, err, "--scheme", "int8, int4")
    rc, _, err = cli("quantize", run_id, "--scheme", "int4", "--group-size", "48")
    _one_line_error(rc, err, "--group-size 48", "blocks.0.attn.qkv_proj.weight", "valid:")
    rc, _, err = cli("quantize", run_id, "--scheme", "int8", "--group-size", "32")
    _one_line_error(rc, err, "applies to int4")
    rc, _, err = cli("runs", "list", "--where", "quant.int8.val_loss_dleta < 1")
    assert rc == 2 and "quant.int8.val_loss_delta" in err, err


@pytest.mark.parametrize("scheme, part", [("int8", "__scale"), ("int4", ".scale"), ("int4", ".minimum")])
def test_a_tampered_quantized_file_with_a_huge_scale_is_refused_by_sample(run, cli, tmp_path, scheme, part):
    """Issue 42: the digest rewritten (as an adversary would), a scale of 1e30 (finite, so the finite check passes)
    would give weights that overflow fp32 and a traceback deep in sampling; it is refused on load, one line."""
    from archspec.train.checkpoint import save_quantized

    run_id, _, _, _ = run
    rc, out, err = cli("quantize", run_id, "--scheme", scheme, "--json")
    assert rc == 0, err
    state = torch.load(json.loads(out)["checkpoint"], weights_only=True)
    name = next(k for k in state["model"] if k.endswith(part))
    state["model"][name] = state["model"][name].clone().fill_(1e30)
    tampered = tmp_path / f"tampered-{scheme}.pt"
    save_quantized(tampered, {k: v for k, v in state.items() if k not in ("digest", "format")})
    rc, _, err = cli("sample", str(tampered), "--prompt", "def ", "--max-new-tokens", "3", "--temperature", "0")
    _one_line_error(rc, err, "quantization scale", name)
