"""Writes stay where the user named them (issue 42): import-hf's spec and checkpoint, export-hf's directory and a
quantized checkpoint go through archspec.paths.new_output — never through a link (dangling or not), never over
something that exists, the directory resolved once so the write lands where the check looked."""

from __future__ import annotations

import json

import pytest

from archspec.cli import main
from archspec.errors import UserError


LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 16,
         "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False}


def _config(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(LLAMA))
    return src


@pytest.mark.parametrize("flag", ["-o", "--checkpoint"])
@pytest.mark.parametrize("target", ["dangling", "existing"])
def test_import_hf_never_writes_through_a_link(tmp_path, capsys, flag, target):
    src = _config(tmp_path)
    aim = tmp_path / "elsewhere" / "target"
    aim.parent.mkdir()
    if target == "existing":
        aim.write_text("precious")
    link = tmp_path / "out.link"
    link.symlink_to(aim)
    args = ["-o", str(link)] if flag == "-o" else ["-o", str(tmp_path / "s.yaml"), "--checkpoint", str(link)]
    assert main(["import-hf", str(src), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a link" in err and len(err.splitlines()) == 1
    assert (aim.read_text() == "precious") if target == "existing" else not aim.exists()
    assert not (tmp_path / "s.yaml").exists()


def test_export_hf_never_writes_through_a_link_to_an_empty_directory(tmp_path, capsys):
    from archspec.codegen import generate
    from archspec.spec import canonical_dict, load_spec_dict, model_hash
    from archspec.train.checkpoint import save_weights

    spec = load_spec_dict({"name": "x", "model": {"vocab_size": 64, "context_length": 16, "d_model": 32,
                                                  "n_layers": 1, "attention": {"n_heads": 4}}})
    save_weights(tmp_path / "x.pt", canonical_dict(spec), model_hash(spec),
                 generate(spec, write=False).Model().state_dict())
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "o").symlink_to(empty)
    assert main(["export-hf", str(tmp_path / "x.pt"), "-o", str(tmp_path / "o")]) == 2
    assert "link" in capsys.readouterr().err and list(empty.iterdir()) == []
    assert main(["export-hf", str(tmp_path / "x.pt"), "-o", str(tmp_path / "real")]) == 0  # a new path: written
    assert (tmp_path / "real" / "config.json").is_file()


def test_new_output_resolves_the_directory_and_refuses_links(tmp_path):
    from archspec.paths import new_output

    real = tmp_path / "disk"
    real.mkdir()
    (tmp_path / "via").symlink_to(real)
    assert new_output(tmp_path / "via" / "f.yaml", "spec") == real / "f.yaml"
    (real / "f.yaml").write_text("x")
    with pytest.raises(UserError, match="already exists"):
        new_output(tmp_path / "via" / "f.yaml", "spec")
    assert new_output(tmp_path / "via" / "f.yaml", "spec", replace=True) == real / "f.yaml"
    (real / "l.pt").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UserError, match="is a link"):
        new_output(real / "l.pt", "quantized checkpoint", replace=True)
