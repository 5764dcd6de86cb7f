"""State goes where the user expects (issue 22, item 6): a project root or a per-user directory, never whatever
directory a command was started from; caches and machine facts per user; `build --set` never rewrites generated/."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from archspec import paths
from archspec.cli import main
from archspec.train import throughput

ROOT = Path(__file__).resolve().parents[2]


def _spec(tmp_path: Path, corpus_dir: Path) -> Path:
    spec = tmp_path / "specdir" / "tiny.yaml"
    spec.parent.mkdir()
    spec.write_text(
        f"name: tiny\nmodel: {{vocab_size: 320, context_length: 32, d_model: 32, n_layers: 1, attention: {{n_heads: 2}}}}\n"
        f"train: {{data: {{corpus: {{kind: files, paths: ['{corpus_dir}']}}}}, batch_size: 2, seq_len: 16, "
        f"steps: 2, warmup_steps: 1, eval_tokens: 64, compile: none}}\n")
    return spec


def test_outside_a_project_state_goes_to_the_per_user_directory(tmp_path, corpus_dir, monkeypatch, capsys):
    for name in ("ARCHSPEC_REGISTRY", "ARCHSPEC_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    spec = _spec(tmp_path, corpus_dir)
    cwd = tmp_path / "somewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert main(["train", str(spec), "-q", "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert list(cwd.iterdir()) == []  # nothing in the directory it was started from
    home = tmp_path / "data" / "archspec"
    assert (home / "registry" / "archspec.db").is_file()
    assert Path(out["run_dir"]).is_absolute() and Path(out["run_dir"]).parent == home / "runs"
    assert captured.err.count(f"note: archspec keeps its registry and runs under {home}") == 1
    assert main(["runs", "list"]) == 0  # the same registry from anywhere
    assert out["run_id"] in capsys.readouterr().out


def test_a_subdirectory_of_a_project_uses_the_projects_state(tmp_path, corpus_dir, monkeypatch, capsys):
    for name in ("ARCHSPEC_REGISTRY", "ARCHSPEC_HOME"):
        monkeypatch.delenv(name, raising=False)
    project = tmp_path / "project"
    (project / "specs").mkdir(parents=True)
    (project / "notes" / "deep").mkdir(parents=True)
    monkeypatch.chdir(project / "notes" / "deep")
    assert main(["train", str(_spec(tmp_path, corpus_dir)), "-q", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (project / "registry" / "archspec.db").is_file()
    assert Path(out["run_dir"]).parent == project / "runs"
    assert list((project / "notes" / "deep").iterdir()) == []


def test_pyproject_with_an_archspec_table_marks_a_project(tmp_path, monkeypatch):
    monkeypatch.delenv("ARCHSPEC_HOME", raising=False)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n\n[tool.archspec]\n")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert paths.state_root()[0] == tmp_path
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert paths.project_root() is None or paths.project_root() != tmp_path


def test_the_cache_is_per_user(monkeypatch, tmp_path):
    monkeypatch.delenv("ARCHSPEC_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "c"))
    monkeypatch.chdir(tmp_path)
    from archspec.cache import cache_dir

    assert cache_dir() == tmp_path / "c" / "archspec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert paths.user_cache_dir() == tmp_path / "h" / ".cache" / "archspec"


def test_build_with_overrides_never_rewrites_generated(monkeypatch, capsys, tmp_path):
    """`build specs/<preset>.yaml --set ...` once rewrote the committed generated/<preset>.py."""
    monkeypatch.setenv("ARCHSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(ROOT)
    committed = (ROOT / "generated" / "gpt2-tiny.py").read_bytes()
    assert main(["build", "specs/gpt2-tiny.yaml", "--set", "model.n_layers=1", "--json", "--no-record"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert (ROOT / "generated" / "gpt2-tiny.py").read_bytes() == committed
    assert Path(out["generated"]).parent.parent == tmp_path / "home" / "builds"
    assert f"its module goes to {out['generated']}" in captured.err


def test_a_ceiling_measured_under_load_is_stored_flagged_and_only_rises(tmp_path, monkeypatch):
    monkeypatch.setattr(throughput, "machine_busy", lambda: True)
    monkeypatch.setattr(throughput, "_REMEASURED", set())
    monkeypatch.setattr(throughput, "measure_matmul_flops", lambda *a, **k: 1e9)
    flops, source = throughput.peak_flops(torch.device("cpu"), torch.float32, tmp_path)
    assert flops == 1e9 and "measured under load" in source and "no run lowers it" in source
    assert (tmp_path / throughput.CEILING_FILE).exists()
    monkeypatch.setattr(throughput, "machine_busy", lambda: False)
    flops, source = throughput.peak_flops(torch.device("cpu"), torch.float32, tmp_path)
    assert "provisional" not in source and (tmp_path / throughput.CEILING_FILE).is_file()
    monkeypatch.setattr(throughput, "measure_matmul_flops", lambda *a, **k: math.nan)  # never measured again
    assert throughput.peak_flops(torch.device("cpu"), torch.float32, tmp_path)[0] == 1e9


@pytest.mark.parametrize("mfu, palm", [(1.52, 1.6), (0.9, 1.01), (2.0, None)])
def test_an_mfu_above_100_percent_is_never_printed_as_a_figure(mfu, palm):
    from archspec.train.metrics import mfu_text

    m = {"mfu": mfu, **({"mfu_palm": palm} if palm is not None else {})}
    text = mfu_text("this machine's measured matmul rate (x)", m)
    assert "MFU not shown: above 100%" in text and "152" not in text and "%" not in text.replace("100%", "")


# ── item 4: artifacts resolve from anywhere ────────────────────────────────────────────────────────────────────────

def test_a_runs_checkpoint_resolves_from_any_directory(tmp_path, corpus_dir, monkeypatch, capsys):
    """The registry stored checkpoint paths relative to where the run started: `export-hf RUN_ID` (and sample,
    probe) failed from any other directory."""
    url = f"sqlite:///{tmp_path}/reg.db"
    start = tmp_path / "started-here"
    start.mkdir()
    monkeypatch.chdir(start)
    assert main(["train", str(_spec(tmp_path, corpus_dir)), "--registry", url, "--run-dir", "rel/run", "-q",
                 "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    from archspec.registry import Registry

    with Registry(url) as reg:
        paths_ = [p for _, p in reg.artifacts(run_id)]
    assert paths_ and all(Path(p).is_absolute() for p in paths_)
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    assert main(["export-hf", run_id, "-o", str(tmp_path / "hf"), "--registry", url]) == 0
    assert (tmp_path / "hf" / "config.json").is_file()
    capsys.readouterr()
    assert main(["sample", run_id, "--prompt", "ab", "--max-new-tokens", "2", "--registry", url]) == 0
    capsys.readouterr()


def test_a_checkpoint_recorded_on_another_host_names_host_and_path(tmp_path, corpus_dir, monkeypatch, capsys):
    url = f"sqlite:///{tmp_path}/reg.db"
    assert main(["train", str(_spec(tmp_path, corpus_dir)), "--registry", url, "--run-dir", str(tmp_path / "run"),
                 "-q", "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE runs SET host = 'gpu-node-17' WHERE id = :id"), {"id": run_id})
    engine.dispose()
    (tmp_path / "run" / "checkpoint.pt").rename(tmp_path / "moved.pt")
    for argv in (["export-hf", run_id, "-o", str(tmp_path / "hf")], ["sample", run_id, "--prompt", "a"],
                 ["probe", run_id, "--task", "mqar", "--no-record"]):
        assert main([*argv, "--registry", url]) == 2
        err = capsys.readouterr().err
        assert "gpu-node-17" in err and str(tmp_path / "run" / "checkpoint.pt") in err and "Traceback" not in err


def test_tables_never_show_an_mfu_above_100_percent_as_a_figure():
    from archspec.cli.registry import _fmt

    assert _fmt("summary.mfu", 1.52) == "above ceiling" and _fmt("metrics.last.mfu_palm", 3.0) == "above ceiling"
    assert _fmt("summary.mfu", 0.469) == "0.469" and _fmt("summary.mfu_above_ceiling", 1.0) == "1"
