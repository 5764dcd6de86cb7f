"""Files a user may have been handed (run directories, checkpoints, sharded states, HF folders) cannot run code, and
a finished run is never changed by resuming it (issue 22, items 1-3).

Each test plants a payload whose `__reduce__` would create a marker file if anything unpickled it, then drives the
load path a user would (resume, sample, export, --init-from) and checks the marker is absent and the refusal is a
one-line UserError naming the file."""

from __future__ import annotations

import ast
import io
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import sqlalchemy as sa
import torch

from archspec.cli import main
from archspec.errors import Caution, UserError
from archspec.train import checkpoint as ckpt
from archspec.train.checkpoint import FORMAT, load_any, load_checkpoint, load_weights, save_checkpoint
from archspec.train.loop import train

ROOT = Path(__file__).resolve().parents[2]


class Payload:
    """Unpickled, it writes the marker file named by $ARCHSPEC_TEST_MARKER (never through a shell)."""

    def __reduce__(self):
        return (exec, (f"open({str(os.environ['ARCHSPEC_TEST_MARKER'])!r}, 'w').write('ran')",))


@pytest.fixture
def marker(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "PAYLOAD-RAN"
    monkeypatch.setenv("ARCHSPEC_TEST_MARKER", str(path))
    return path


def _spec_file(tmp_path: Path, corpus_dir: Path, steps: int = 4) -> Path:
    spec = tmp_path / "tiny.yaml"
    spec.write_text(
        f"name: tiny\nmodel: {{vocab_size: 320, context_length: 32, d_model: 32, n_layers: 1, attention: {{n_heads: 2}}}}\n"
        f"train: {{data: {{corpus: {{kind: files, paths: ['{corpus_dir}']}}}}, batch_size: 2, seq_len: 16, "
        f"steps: {steps}, warmup_steps: 1, eval_tokens: 64, compile: none}}\n")
    return spec


# ── item 1: no file archspec reads can run code ────────────────────────────────────────────────────────────────────

def test_no_archspec_code_unpickles_without_an_allow_list():
    """The class, statically: every torch.load in archspec passes weights_only=True, and the only pickle loader is the
    restricted one for DCP metadata (its find_class is the allow-list)."""
    offenders = []
    for path in (ROOT / "archspec").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            if name.endswith("torch.load"):
                kw = {k.arg: ast.unparse(k.value) for k in node.keywords}
                if kw.get("weights_only") != "True":
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {name} without weights_only=True")
            if name in ("pickle.load", "pickle.loads", "pickle.Unpickler", "marshal.loads", "shelve.open",
                        "numpy.load", "np.load", "dill.load", "joblib.load", "yaml.unsafe_load", "yaml.full_load"):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert offenders == []
    assert ckpt._MetadataUnpickler.find_class is not pickle.Unpickler.find_class


@pytest.mark.parametrize("loader", [load_checkpoint, load_weights, load_any])
def test_a_pickled_payload_in_a_checkpoint_file_does_not_run(tmp_path, marker, loader):
    path = tmp_path / "checkpoint.pt"
    torch.save({"format": FORMAT, "spec_hash": "h", "spec": {}, "model": {"w": Payload()}}, path)
    with pytest.raises(UserError, match="safe load refuses"):
        loader(path)
    assert not marker.exists()


def _sharded_run(tmp_path: Path, corpus_dir: Path) -> tuple[Path, Path]:
    """A run directory whose checkpoint.pt points at a sharded (DCP) state, as an FSDP run writes it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from archspec.spec import load_spec

    spec_path = _spec_file(tmp_path, corpus_dir)
    first = train(load_spec(str(spec_path)), run_dir=tmp_path / "run")
    state = load_checkpoint(first.checkpoint)
    from archspec import codegen

    from archspec.train.optim import build_optimizer

    spec = load_spec(str(spec_path))
    model = codegen.generate(spec, out_dir=tmp_path / "gen").Model()
    model.load_state_dict(state["model"])
    opt = build_optimizer(model, spec.train, torch.device("cpu"))
    opt.load_state_dict(state["optimizer"])
    directory = tmp_path / "run" / ckpt.sharded_dirname(state["step"])
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        ms, os_ = get_state_dict(model, opt)
        dcp.save({"model": ms, "optimizer": os_}, checkpoint_id=str(directory))
    state.update(model={}, optimizer={"state": {}, "param_groups": []}, sharded=directory.name,
                 sharded_metadata_sha256=ckpt.file_sha256(directory / ckpt.METADATA))
    save_checkpoint(first.checkpoint, {k: v for k, v in state.items() if k not in ("format", "digest")})
    return spec_path, directory


def _replant_digest(run: Path, directory: Path) -> None:
    """What an attacker does after editing the sharded state: record its new digest (the digest has no key)."""
    state = load_checkpoint(run)
    state["sharded_metadata_sha256"] = ckpt.file_sha256(directory / ckpt.METADATA)
    save_checkpoint(run / "checkpoint.pt", {k: v for k, v in state.items() if k not in ("format", "digest")})


def test_a_sharded_checkpoint_resumes_through_the_safe_reader(tmp_path, corpus_dir, capsys):
    spec_path, _ = _sharded_run(tmp_path, corpus_dir)
    assert main(["train", str(spec_path), "--resume", str(tmp_path / "run"), "-q", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "FINISHED" and out["step"] == 4


def test_a_payload_in_sharded_metadata_does_not_run_on_resume(tmp_path, corpus_dir, marker, capsys):
    spec_path, directory = _sharded_run(tmp_path, corpus_dir)
    (directory / ckpt.METADATA).write_bytes(pickle.dumps(Payload()))
    _replant_digest(tmp_path / "run", directory)
    assert main(["train", str(spec_path), "--resume", str(tmp_path / "run"), "-q"]) == 2
    err = capsys.readouterr().err
    assert not marker.exists()
    assert "not a safe sharded-checkpoint metadata file" in err and "is not allowed" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_payload_in_a_sharded_value_does_not_run(tmp_path, corpus_dir, marker, capsys):
    """DCP stores non-tensor values (the optimizer's lr, betas) as pickles in the shard files and reads them with
    weights_only=False; archspec's planner reads them with weights_only=True."""
    import torch.distributed.checkpoint as dcp

    spec_path, directory = _sharded_run(tmp_path, corpus_dir)
    from archspec.spec import load_spec
    from archspec import codegen
    from torch.distributed.checkpoint.state_dict import get_state_dict
    import warnings

    from archspec.train.optim import build_optimizer

    spec = load_spec(str(spec_path))
    model = codegen.generate(spec, out_dir=tmp_path / "gen").Model()
    opt = build_optimizer(model, spec.train, torch.device("cpu"))
    model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))[1].backward()
    opt.step()
    ms, os_ = get_state_dict(model, opt)
    os_["param_groups"][0]["lr"] = Payload()
    shutil.rmtree(directory)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": ms, "optimizer": os_}, checkpoint_id=str(directory))
    assert not marker.exists()  # saving pickles, it does not run anything
    _replant_digest(tmp_path / "run", directory)
    assert main(["train", str(spec_path), "--resume", str(tmp_path / "run"), "-q"]) == 2
    err = capsys.readouterr().err
    assert not marker.exists()
    assert "safe load refuses" in err and "Traceback" not in err


def test_a_payload_in_a_shard_tensor_does_not_run(tmp_path, marker):
    """The tensor entries of a shard file are read by DCP with torch.load(weights_only=True): a planted pickle there is
    refused too."""
    from archspec.train.checkpoint import load_sharded

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    import warnings

    directory = tmp_path / "s.dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ms, os_ = get_state_dict(model, opt)
        dcp.save({"model": ms, "optimizer": os_}, checkpoint_id=str(directory))
    shard = next(directory.glob("*.distcp"))
    buf = io.BytesIO()
    torch.save({"x": Payload()}, buf)
    evil = buf.getvalue()
    data = bytearray(shard.read_bytes())
    data[: len(evil)] = evil[: len(data)]  # the first item's bytes replaced by a pickle with a payload
    shard.write_bytes(bytes(data))
    with pytest.raises(UserError):
        load_sharded(tmp_path / "checkpoint.pt", directory, model, opt)
    assert not marker.exists()


def test_hf_folders_read_no_pickles(tmp_path, marker, capsys):
    """An HF folder: config.json and tokenizer.json are JSON, weights are safetensors; a pytorch_model.bin (a pickle)
    or a payload planted as safetensors or JSON is never unpickled."""
    folder = tmp_path / "hf"
    folder.mkdir()
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 16,
              "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
              "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
    (folder / "config.json").write_text(json.dumps(config))
    torch.save({"w": Payload()}, folder / "pytorch_model.bin")
    (folder / "model.safetensors").write_bytes(pickle.dumps(Payload()))
    (folder / "tokenizer.json").write_bytes(pickle.dumps(Payload()))
    rc = main(["import-hf", str(folder), "-o", str(tmp_path / "s.yaml"), "--checkpoint", str(tmp_path / "w.pt")])
    err = capsys.readouterr().err
    assert rc == 2 and not marker.exists() and "Traceback" not in err
    (folder / "config.json").write_bytes(pickle.dumps(Payload()))
    assert main(["import-hf", str(folder), "-o", str(tmp_path / "s.yaml")]) == 2
    assert not marker.exists()


# ── item 3: integrity is not optional ──────────────────────────────────────────────────────────────────────────────

def _trained(tmp_path, make_spec, cache):
    return train(make_spec(steps=2, warmup_steps=1), run_dir=tmp_path / "a", cache=cache)


def test_a_current_checkpoint_downgraded_to_the_old_format_is_refused(tmp_path, make_spec, cache):
    """format edited to /1 and the digest deleted: the structure is not what /1 wrote (a tokenizer, a run id), so it
    is refused, not loaded without verification."""
    first = _trained(tmp_path, make_spec, cache)
    state = load_checkpoint(first.checkpoint)
    state["model"] = {k: torch.full_like(v, 1e30) for k, v in state["model"].items()}
    state.pop("digest")
    state["format"] = "archspec-checkpoint/1"
    torch.save(state, first.checkpoint)
    with pytest.raises(UserError, match="claims the old format .* not what that version wrote"):
        load_checkpoint(first.checkpoint)


def test_an_old_format_checkpoint_of_the_exact_old_structure_loads_with_a_warning(tmp_path, make_spec, cache):
    first = _trained(tmp_path, make_spec, cache)
    state = load_checkpoint(first.checkpoint)
    old = {k: state[k] for k in ckpt.LEGACY_V1_KEYS if k != "format"}
    torch.save({"format": "archspec-checkpoint/1", **old}, first.checkpoint)
    with pytest.warns(Caution, match="no content digest"):
        assert load_checkpoint(first.checkpoint)["step"] == 2
    with pytest.warns(Caution):
        resumed = train(make_spec(steps=2, warmup_steps=1), resume=first.checkpoint, cache=cache)
    assert resumed.status == "FINISHED" and resumed.step == 2


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_are_refused_with_the_tensor_name(tmp_path, make_spec, cache, value):
    first = _trained(tmp_path, make_spec, cache)
    state = load_checkpoint(first.checkpoint)
    name = sorted(state["model"])[-1]
    state["model"][name] = state["model"][name].clone().fill_(value)
    save_checkpoint(first.checkpoint, {k: v for k, v in state.items() if k not in ("format", "digest")})
    for loader in (load_checkpoint, load_weights, load_any):
        with pytest.raises(UserError, match=f"model.{name} holds (NaN|infinite) values"):
            loader(first.checkpoint)


def test_sample_of_a_nan_checkpoint_exits_2(tmp_path, make_spec, cache, capsys):
    first = _trained(tmp_path, make_spec, cache)
    state = load_checkpoint(first.checkpoint)
    name = next(iter(state["model"]))
    state["model"][name] = torch.full_like(state["model"][name], float("nan"))
    save_checkpoint(first.checkpoint, {k: v for k, v in state.items() if k not in ("format", "digest")})
    assert main(["sample", str(first.checkpoint), "--prompt", "a", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "holds NaN values" in err and "Traceback" not in err


# ── item 2: a finished run is never changed ────────────────────────────────────────────────────────────────────────

def _rows(url: str) -> dict[str, list[tuple]]:
    engine = sa.create_engine(url)
    meta = sa.MetaData()
    meta.reflect(engine)
    with engine.connect() as conn:
        out = {name: sorted(map(tuple, conn.execute(sa.select(table)).all()), key=repr)
               for name, table in meta.tables.items()}
    engine.dispose()
    return out


def test_resuming_a_finished_run_is_a_no_op(tmp_path, corpus_dir, capsys):
    spec_path = _spec_file(tmp_path, corpus_dir)
    url = f"sqlite:///{tmp_path}/reg.db"
    assert main(["train", str(spec_path), "--registry", url, "--run-dir", str(tmp_path / "run"), "-q", "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    before = _rows(url)
    db_bytes = (tmp_path / "reg.db").read_bytes()
    ckpt_bytes = (tmp_path / "run" / "checkpoint.pt").read_bytes()
    for extra in ([], ["--json"]):
        assert main(["train", str(spec_path), "--registry", url, "--resume", str(tmp_path / "run"), *extra]) == 0
        captured = capsys.readouterr()
        assert f"run {run_id} already FINISHED; nothing to resume" in captured.err
        if extra:
            assert json.loads(captured.out)["nothing_to_do"] is True
    assert _rows(url) == before
    assert (tmp_path / "reg.db").read_bytes() == db_bytes
    assert (tmp_path / "run" / "checkpoint.pt").read_bytes() == ckpt_bytes


def test_resuming_an_earlier_checkpoint_of_a_finished_run_records_a_repeat(tmp_path, corpus_dir, capsys):
    """A checkpoint from before the end of a run that has since FINISHED (a copy kept aside) trains on as a repeat of
    the experiment: the finished run's rows stay as they were."""
    spec_path = _spec_file(tmp_path, corpus_dir)
    url = f"sqlite:///{tmp_path}/reg.db"
    assert main(["train", str(spec_path), "--registry", url, "--run-dir", str(tmp_path / "run"), "-q",
                 "--set", "train.checkpoint_interval=2", "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    state = load_checkpoint(tmp_path / "run")
    early = tmp_path / "early"
    early.mkdir()
    state["step"] = 2  # as if copied aside at step 2 (the weights do not matter here)
    state["data"]["cursor"] = 0
    save_checkpoint(early / "checkpoint.pt", {k: v for k, v in state.items() if k not in ("format", "digest")})
    finished_before = {t: [r for r in rows if run_id in map(str, r)] for t, rows in _rows(url).items()}
    assert main(["train", str(spec_path), "--registry", url, "--set", "train.checkpoint_interval=2",
                 "--resume", str(early), "-q", "--json"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["run_id"] != run_id and second["status"] == "FINISHED"
    finished_after = {t: [r for r in rows if run_id in map(str, r) and second["run_id"] not in map(str, r)]
                      for t, rows in _rows(url).items()}
    assert finished_after == finished_before
