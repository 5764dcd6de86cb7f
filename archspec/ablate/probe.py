"""A capability probe of a trained run, recorded as an evaluation of it.

    result = probe_run("1a2b3c4d", task, {"distances": [16, 64]})   # task: one of archspec.data.task_kinds()
    result.metrics["accuracy"], result.metrics["accuracy.d64"], result.evaluation_id

The task's examples are those of `archspec.train.tasks` (the validation stream: a run trained on the same task with
the same parameters is probed on exactly its own validation set, so the probe repeats its `metrics.probe.accuracy`).
Parameters default to the run's own task when it trained on one of that kind, else to the task's defaults, at the
run's train.seq_len. The result goes into the registry's `evaluations` (queryable as `probe.<key>`); the run's own
record (status, metrics, summary) is never touched.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from archspec.data.base import task_kinds, task_tokenizer
from archspec.errors import UserError, printable
from archspec.train.tasks import check_task, generate, task_scorer

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
    tasks = task_kinds()  # every registered capability task (archspec.data)
    if task not in tasks:
        raise UserError(f"--task: expected one of {', '.join(tasks)}, got {printable(task)!r}")
    base = dict(run_corpus) if run_corpus and run_corpus.get("kind") == task else {"kind": task}
    base.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return tasks[task].model_validate(base)
    except ValidationError as e:
        problems = [f"{task}.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
        raise UserError(f"--task {task}: invalid parameters", problems) from None


def evaluate(model: torch.nn.Module, corpus, seq_len: int, n_examples: int | None, batch_size: int,
             device: torch.device, marker_id: int | None = None) -> dict[str, float]:
    """Exact match of the model's argmax on the answer positions of the task's validation examples. `marker_id`: a
    model with media input's (model.media.marker_id): it is given a media task's media (a text-only model reads the
    text only)."""
    examples = generate(corpus, seq_len, "val", n_examples)
    scorer = task_scorer(corpus)
    model.eval()
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            index = torch.arange(start, min(start + batch_size, len(examples))).numpy()
            inputs, targets, *media = examples.batch(index, marker_id)
            logits = model(inputs.to(device), **({"media": media[0].to(device)} if media else {}))
            logits = logits[0] if isinstance(logits, tuple) else logits
            scorer.add(logits.float().cpu(), targets, torch.from_numpy(examples.buckets[index]))
    out = scorer.metrics(prefix="")
    out["answers"] = float(scorer.total)
    out["examples"] = float(len(examples))
    out["chance"] = corpus.chance
    return out


def probe_run(run_ref: str, task: str, overrides: dict[str, Any] | None = None, *, seq_len: int | None = None,
              examples: int | None = None, batch_size: int = 64, device: str = "auto",
              registry_url: str | None = None, record: bool = True) -> ProbeResult:
    from archspec.registry import Registry, default_url
    from archspec.loading import load_model
    from archspec.train.distributed import resolve_device
    from archspec.train.report import code_version

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
        ids = task_tokenizer().kind_name()  # the tokenizer whose ids the tasks are written in
        if loaded.tokenizer.kind != ids:
            raise UserError(f"run {run.id} uses a {loaded.tokenizer.kind} tokenizer; the {task} task is written in "
                            f"{ids} ids, so only runs with the {ids} tokenizer can be probed on it")
        if m.vocab_size < BYTE_IDS:
            raise UserError(f"run {run.id}: model.vocab_size {m.vocab_size} is smaller than the {BYTE_IDS} byte ids the "
                            f"{task} task uses")
        length = seq_len if seq_len is not None else int(run.recipe.get("seq_len") or m.context_length)
        if length > m.context_length:
            raise UserError(f"--seq-len: must be at most the run's model.context_length ({m.context_length}), got "
                            f"{length}")
        check_task(corpus, length, where=(task,), length_name="seq_len")
        unreadable = corpus.model_problems(m)
        if unreadable:
            path, message, value = unreadable[0]
            # a setting the task shares with the model (the media's width) is an option here: say which
            hint = (f"; pass --{path[-1].replace('_', '-')} {value} to probe with the run's own"
                    if path[-1] in type(corpus).model_fields and value is not None else "")
            raise UserError(f"run {run.id}: {'.'.join(map(str, path))}: {message}{hint}")
        metrics = evaluate(loaded.model, corpus, length, examples, batch_size, dev,
                           m.media.marker_id if m.media is not None else None)
        params = {**corpus.model_dump(mode="json"), "seq_len": length, "examples": int(metrics["examples"])}
        evaluation_id = None
        if record:
            evaluation_id = registry.record_evaluation(run.id, task, params, metrics, str(checkpoint),
                                                       code_version())
        return ProbeResult(run.id, task, params, metrics, str(checkpoint), evaluation_id)
    finally:
        registry.close()
