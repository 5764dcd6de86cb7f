"""Logger sinks (archspec.train.sinks): TensorBoard, W&B (offline), MLflow (a file store) each receive the params,
metrics and summary the registry got; a failing sink never fails the run; a missing extra exits 2 naming it."""

from __future__ import annotations

import glob
import importlib.util
import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
import yaml

from archspec.cli import main
from archspec.errors import UserError
from archspec.registry import Registry
from archspec.spec.train import LogSink
from archspec.train import sinks as sinks_module
from archspec.train.sinks import SINKS, Sink, parse_log_to

from .conftest import tiny_spec_dict


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


needs = {name: pytest.mark.skipif(not _installed(name), reason=f"{name} is not installed: pip install "
                                                                 f"'archspec[{name}]'")
         for name in ("tensorboard", "wandb", "mlflow")}


@pytest.fixture
def spec_file(tmp_path, corpus_dir) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_spec_dict(corpus_dir, steps=3, eval_interval=2, batch_size=2,
                                                  eval_tokens=64)))
    return path


def _train(spec_file: Path, tmp_path: Path, capsys, *args: str) -> tuple[dict, str]:
    code = main(["train", str(spec_file), "--no-compile", "--json", "-q", "--device", "cpu",
                 "--run-dir", str(tmp_path / "run"), *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "warning:" not in err or "log_metrics failed" in err, err  # only the failing sink's test warns
    return json.loads(out), err


def _recorded(run_id: str, tmp_path: Path):
    """What the registry got: (params, {metric: [(step, value)]}, summary)."""
    registry = Registry(f"sqlite:///{tmp_path}/registry.db")  # the autouse fixture's registry
    run = registry.get_run(run_id)
    history = {k: [(p.step, p.value) for p in points] for k, points in registry.metric_histories(run_id).items()}
    assert run.status == "FINISHED" and history and run.summary
    return run.params, history, run.summary


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _same_history(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert len(got[key]) == len(want[key]) and all(
            s1 == s2 and _same(v1, v2) for (s1, v1), (s2, v2) in zip(sorted(got[key]), want[key])), key


def _same_summary(got: dict, want: dict) -> None:
    assert got.keys() == want.keys() and all(_same(float(got[k]), want[k]) for k in want), (got, want)


# ── choosing sinks ───────────────────────────────────────────────────────────────────────────────────────────────


def test_log_to_names_the_sinks_once_each_in_order():
    assert tuple(SINKS) == sinks_module.SINK_NAMES == LogSink.__args__
    assert parse_log_to(None) is None and parse_log_to("none") == () == parse_log_to("")
    assert parse_log_to(" MLflow,tensorboard,mlflow ") == ("mlflow", "tensorboard")
    with pytest.raises(UserError, match="unknown sink 'neptune'"):
        parse_log_to("tensorboard,neptune")


def test_an_unknown_sink_is_a_usage_error(spec_file, capsys):
    assert main(["train", str(spec_file), "--log-to", "tensorboard,neptune"]) == 2
    assert "unknown sink 'neptune'" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["flag", "recipe"])
def test_a_missing_extra_exits_2_naming_it_before_anything_is_recorded(spec_file, tmp_path, capsys, monkeypatch,
                                                                       how):
    real = importlib.util.find_spec
    monkeypatch.setattr(sinks_module.importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    args = ["--log-to", "tensorboard,wandb"] if how == "flag" else ["--set", "train.log_to=[wandb]"]
    assert main(["train", str(spec_file), "--no-compile", "-q", "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err
    assert "pip install 'archspec[wandb]'" in err and "tensorboard" not in err.split("pip install")[1]
    assert not Registry(f"sqlite:///{tmp_path}/registry.db").runs()


class _Recording(Sink):
    """A sink that keeps what it gets, for the fan-out's own tests (no package needed)."""

    name = "tensorboard"
    got: list = []

    def start(self, info, run_id, params):
        self.params, self.history, self.summary = dict(params), {}, {}
        _Recording.got.append(self)

    def log_metrics(self, step, metrics):
        for k, v in metrics.items():
            self.history.setdefault(k, []).append((step, v))

    def set_summary(self, last_step, summary):
        self.summary.update(summary)

    def end(self, status, error):
        self.status = status


def test_the_fan_out_gives_each_sink_what_the_registry_got_and_the_recipe_can_choose(spec_file, tmp_path, capsys,
                                                                                     monkeypatch):
    monkeypatch.setitem(SINKS, "tensorboard", _Recording)
    monkeypatch.setitem(sinks_module._MODULES, "tensorboard", "json")  # "installed" without tensorboard
    _Recording.got = []
    result, _ = _train(spec_file, tmp_path, capsys, "--set", "train.log_to=[tensorboard]", "--steps", "3")
    (sink,) = _Recording.got
    params, history, summary = _recorded(result["run_id"], tmp_path)
    assert sink.params == params and params["train.log_to"] == ["tensorboard"] and sink.status == "FINISHED"
    _same_history(sink.history, history)
    _same_summary(sink.summary, summary)
    # --log-to none overrides the recipe; the run key never depends on where it is logged
    code = main(["train", str(spec_file), "--no-compile", "--json", "-q", "--device", "cpu", "--log-to", "none",
                 "--run-dir", str(tmp_path / "run2"), "--steps", "3"])
    again = json.loads(capsys.readouterr().out)
    assert code == 0 and len(_Recording.got) == 1
    assert Registry(f"sqlite:///{tmp_path}/registry.db").get_run(again["run_id"]).tags.get("repeat_of") == \
        result["run_id"]


class _Broken(_Recording):
    def log_metrics(self, step, metrics):
        raise OSError(28, "No space left on device")


def test_a_failing_sink_is_said_once_and_the_run_and_its_record_go_on(spec_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(SINKS, "tensorboard", _Broken)
    monkeypatch.setitem(sinks_module._MODULES, "tensorboard", "json")
    _Recording.got = []
    result, err = _train(spec_file, tmp_path, capsys, "--log-to", "tensorboard")
    assert result["status"] == "FINISHED"
    lines = [line for line in err.splitlines() if "tensorboard" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: tensorboard: log_metrics failed") \
        and "No space left on device" in lines[0], err
    params, history, summary = _recorded(result["run_id"], tmp_path)
    assert len(history["train_loss"]) == 3 and "val_loss" in summary  # the registry has everything


# ── each sink, read back with its own tools ──────────────────────────────────────────────────────────────────────


@needs["tensorboard"]
def test_tensorboard_event_files_hold_what_the_registry_got(spec_file, tmp_path, capsys, monkeypatch):
    """Metrics and the summary as scalar summaries: what TensorBoard's scalar dashboard and EventAccumulator.Scalars()
    read (float32 there; the registry holds the exact values); params, artifacts and the status as texts."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("ARCHSPEC_TENSORBOARD_DIR", str(tmp_path / "tb"))
    result, _ = _train(spec_file, tmp_path, capsys, "--log-to", "tensorboard")
    params, history, summary = _recorded(result["run_id"], tmp_path)
    (logdir,) = (tmp_path / "tb").iterdir()
    assert logdir.name == f"tiny-{result['run_id']}"
    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    text = lambda tag: acc.Tensors(tag)[0].tensor_proto.string_val[0].decode()  # noqa: E731
    assert json.loads(text("params/text_summary")) == params
    f32 = lambda v: float(np.float32(v))  # noqa: E731
    metric_tags = [t for t in scalars if not t.startswith("summary/")]
    got = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in metric_tags}
    _same_history(got, {k: [(s, f32(v)) for s, v in points] for k, points in history.items()})
    _same_summary({t.removeprefix("summary/"): acc.Scalars(t)[-1].value for t in scalars if t.startswith("summary/")},
                  {k: f32(v) for k, v in summary.items()})
    assert text("status/text_summary") == "FINISHED"
    assert acc.Scalars("summary/val_loss")[-1].step == 3


def _wandb_records(path: Path):
    """The records of an offline W&B run file (LevelDB log blocks of protobuf records), as `wandb sync` reads it."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, chunks, part = path.read_bytes(), 7, 32768, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (kind == 0 and length == 0):
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        part = chunk if kind in (1, 2) else part + chunk
        if kind in (1, 4):
            chunks.append(part)
    for chunk in chunks:
        record = pb.Record()
        record.ParseFromString(chunk)
        yield record


@needs["wandb"]
def test_wandb_offline_run_holds_what_the_registry_got(spec_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_PROJECT", "sinks-test")
    result, _ = _train(spec_file, tmp_path, capsys, "--log-to", "wandb")
    params, history, summary = _recorded(result["run_id"], tmp_path)
    (path,) = glob.glob(str(tmp_path / "wb" / "wandb" / "offline-run-*" / "*.wandb"))
    config, got, final, exit_code, run = {}, {}, {}, None, None
    for record in _wandb_records(Path(path)):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            config.update({u.key: json.loads(u.value_json) for u in run.config.update})
        elif kind == "config":
            config.update({u.key: json.loads(u.value_json) for u in record.config.update})
        elif kind == "history":
            items = {(u.key or ".".join(u.nested_key)): json.loads(u.value_json) for u in record.history.item}
            for k, v in items.items():
                if not k.startswith("_"):
                    got.setdefault(k, []).append((int(items["_step"]), float(v)))
        elif kind == "summary":
            final.update({(u.key or ".".join(u.nested_key)): json.loads(u.value_json)
                          for u in record.summary.update})
        elif kind == "exit":
            exit_code = record.exit.exit_code
    assert run.display_name == result["run_id"] and run.project == "sinks-test"
    assert {k: v for k, v in config.items() if not k.startswith("_")} == params
    _same_history(got, history)
    _same_summary({k: final[k] for k in summary}, summary)  # the run's summary: ours last, over the history's
    assert exit_code == 0


@needs["mlflow"]
def test_mlflow_file_store_holds_what_the_registry_got(spec_file, tmp_path, capsys, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this to use a file store
    result, _ = _train(spec_file, tmp_path, capsys, "--log-to", "mlflow")
    params, history, summary = _recorded(result["run_id"], tmp_path)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("archspec")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == result["run_id"] and run.info.status == "FINISHED"
    assert run.data.tags["archspec.run_id"] == result["run_id"]
    assert run.data.params == {k: v if isinstance(v, str) else json.dumps(v, sort_keys=True) for k, v in params.items()}
    keys = run.data.metrics.keys()
    _same_history({k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)]
                   for k in keys if not k.startswith("summary/")}, history)
    _same_summary({k.removeprefix("summary/"): run.data.metrics[k] for k in keys if k.startswith("summary/")},
                  summary)
    assert run.data.tags["archspec.artifact.checkpoint"] == str(tmp_path / "run" / "checkpoint.pt")


@needs["tensorboard"]
def test_ablate_log_to_sends_every_run_of_the_sweep(spec_file, tmp_path, capsys, monkeypatch, corpus_dir):
    monkeypatch.setenv("ARCHSPEC_TENSORBOARD_DIR", str(tmp_path / "tb"))
    monkeypatch.chdir(tmp_path)  # the report lands in reports/ here
    base = tiny_spec_dict(corpus_dir, batch_size=2, eval_interval=2, eval_tokens=64)
    sweep = tmp_path / "mini.yaml"
    sweep.write_text(yaml.safe_dump({"name": "mini", "base": base, "seeds": [0], "budget": {"steps": 2},
                                     "grid": {"model.norm.kind": ["layernorm", "rmsnorm"]}}))
    assert main(["ablate", str(sweep), "--no-compile", "--device", "cpu", "--json", "--log-to", "tensorboard"]) == 0, \
        capsys.readouterr().err
    runs = Registry(f"sqlite:///{tmp_path}/registry.db").runs(where="sweep = 'mini'")
    assert len(runs) == 2 and sorted(p.name.rsplit("-", 1)[1] for p in (tmp_path / "tb").iterdir()) == \
        sorted(r.id for r in runs)
