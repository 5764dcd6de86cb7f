"""`archspec import-hf` and `archspec export-hf`: transformers model directories in and out."""

from __future__ import annotations

import json

import click

from archspec.cli.options import registry_option
from archspec.console import echo


def registered_types() -> list[str]:
    """The model types of the registry of types (archspec.hf.types.TYPES), read from its source: importing it imports
    torch (archspec.hf, archspec.kinds), which `--help` must not. Each `NAME = HFType(model_type="...", ...)` (or any
    call with a literal model_type) names a type; TYPES' expression names the ones registered.
    tests/test_hf_hostile.py checks the result equals TYPES."""
    import ast
    from pathlib import Path

    import archspec

    tree = ast.parse((Path(archspec.__file__).parent / "hf" / "types.py").read_text(encoding="utf-8"))
    model_type: dict[str, str] = {}
    registry = None
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        value = getattr(node, "value", None)
        if "TYPES" in names:
            registry = value
        if isinstance(value, ast.Call):
            for kw in value.keywords:
                if kw.arg == "model_type" and isinstance(kw.value, ast.Constant):
                    model_type.update({n: kw.value.value for n in names})
    seen = [n.id for n in ast.walk(registry) if isinstance(n, ast.Name)] if registry is not None else []
    return list(dict.fromkeys(model_type[n] for n in seen if n in model_type))


class _TypesHelp(click.Command):
    """A command whose help lists the model types from the registry of types (`registered_types`) when shown, so the
    list is never out of date."""

    def format_help_text(self, ctx, formatter) -> None:
        written = self.help
        self.help = (written or "").replace("{types}", ", ".join(sorted(registered_types())))
        try:
            super().format_help_text(ctx, formatter)
        finally:
            self.help = written


@click.command(cls=_TypesHelp, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path", metavar="PATH")
@click.option("-o", "--output", "spec_out", required=True, metavar="SPEC.yaml", help="Spec file to write (must not exist).")
@click.option("--checkpoint", "checkpoint_out", metavar="OUT.pt",
              help="Also convert the safetensors weights (and tokenizer.json) beside the config into a weights "
                   "checkpoint (must not exist).")
@click.option("--name", metavar="SLUG", help="Spec name [default: from the output file name].")
@click.option("--json", "json_out", is_flag=True, help="Print a summary as one JSON object on stdout.")
def import_hf_cmd(path: str, spec_out: str, checkpoint_out: str | None, name: str | None, json_out: bool) -> None:
    """Spec (and weights) from a transformers config.json or model directory.

    Every config field that changes the architecture is mapped or refused by name (exit 2, nothing written).
    Model types: {types}."""
    from archspec.console import NULL_TRACKER, Tracker
    from archspec.hf import import_hf

    # the weights' read and write on stderr (--json's stdout stays one object); nothing shown when not a terminal
    with (Tracker("reading the weights") if checkpoint_out else NULL_TRACKER) as tracker:
        out = import_hf(path, spec_out, checkpoint_out, name, tracker=tracker)
    if json_out:
        echo(json.dumps(out, sort_keys=True))
    else:
        weights = f", {out['params']:,} parameters → {out['checkpoint']}" if out["checkpoint"] else ""
        echo(f"{out['model_type']} → {out['spec']} (spec {out['name']}){weights}")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("source", metavar="RUN_ID|CHECKPOINT")
@click.option("-o", "--output", "out_dir", required=True, metavar="DIR", help="Directory to create (new or empty).")
@registry_option
@click.option("--json", "json_out", is_flag=True, help="Print a summary as one JSON object on stdout.")
def export_hf_cmd(source: str, out_dir: str, registry_url: str | None, json_out: bool) -> None:
    """A transformers model directory (config.json, model.safetensors, tokenizer) from a run or a checkpoint.

    `AutoModelForCausalLM.from_pretrained(DIR)` loads it and computes the same logits. What no transformers model
    type expresses (sinusoidal or no positions, global_local/block_sparse, capacity-limited MoE, a per-layer mix no
    type has, ...) is refused by name."""
    from archspec.console import Tracker
    from archspec.hf import export_hf

    with Tracker("reading the checkpoint") as tracker:  # on stderr; nothing shown when not a terminal
        out = export_hf(source, out_dir, registry_url, tracker=tracker)
    if json_out:
        echo(json.dumps(out, sort_keys=True))
    else:
        tok = " + tokenizer" if out["tokenizer"] else ""
        echo(f"{out['source']} → {out['dir']} ({out['model_type']}, {out['params']:,} parameters{tok})")
