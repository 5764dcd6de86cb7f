"""`archspec probe RUN --task TASK` (every registered capability task): the command over archspec.ablate.probe."""

from __future__ import annotations

import json
import math

import click

from archspec.cli.options import device_option, registry_option
from archspec.console import echo
from archspec.data.base import task_kinds
from archspec.errors import UserError


def _distances(ctx, param, value: str | None) -> list[int] | None:
    if value is None:
        return None
    from archspec.cli.options import int_list

    out = int_list(value, "64,128")
    if not out:
        raise click.BadParameter("expected at least one distance")
    return out


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_id", metavar="RUN_ID")
@click.option("--task", type=click.Choice(tuple(task_kinds())), required=True,
              help="; ".join(f"{k}: {c.probe_help}" for k, c in task_kinds().items()) + ".")
@click.option("--vocab", type=int, default=None, help="Task symbols (mqar: keys and values; passkey: passkey symbols).")
@click.option("--pairs", type=int, default=None, help="mqar, media_recall: key-value pairs per example.")
@click.option("--queries", type=int, default=None, help="mqar: keys queried per example (default: pairs).")
@click.option("--distances", callback=_distances, default=None, metavar="D,D,...",
              help="passkey: tokens from the passkey to the question, e.g. 16,64,120.")
@click.option("--key-len", type=int, default=None, help="passkey: tokens per passkey.")
@click.option("--filler", type=int, default=None, help="passkey: filler symbols.")
@click.option("--keys", type=int, default=None, help="media_recall: key symbols.")
@click.option("--values", type=int, default=None, help="media_recall: value symbols (chance 1/values).")
@click.option("--width", type=int, default=None, help="media_recall: the media's width (the model's model.media.width).")
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
def probe_cmd(run_id: str, task: str, vocab, pairs, queries, distances, key_len, filler, keys, values, width,
              task_seed, examples, seq_len, batch_size, device, registry_url, no_record, json_out) -> None:
    """Evaluate a trained run on a capability task without training it: exact-match accuracy on the answer positions
    (passkey: also per distance). Parameters default to the run's own task when it trained on this one. The result
    is recorded as an evaluation of the run (the run's own record is not changed): `archspec runs list --where
    "probe.accuracy > 0.5"`, `archspec runs show RUN`."""
    overrides = {"vocab": vocab, "pairs": pairs, "queries": queries, "distances": distances, "key_len": key_len,
                 "filler": filler, "keys": keys, "values": values, "width": width, "seed": task_seed}
    task_class = task_kinds()[task]
    inapplicable = [k for k, v in overrides.items() if v is not None and k not in task_class.model_fields]
    if inapplicable:
        raise UserError(f"--task {task} has no {', '.join('--' + k.replace('_', '-') for k in inapplicable)}")
    from archspec.ablate.probe import probe_run  # torch

    result = probe_run(run_id, task, overrides, seq_len=seq_len, examples=examples, batch_size=batch_size,
                       device=device, registry_url=registry_url, record=not no_record)
    if json_out:
        data = result.to_json()
        data["metrics"] = {k: None if math.isnan(v) else v for k, v in data["metrics"].items()}  # JSON has no NaN
        echo(json.dumps(data, sort_keys=True))
        return
    m = result.metrics
    corpus = task_class.model_validate({k: v for k, v in result.params.items() if k in task_class.model_fields})
    lines = [f"run {result.run_id} · {corpus.describe()} · seq_len {result.params['seq_len']} · "
             f"{int(m['examples'])} examples, {int(m['answers'])} answers",
             f"accuracy {_pct(m['accuracy'])} (chance {_pct(m['chance'])})"]
    for key in sorted((k for k in m if k.startswith("accuracy.d")), key=lambda k: int(k[len("accuracy.d"):])):
        lines.append(f"  distance {key[len('accuracy.d'):]:>5}: {_pct(m[key])}")
    lines.append(f"recorded as evaluation {result.evaluation_id} of run {result.run_id}" if result.evaluation_id
                 is not None else "not recorded (--no-record)")
    echo("\n".join(lines))


def _pct(v: float) -> str:
    return "n/a" if v is None or math.isnan(v) else f"{100 * v:.1f}%"

