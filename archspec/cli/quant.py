"""`archspec quantize RUN_ID|CHECKPOINT --scheme int8|int4`: the command over archspec.quantize."""

from __future__ import annotations

import json

import click

from archspec.cli.options import registry_option
from archspec.console import echo


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("source", metavar="RUN_ID|CHECKPOINT")
@click.option("--scheme", required=True, metavar="int8|int4",
              help="int8: torchao's weight-only INT8, one scale per output row (needs archspec[quant]); int4: "
                   "group-wise asymmetric min-max, two values per byte.")
@click.option("--group-size", type=click.IntRange(1, 1 << 16), default=None, metavar="G",
              help="int4: weights per scale along the input width [default: the largest of 128, 64, 32 that divides "
                   "every quantized layer's input width].")
@click.option("--embeddings", is_flag=True,
              help="Also quantize the token embedding and the output head (one matrix when tied).")
@click.option("--no-record", is_flag=True, help="Do not record the evaluation in the registry.")
@registry_option
@click.option("--json", "json_out", is_flag=True, help="Print one JSON object: the figures and the checkpoint.")
def quantize_cmd(source: str, scheme: str, group_size: int | None, embeddings: bool, no_record: bool,
                 registry_url: str | None, json_out: bool) -> None:
    """Quantize a run's weights to int8 or int4 (weight-only), write the quantized checkpoint beside the run's own
    (with its digest) and record an evaluation of the run: bytes before and after, validation loss before and after
    on the run's own validation set.

    Which weights: each layer's units decide (attention and FFN matrices; a MoE keeps its router; norms stay as
    trained); the embedding and head only with --embeddings. A layer whose input width the group size does not divide
    is refused by name. No GPTQ/AWQ calibration (torchao's GPTQ is CUDA-only). Filters reach the evaluation:
    `archspec runs list --where "quant.int4.val_loss_delta < 0.05"`. `archspec sample` reads the checkpoint; training
    (--resume, --init-from) and export-hf refuse it."""
    from archspec.console import Tracker
    from archspec.quantize import quantize_source

    with Tracker("loading the run") as tracker:  # on stderr: --json's stdout stays one object
        result = quantize_source(source, scheme.strip().lower(), group_size=group_size, embeddings=embeddings,
                                 registry_url=registry_url, record=not no_record, tracker=tracker)
    if json_out:
        echo(json.dumps(result.to_json(), sort_keys=True))
        return
    d = result.to_json()
    group = f", group size {d['group_size']}" if d["group_size"] else ""
    ratio = d["weight_bytes_before"] / d["weight_bytes_after"]
    lines = [f"{d['scheme']}{group}: {len(d['quantized_modules'])} weights quantized "
             f"({d['quantized_bytes_before']:,} → {d['quantized_bytes_after']:,} bytes); model "
             f"{d['weight_bytes_before']:,} → {d['weight_bytes_after']:,} bytes ({ratio:.2f}× smaller)",
             f"val loss {d['val_loss_before']:.4f} → {d['val_loss_after']:.4f} ({d['val_loss_delta']:+.4f}, "
             f"{100 * d['val_loss_delta'] / d['val_loss_before']:+.2f}%)",
             f"kept as trained: {', '.join(sorted(set(_short(k) for k in result.kept))) or 'nothing'}",
             f"checkpoint {d['checkpoint']}",
             f"recorded as evaluation {result.evaluation_id} of run {result.run_id} (task quant.{d['scheme']})"
             if result.evaluation_id is not None else f"not recorded ({result.not_recorded})"]
    echo("\n".join(lines))


def _short(name: str) -> str:
    """blocks.3.ffn.router.weight → ffn.router.weight: what was kept, once per kind of weight."""
    parts = name.split(".")
    return ".".join(parts[2:]) if parts[0] == "blocks" and len(parts) > 2 else name
