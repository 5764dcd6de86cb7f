"""`archspec probe RUN --task ...` and training on a task: accuracy recorded through the metrics path, the probe as an
evaluation record beside the run (the run's own record unchanged), `probe.*` filters, bad input exits 2."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from archspec.cli import main
from archspec.registry import Registry

MODEL = "{vocab_size: 320, context_length: 32, d_model: 32, n_layers: 1, attention: {n_heads: 2}}"


def _train(root, name: str, data: str, registry: str, cache) -> str:
    spec = root / f"{name}.yaml"
    spec.write_text(f"name: {name}\nmodel: {MODEL}\ntrain: {{data: {data}, batch_size: 8, seq_len: 32, steps: 4, "
                    "compile: none, warmup_steps: 0, eval_interval: 2, lr: 3.0e-3}\n")
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setenv("ARCHSPEC_CACHE", str(cache))
        rc = main(["train", str(spec), "--json", "-q", "--device", "cpu", "--run-dir", str(root / name),
                   "--registry", registry])
    assert rc == 0
    return json.loads(out.getvalue().strip().splitlines()[-1])["run_id"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus_dir, cache):
    """A run trained on MQAR and one with a BPE tokenizer, in one registry: (mqar id, bpe id, registry URL)."""
    root = tmp_path_factory.mktemp("probe")
    registry = f"sqlite:///{root}/registry.db"
    mqar = _train(root, "mqar", "{corpus: {kind: mqar, vocab: 16, pairs: 4, train_examples: 64, val_examples: 40}}",
                  registry, cache)
    bpe = _train(root, "bpe", f"{{corpus: {{kind: files, paths: ['{corpus_dir}']}}, tokenizer: {{kind: bpe, "
                 "vocab_size: 300}}", registry, cache)
    return mqar, bpe, registry


def _cli(capsys, *args) -> tuple[int, str, str]:
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_training_on_a_task_records_accuracy_and_a_probe_repeats_it_as_an_evaluation(runs, capsys):
    mqar, _, registry = runs
    with Registry(registry) as reg:
        before = reg.get_run(mqar)
    trained = before.metrics["probe.accuracy"]
    assert before.summary["probe.accuracy"] == trained and 0.0 <= trained <= 1.0
    assert before.steps["probe.accuracy"] == 4 and before.best["probe.accuracy"] == before.max["probe.accuracy"]

    rc, out, err = _cli(capsys, "probe", mqar[:8], "--task", "mqar", "--registry", registry, "--device", "cpu",
                        "--json")
    assert rc == 0, err
    result = json.loads(out)
    # The run's own task and weights on its own validation set: the figure training recorded at its last step.
    assert result["metrics"]["accuracy"] == pytest.approx(trained)
    assert result["params"]["pairs"] == 4 and result["params"]["seq_len"] == 32 and result["metrics"]["answers"] == 160

    rc, out, err = _cli(capsys, "probe", mqar, "--task", "mqar", "--pairs", "2", "--queries", "1", "--examples", "10",
                        "--registry", registry, "--device", "cpu", "--json")
    assert rc == 0, err
    assert json.loads(out)["metrics"]["answers"] == 10
    with Registry(registry) as reg:
        after = reg.get_run(mqar)
        evaluations = reg.evaluations(mqar)
        assert (after.status, after.metrics, after.summary, after.ended) == (before.status, before.metrics,
                                                                              before.summary, before.ended)
        assert [e["task"] for e in evaluations] == ["mqar", "mqar"] and evaluations[1]["params"]["pairs"] == 2
        latest = evaluations[1]["metrics"]["accuracy"]
        assert after.probes["accuracy"] == after.probes["mqar.accuracy"] == latest  # the latest probe counts
        assert [r.id for r in reg.runs(where=f"probe.accuracy = {latest!r}")] == [mqar]
        assert [r.id for r in reg.runs(where="probe.mqar.answers = 10 and metrics.probe.accuracy >= 0")] == [mqar]
        assert reg.runs(where="probe.answers = 160") == []  # an older probe's figure is not the run's now
        assert reg.runs(where="probe.passkey.accuracy >= 0") == []
        assert [r.id for r in reg.runs(where="probe.accuracy is null")] == [runs[1]]

    rc, out, err = _cli(capsys, "runs", "list", "--registry", registry, "--where", "probe.acuracy > 0.5")
    assert rc == 2 and "did you mean probe.accuracy?" in err
    rc, out, err = _cli(capsys, "runs", "show", mqar, "--registry", registry)
    assert rc == 0 and "probes" in out and "pairs=2" in out


@pytest.mark.parametrize("args, message", [
    (["--task", "passkey", "--distances", "8,40"], "passkey.distances.1: impossible distance 40: with seq_len = 32"),
    (["--task", "passkey", "--seq-len", "64"], "--seq-len: must be at most the run's model.context_length (32)"),
    (["--task", "mqar", "--pairs", "9", "--vocab", "16"], "mqar.pairs: must be at most vocab // 2 (8"),
    (["--task", "mqar", "--distances", "8"], "--task mqar has no --distances"),
    (["--task", "passkey", "--vocab", "1"], "passkey.vocab: Input should be greater than or equal to 2"),
])
def test_bad_probes_exit_2_with_the_reason_and_record_nothing(runs, capsys, args, message):
    mqar, _, registry = runs
    with Registry(registry) as reg:
        count = len(reg.evaluations(mqar))
    rc, out, err = _cli(capsys, "probe", mqar, *args, "--registry", registry, "--device", "cpu")
    assert rc == 2 and message in err and "Traceback" not in err
    with Registry(registry) as reg:
        assert len(reg.evaluations(mqar)) == count


def test_a_probe_of_a_bpe_run_or_an_unknown_run_exits_2(runs, capsys, tmp_path):
    _, bpe, registry = runs
    rc, _, err = _cli(capsys, "probe", bpe, "--task", "passkey", "--registry", registry, "--device", "cpu")
    assert rc == 2 and "uses a bpe tokenizer" in err and "byte" in err
    rc, _, err = _cli(capsys, "probe", "feedfacecafe", "--task", "mqar", "--registry", registry)
    assert rc == 2 and "no run 'feedfacecafe'" in err
    rc, _, err = _cli(capsys, "probe", "feedfacecafe", "--task", "mqar", "--registry", f"sqlite:///{tmp_path}/none.db")
    assert rc == 2 and "no registry" in err and not (tmp_path / "none.db").exists()
