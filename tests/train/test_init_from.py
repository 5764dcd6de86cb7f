"""`archspec train SPEC --init-from CHECKPOINT`: fine-tuning from imported (or trained) weights (issue 16)."""

from __future__ import annotations

import json

import pytest
import torch

from archspec.cli import main
from archspec.registry import Registry

transformers = pytest.importorskip("transformers")


def _imported(tmp_path, capsys):
    config = transformers.LlamaConfig(vocab_size=320, max_position_embeddings=32, hidden_size=32,
                                      intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    hf = transformers.LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=g) + (1.0 if p.ndim == 1 else 0.0))
    hf.save_pretrained(tmp_path / "hf")
    spec, ckpt = tmp_path / "imported.yaml", tmp_path / "imported.pt"
    assert main(["import-hf", str(tmp_path / "hf"), "-o", str(spec), "--checkpoint", str(ckpt)]) == 0
    capsys.readouterr()
    return spec, ckpt


def _train(spec, corpus_dir, run_dir, *extra):
    return main(["train", str(spec), "--steps", "1", "--no-compile", "--json", "-q", "--device", "cpu",
                 "--run-dir", str(run_dir), "--set", f"train.data.corpus={{kind: files, paths: ['{corpus_dir}']}}",
                 "--set", "train.batch_size=2", "--set", "train.eval_tokens=64", "--set", "train.lr=1e-9", *extra])


def test_train_starts_from_the_imported_weights_and_only_those(tmp_path, capsys, corpus_dir):
    spec, ckpt = _imported(tmp_path, capsys)
    assert _train(spec, corpus_dir, tmp_path / "run", "--init-from", str(ckpt)) == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out)
    start = torch.load(ckpt, weights_only=True)["model"]
    after = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["model"]
    # one step at lr 1e-9 moves nothing measurably: the run began at the imported weights, not a fresh init
    for name, value in start.items():
        torch.testing.assert_close(after[name], value, atol=1e-6, rtol=0)

    run = Registry().get_run(result["run_id"])  # the autouse fixture's registry
    assert isinstance(run.recipe.get("init_from"), str)  # the starting weights are part of the run's identity
    assert _train(spec, corpus_dir, tmp_path / "fresh") == 0
    fresh = json.loads(capsys.readouterr().out)
    assert fresh["run_id"] != result["run_id"]
    assert max((torch.load(tmp_path / "fresh" / "checkpoint.pt", weights_only=True)["model"][k] - v).abs().max()
               for k, v in start.items()) > 0.05

    # weights of another architecture are refused by field; a weights checkpoint is not a run to resume
    code = _train(spec, corpus_dir, tmp_path / "run", "--init-from", str(ckpt), "--set", "model.d_model=64")
    err = capsys.readouterr().err
    assert code == 2 and "another architecture" in err and "model.d_model: weights 32, spec 64" in err, err
    code = main(["train", str(spec), "--resume", str(ckpt)])
    assert code == 2 and "--init-from" in capsys.readouterr().err  # a weights checkpoint cannot be resumed
