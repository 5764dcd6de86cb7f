"""`archspec probe RUN --task mqar|passkey`: a capability probe of a trained run, recorded as an evaluation of it.

    result = probe_run("1a2b3c4d", "passkey", {"distances": [16, 64]})
    result.metrics["accuracy"], result.metrics["accuracy.d64"], result.evaluation_id

The task's examples are those of `archspec.train.tasks` (the validation stream: a run trained on the same task with
the same parameters is probed on exactly its own validation set, so the probe repeats its `metrics.probe.accuracy`).
Parameters default to the run's own task when it trained on one of that kind, else to the task's defaults, at the
run's train.seq_len. The result goes into the registry's `evaluations` (queryable as `probe.<key>`); the run's own
record (status, metrics, summary) is never touched.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import torch
from pydantic import ValidationError

from archspec.cli_options import device_option, registry_option
from archspec.errors import UserError, printable
from archspec.spec.train import MQARCorpus, PasskeyCorpus
from archspec.console import echo
from archspec.train.tasks import TASKS, check_task, describe_task, generate, task_scorer

TASK_CLASSES = {"mqar": MQARCorpus, "passkey": PasskeyCorpus}
BYTE_IDS = 256  # the tasks' ids are bytes: a model must have at least these, read by a byte tokenizer


@dataclass
class ProbeResult:
    run_id: str
    task: str
    params: dict[str, Any]  # the task's parameters, seq_len and the number of examples evaluated
    metrics: dict[str, float]  # accuracy, accuracy.d<distance>, answers, examples, chance
    checkpoint: str
    evaluation_id: int | None  # None: not recorded (--no-record)

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "task": self.task, "params": self.params, "metrics": self.metrics,
                "checkpoint": self.checkpoint, "evaluation_id": self.evaluation_id}


def task_corpus(task: str, run_corpus: dict | None, overrides: dict[str, Any]):
    """The task's parameters: the run's own (when it trained on this task), else the defaults; then `overrides`."""
    if task not in TASK_CLASSES:
        raise UserError(f"--task: expected one of {', '.join(TASKS)}, got {printable(task)!r}")
    base = dict(run_corpus) if run_corpus and run_corpus.get("kind") == task else {"kind": task}
    base.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return TASK_CLASSES[task].model_validate(base)
    except ValidationError as e:
        problems = [f"{task}.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
        raise UserError(f"--task {task}: invalid parameters", problems) from None


def evaluate(model: torch.nn.Module, corpus, seq_len: int, n_examples: int | None, batch_size: int,
             device: torch.device) -> dict[str, float]:
    """Exact match of the model's argmax on the answer positions of the task's validation examples."""
    examples = generate(corpus, seq_len, "val", n_examples)
    scorer = task_scorer(corpus)
    model.eval()
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            index = torch.arange(start, min(start + batch_size, len(examples))).numpy()
            inputs, targets = examples.batch(index)
            logits = model(inputs.to(device))
            logits = logits[0] if isinstance(logits, tuple) else logits
            scorer.add(logits.float().cpu(), targets, torch.from_numpy(examples.buckets[index]))
    out = scorer.metrics(prefix="")
    out["answers"] = float(scorer.total)
    out["examples"] = float(len(examples))
    out["chance"] = 2.0 / corpus.vocab if corpus.kind == "mqar" else 1.0 / corpus.vocab
    return out


def probe_run(run_ref: str, task: str, overrides: dict[str, Any] | None = None, *, seq_len: int | None = None,
              examples: int | None = None, batch_size: int = 64, device: str = "auto",
              registry_url: str | None = None, record: bool = True) -> ProbeResult:
    from archspec.registry import Registry, default_url
    from archspec.sample import load_model
    from archspec.train.distributed import resolve_device
    from archspec.train.loop import code_version

    url = registry_url or default_url()
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file():
        raise UserError(f"no registry at {printable(url)} to look run {printable(run_ref)!r} up in (pass --registry)")
    registry = Registry(url)
    try:
        if record:  # recording is a write: bring an older schema to head first (as any first write does)
            registry.upgrade()
        run, checkpoint = registry.run_checkpoint(run_ref, "probe")
        corpus = task_corpus(task, (run.recipe.get("data") or {}).get("corpus"), overrides or {})
        dev = resolve_device(device)
        loaded = load_model(str(checkpoint), device=dev)
        m = loaded.spec.model
        if loaded.tokenizer.kind != "byte":
            raise UserError(f"run {run.id} uses a {loaded.tokenizer.kind} tokenizer; the {task} task is written in "
                            "byte ids, so only runs with the byte tokenizer can be probed on it")
        if m.vocab_size < BYTE_IDS:
            raise UserError(f"run {run.id}: model.vocab_size {m.vocab_size} is smaller than the {BYTE_IDS} byte ids the "
                            f"{task} task uses")
        length = seq_len if seq_len is not None else int(run.recipe.get("seq_len") or m.context_length)
        if length > m.context_length:
            raise UserError(f"--seq-len: must be at most the run's model.context_length ({m.context_length}), got "
                            f"{length}")
        check_task(corpus, length, where=(task,), length_name="seq_len")
        metrics = evaluate(loaded.model, corpus, length, examples, batch_size, dev)
        params = {**corpus.model_dump(mode="json"), "seq_len": length, "examples": int(metrics["examples"])}
        evaluation_id = None
        if record:
            evaluation_id = registry.record_evaluation(run.id, task, params, metrics, str(checkpoint),
                                                       code_version())
        return ProbeResult(run.id, task, params, metrics, str(checkpoint), evaluation_id)
    finally:
        registry.close()


def _distances(ctx, param, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not out:
        raise click.BadParameter("expected at least one distance")
    return out


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_id", metavar="RUN_ID")
@click.option("--task", type=click.Choice(TASKS), required=True, help="mqar: associative recall; passkey: retrieval.")
@click.option("--vocab", type=int, default=None, help="Task symbols (mqar: keys and values; passkey: passkey symbols).")
@click.option("--pairs", type=int, default=None, help="mqar: key-value pairs per example.")
@click.option("--queries", type=int, default=None, help="mqar: keys queried per example (default: pairs).")
@click.option("--distances", callback=_distances, default=None, metavar="D,D,...",
              help="passkey: tokens from the passkey to the question, e.g. 16,64,120.")
@click.option("--key-len", type=int, default=None, help="passkey: tokens per passkey.")
@click.option("--filler", type=int, default=None, help="passkey: filler symbols.")
@click.option("--seed", "task_seed", type=int, default=None, help="The task's data seed.")
@click.option("--examples", type=click.IntRange(1, 100_000), default=None,
              help="Examples to evaluate [default: the task's val_examples].")
@click.option("--seq-len", type=click.IntRange(2, 1 << 20), default=None,
              help="Window length [default: the run's train.seq_len]; at most the model's context_length.")
@click.option("--batch-size", type=click.IntRange(1, 65536), default=64, show_default=True,
              help="Examples per forward (memory, not results).")
@device_option
@registry_option
@click.option("--no-record", is_flag=True, help="Print the result only; record no evaluation.")
@click.option("--json", "json_out", is_flag=True, help="Print the result as one JSON object.")
def probe_cmd(run_id: str, task: str, vocab, pairs, queries, distances, key_len, filler, task_seed, examples,
              seq_len, batch_size, device, registry_url, no_record, json_out) -> None:
    """Evaluate a trained run on a capability task without training it: exact-match accuracy on the answer positions
    (passkey: also per distance). Parameters default to the run's own task when it trained on this one. The result
    is recorded as an evaluation of the run (the run's own record is not changed): `archspec runs list --where
    "probe.accuracy > 0.5"`, `archspec runs show RUN`."""
    overrides = {"vocab": vocab, "pairs": pairs, "queries": queries, "distances": distances, "key_len": key_len,
                 "filler": filler, "seed": task_seed}
    inapplicable = [k for k, v in overrides.items() if v is not None and k not in TASK_CLASSES[task].model_fields]
    if inapplicable:
        raise UserError(f"--task {task} has no {', '.join('--' + k.replace('_', '-') for k in inapplicable)}")
    result = probe_run(run_id, task, overrides, seq_len=seq_len, examples=examples, batch_size=batch_size,
                       device=device, registry_url=registry_url, record=not no_record)
    if json_out:
        data = result.to_json()
        data["metrics"] = {k: None if math.isnan(v) else v for k, v in data["metrics"].items()}  # JSON has no NaN
        echo(json.dumps(data, sort_keys=True))
        return
    m = result.metrics
    corpus = TASK_CLASSES[task].model_validate({k: v for k, v in result.params.items()
                                                if k in TASK_CLASSES[task].model_fields})
    lines = [f"run {result.run_id} · {describe_task(corpus)} · seq_len {result.params['seq_len']} · "
             f"{int(m['examples'])} examples, {int(m['answers'])} answers",
             f"accuracy {_pct(m['accuracy'])} (chance {_pct(m['chance'])})"]
    for key in sorted((k for k in m if k.startswith("accuracy.d")), key=lambda k: int(k[len("accuracy.d"):])):
        lines.append(f"  distance {key[len('accuracy.d'):]:>5}: {_pct(m[key])}")
    lines.append(f"recorded as evaluation {result.evaluation_id} of run {result.run_id}" if result.evaluation_id
                 is not None else "not recorded (--no-record)")
    echo("\n".join(lines))


def _pct(v: float) -> str:
    return "n/a" if v is None or math.isnan(v) else f"{100 * v:.1f}%"

