"""Options shared by several commands, defined once so that each is spelled, parsed and documented the same way
everywhere (`--set K=V` on build, train and ablate; `--registry URL`; `--device`)."""

from __future__ import annotations

import click

DEVICES = ("auto", "cpu", "cuda")  # archspec.train.distributed.DEVICES, spelled here so --help needs no torch import

set_option = click.option(
    "--set", "overrides", multiple=True, metavar="K=V",
    help="Override a dotted spec key, e.g. --set model.attention.n_kv_heads=1 or --set train.lr=1e-3 (the value is "
         "parsed as YAML: a number, a word, or a flow map such as {kind: mlp, hidden_dim: 64}); repeatable.",
)

registry_option = click.option(
    "--registry", "registry_url", metavar="URL", default=None,
    help="Registry database URL [default: $ARCHSPEC_REGISTRY, else sqlite:///registry/archspec.db].",
)

device_option = click.option(
    "--device", type=click.Choice(DEVICES), default="auto", show_default=True,
    help="auto: CUDA when present, else CPU.",
)


eval_tokens_option = click.option(
    "--eval-tokens", "eval_tokens", type=click.IntRange(1, 1 << 30), metavar="N", default=None,
    help="Validation tokens per evaluation (train.eval_tokens; how the run is observed, not its identity) "
         "[default: the budget rule: half the training tokens over the evaluations, 16,384 to 65,536 each].",
)


def _log_to(ctx, param, value: str | None) -> str | None:
    """Checked and spelled one way (`tensorboard,wandb`, `none`): still text, so a resume command repeats it."""
    from archspec.errors import UserError
    from archspec.train.sinks import parse_log_to

    try:
        names = parse_log_to(value)
    except UserError as e:
        raise click.BadParameter(str(e).removeprefix("--log-to: ")) from None
    return None if names is None else ",".join(names) or "none"


log_to_option = click.option(
    "--log-to", "log_to", metavar="SINKS", default=None, callback=_log_to,
    help="Also send the run's params, metrics and summary to these trackers, comma-separated: tensorboard, wandb, "
         "mlflow (each an extra: pip install 'archspec[tensorboard]'), or none; replaces train.log_to. The registry "
         "stays the record: a tracker that fails is reported once and the run goes on.",
)


class FiniteFloat(click.FloatRange):
    """A float option with both bounds, refusing NaN and infinities (click's FloatRange lets NaN through: every
    comparison with NaN is false). Every float option of the CLI is one of these (tests/test_cli_fuzz.py checks)."""

    name = "finite float"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if number != number or number in (float("inf"), float("-inf")):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def int_list(value: str, example: str = "0,1,2") -> list[int]:
    """A comma-separated list of whole numbers (--seeds, --distances): every item an ASCII integer, none empty
    (`1,,2` and `1,` are typos, not lists), at most 18 digits each; click.BadParameter (exit 2, one line) otherwise."""
    import re

    items = value.split(",")
    bad = next((x for x in items if not re.fullmatch(r"-?[0-9]{1,18}", x.strip())), None)
    if bad is not None:
        what = "an empty item" if not bad.strip() else f"{bad.strip()[:40]!r}"
        raise click.BadParameter(f"expected comma-separated integers, e.g. {example}; got {value[:80]!r} "
                                 f"({what} is not one)")
    return [int(x) for x in items]
