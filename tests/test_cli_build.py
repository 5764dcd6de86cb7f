"""`archspec build` / `schema` through the real CLI entry point: output contract and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from archspec.cli import main

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "specs" / "llama-like-tiny.yaml"


def run(capsys, *args):
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_build_json_is_exactly_the_contract(tmp_path, capsys):
    rc, out, err = run(capsys, "build", str(TINY), "--json", "--out", str(tmp_path), "--no-record")
    assert rc == 0
    obj = json.loads(out)  # exactly one JSON object on stdout
    assert set(obj) == {"name", "model_hash", "generated", "params", "flops_per_token", "kv_cache_bytes_per_token",
                        "kv_cache_bytes_per_sequence"}
    assert set(obj["params"]) == {"total", "active", "embedding", "by_component"}
    assert set(obj["flops_per_token"]) == {"forward", "train", "attention"}
    ints = [obj["params"][k] for k in ("total", "active", "embedding")] + list(obj["params"]["by_component"].values())
    ints += list(obj["flops_per_token"].values()) + [obj["kv_cache_bytes_per_token"], obj["kv_cache_bytes_per_sequence"]]
    assert all(type(v) is int for v in ints)
    assert obj["generated"] == str(tmp_path / "llama-like-tiny.py")
    # the generated module's parameter count equals params.total
    from archspec.codegen import import_source

    model = import_source(Path(obj["generated"])).Model()
    assert sum(p.numel() for p in model.parameters()) == obj["params"]["total"]
    # and the KV cache one sequence needs is what the module allocates, in bf16
    cache = model.new_cache(1, dtype=torch.bfloat16)
    assert sum(c.nbytes for c in cache) == obj["kv_cache_bytes_per_sequence"]


def test_build_table_and_overrides(tmp_path, capsys):
    rc, out, _ = run(capsys, "build", str(TINY), "--out", str(tmp_path), "--no-record",
                     "--set", "model.attention.n_kv_heads=1", "--set", "name=tiny-mqa")
    assert rc == 0
    for word in ("component", "attention", "ffn", "total", "KV cache", "tiny-mqa"):
        assert word in out
    assert (tmp_path / "tiny-mqa.py").exists()
    assert "N_KV_HEADS = 1  # 1: multi-query attention" in (tmp_path / "tiny-mqa.py").read_text()


@pytest.mark.parametrize("args,needle", [
    (["--set", "model.attention.n_kv_heads=3"], "model.attention.n_kv_heads: must divide n_heads (4), got 3"),
    (["--set", "model.d_model=-1", "--set", "model.oops=2"], "model.oops: unknown field"),
    (["--set", "nonsense"], "expected KEY=VALUE"),
])
def test_build_invalid_exits_2_with_message(tmp_path, capsys, args, needle):
    rc, out, err = run(capsys, "build", str(TINY), "--out", str(tmp_path), "--no-record", *args)
    assert rc == 2 and needle in err and "Traceback" not in err + out


def test_build_missing_file_and_bad_option(capsys):
    assert run(capsys, "build", "does/not/exist.yaml")[0] == 2
    rc, _, err = run(capsys, "build", str(TINY), "--frobnicate")
    assert rc == 2 and "No such option" in err


def test_console_script_exit_code_no_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: ok\nmodel: {attention: {n_heads: 8, n_kv_heads: 3}, d_model: 64}\n")
    proc = subprocess.run([sys.executable, "-m", "archspec", "build", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {bad}: invalid spec: model.attention.n_kv_heads: must divide n_heads (8), got 3",
    ]


def test_schema_command(capsys):
    rc, out, _ = run(capsys, "schema")
    assert rc == 0 and json.loads(out)["title"] == "archspec spec"


@pytest.mark.slow
def test_build_compile_reports_time(tmp_path, capsys):
    rc, out, err = run(capsys, "build", str(TINY), "--out", str(tmp_path), "--no-record", "--compile")
    assert rc == 0 and "torch.compile per block" in out


def test_build_refuses_a_vocab_the_recipe_cannot_train(tmp_path, capsys):
    """The byte tokenizer needs 257 ids: build says so at the field, before generating, as train would after
    tokenising; a BPE recipe of its own vocabulary trains a small model and builds."""
    rc, out, err = run(capsys, "build", str(TINY), "--set", "model.vocab_size=100", "--out", str(tmp_path),
                       "--no-record")
    assert rc == 2 and "model.vocab_size: must be at least 257 for train.data.tokenizer (byte" in err
    assert "got 100" in err and "Traceback" not in err and not list(tmp_path.iterdir())
    rc, _, err = run(capsys, "build", str(TINY), "--set", "model.vocab_size=257", "--out", str(tmp_path),
                     "--no-record")
    assert rc == 0, err


def test_build_of_a_spec_outside_specs_writes_next_to_it_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my").mkdir()
    spec = tmp_path / "my" / "spec.yaml"
    spec.write_text(TINY.read_text())
    rc, out, err = run(capsys, "build", "my/spec.yaml", "--no-record")
    assert rc == 0, err
    assert (tmp_path / "my" / "llama-like-tiny.py").exists() and not (tmp_path / "generated").exists()
    assert "not in ./specs/, so its module goes next to it" in " ".join(out.split())
    rc, out, err = run(capsys, "build", "my/spec.yaml", "--no-record", "--out", "elsewhere", "--json")
    assert rc == 0 and json.loads(out)["generated"] == "elsewhere/llama-like-tiny.py"
    # a spec in ./specs/ still goes to generated/
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "t.yaml").write_text(TINY.read_text())
    rc, _, err = run(capsys, "build", "specs/t.yaml", "--no-record")
    assert rc == 0, err
    assert (tmp_path / "generated" / "llama-like-tiny.py").exists()


def test_check_fix_touches_only_what_specs_generate(tmp_path, capsys, monkeypatch):
    """A user's own file and a build of a spec kept elsewhere survive `check --fix`; a module whose spec in specs/
    is gone is reported, and left for the user to delete."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "t.yaml").write_text(TINY.read_text())
    (tmp_path / "my").mkdir()
    (tmp_path / "my" / "mine.yaml").write_text(TINY.read_text().replace("name: llama-like-tiny", "name: mine"))
    assert run(capsys, "build", "my/mine.yaml", "--no-record", "--out", "generated")[0] == 0
    (tmp_path / "generated" / "notes.py").write_text("# my own helper\n")
    gone = tmp_path / "specs" / "old.yaml"
    gone.write_text(TINY.read_text().replace("name: llama-like-tiny", "name: old"))
    assert run(capsys, "build", "specs/old.yaml", "--no-record")[0] == 0
    gone.unlink()
    rc, out, err = run(capsys, "check", "--fix")
    assert rc == 1
    assert "fixed generated/llama-like-tiny.py" in out
    assert "generated/old.py: generated from specs/old.yaml, which no longer exists" in err
    for name in ("mine.py", "notes.py", "old.py"):
        assert (tmp_path / "generated" / name).exists(), name
    assert "generated/mine.py: no spec in specs/ generates it; left alone" in err
