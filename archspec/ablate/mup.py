"""µP's checks (`model.parametrization: mup`): the coordinate check and the learning-rate transfer measurement.

The coordinate check (Yang et al. 2022, "Tensor Programs V", §D.1; the `mup` package's `get_coord_data`) trains one
spec at several widths for a few steps and records, at every step, the RMS of each coordinate the model computes:
the embedding output (what the first block reads), each block's output, and the logits. Under µP they stay the same
size whatever the width; under the standard parametrization, Adam's updates make them grow with it (the logits
≈ linearly). The verdict is the slope of log(RMS) against log(width), least squares over the widths, at the last
step: flat when every |slope| ≤ SLOPE_BOUND.

A width is the spec made `width` wide: d_model and every inner width (head_dim and the other per-head widths, FFN
and expert hidden sizes, latent ranks: WIDTH_KEYS, at any depth) times width / d_model, exactly; head counts and
depth stay. A width at which one of them would not be a whole number is refused by name.

Every run goes through the shared loop (archspec.train.loop.Trainer: the generated module, the loop's optimizer with
the model's lr multipliers, its schedule and clipping) on the spec's own data, at a constant rate (no warmup, no
decay: the check compares widths, not schedules), in a scratch directory; nothing is recorded.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from archspec.console import NULL_TRACKER
from archspec.errors import UserError
from archspec.spec import Spec, SpecError, canonical_dict, load_spec_dict

# The fields that make a model wide; each is scaled with d_model (a head count or a depth is not a width).
WIDTH_KEYS = frozenset({"d_model", "head_dim", "hidden_dim", "shared_hidden_dim", "qk_nope_head_dim",
                        "qk_rope_head_dim", "v_head_dim", "q_lora_rank", "kv_lora_rank"})
# |d log(RMS) / d log(width)| at most this is "flat". Measured on llama-like at widths 64-512 after 9 steps
# (docs/ABLATIONS.md): µP's blocks within ±0.06 and its logits −0.22 (their 1/sqrt(m) start, fading); standard's
# blocks +1.0 to +1.5 and its logits +0.73.
SLOPE_BOUND = 0.25
DEFAULT_WIDTHS = (64, 128, 256, 512)


def parse_widths(text: str) -> list[int]:
    """`64,128,256` → [64, 128, 256]: distinct positive integers, at least two (a slope needs two widths)."""
    try:
        widths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated integers, e.g. 64,128,256,512; got {text!r}") from None
    if len(widths) < 2 or len(set(widths)) != len(widths) or any(w < 1 for w in widths):
        raise ValueError(f"expected at least two distinct positive integers, e.g. 64,128,256,512; got {text!r}")
    return sorted(widths)


def _scaled(node: Any, ratio_num: int, ratio_den: int, path: tuple[str, ...], problems: list[str]) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in WIDTH_KEYS and isinstance(value, int) and not isinstance(value, bool):
                if (value * ratio_num) % ratio_den:
                    problems.append(f"{'.'.join(path + (key,))} ({value} at d_model {ratio_den}) would be "
                                    f"{value * ratio_num / ratio_den:g}")
                out[key] = value * ratio_num // ratio_den
            else:
                out[key] = _scaled(value, ratio_num, ratio_den, path + (key,), problems)
        return out
    if isinstance(node, list):
        return [_scaled(v, ratio_num, ratio_den, path, problems) for v in node]
    return node


def widened(spec: Spec, width: int, parametrization: str | None = None) -> Spec:
    """`spec` at d_model `width`, every inner width scaled alike (WIDTH_KEYS); `parametrization` replaces its own
    (standard drops a base width). UserError naming the field when the width does not fit the spec."""
    data = canonical_dict(spec)
    d_model = spec.model.d_model
    problems: list[str] = []
    model = _scaled(data["model"], width, d_model, ("model",), problems)
    if problems:
        step = d_model // math.gcd(d_model, *(_width_values(data["model"])))
        raise UserError(f"--widths: {width} does not fit {spec.name}: {problems[0]}; widths that scale every inner "
                        f"width to a whole number are multiples of {step}")
    if parametrization is not None:
        model["parametrization"] = parametrization
        if parametrization != "mup":
            model.pop("mup_base_width", None)
    data["model"] = model
    try:
        return load_spec_dict(data, origin=f"{spec.name} at width {width}")
    except SpecError as e:
        raise UserError(f"--widths: {width} does not fit {spec.name}: {e.problems[0]}") from None


def _width_values(node: Any) -> list[int]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k in WIDTH_KEYS and isinstance(v, int) and not isinstance(v, bool)] + \
            [x for k, v in node.items() if k not in WIDTH_KEYS for x in _width_values(v)]
    if isinstance(node, list):
        return [x for v in node for x in _width_values(v)]
    return []


def brief_recipe(spec: Spec, steps: int, batch_size: int, seq_len: int, lr: float | None = None,
                 schedule: bool = False) -> Spec:
    """`spec` with a short recipe: `steps` steps of `batch_size` × `seq_len` tokens (seq_len at most the context),
    eager; a constant rate, or with `schedule` the loop's warmup (a fifth of the steps) and cosine to 0.1 · lr;
    `lr` replaces the spec's rate."""
    data = canonical_dict(spec)
    train = data["train"]
    train.update(steps=steps, batch_size=batch_size, seq_len=min(seq_len, spec.model.context_length), grad_accum=1,
                 warmup_steps=steps // 5 if schedule else 0, min_lr_ratio=0.1 if schedule else 1.0, compile="none",
                 eval_tokens=min(spec.train.eval_size, 4096), stability=False)
    if lr is not None:
        train["lr"] = lr
    try:
        return load_spec_dict(data, origin=spec.name)
    except SpecError as e:
        raise UserError(e.problems[0]) from None


def _rms(x) -> float:
    return float(x.detach().float().pow(2).mean().sqrt())


class Tokens:
    """The token stores of the specs one check trains, each read once: every width and rate of a check trains on the
    same corpus, and opening it (hashing a corpus's files) costs more than a short run."""

    def __init__(self, cache: str | Path | None = None) -> None:
        from archspec.cache import cache_dir

        self.cache = cache_dir(cache)
        self._stores: dict[str, tuple] = {}

    def data(self, spec: Spec):
        """`spec`'s TrainData, as archspec.train.data.build_data makes it, with a sampler of its own."""
        from archspec.train.data import TrainData, WindowSampler, build_data, prepare_tokens, val_batches

        t = spec.train
        if t.data.corpus.task:  # synthetic examples: made in memory, nothing to share
            return build_data(spec, self.cache)
        key = t.data.model_dump_json() + f"/{spec.model.vocab_size}"
        if key not in self._stores:
            self._stores[key] = prepare_tokens(t.data, spec.model.vocab_size, self.cache)
        corpus, tokenizer, store = self._stores[key]
        return TrainData(corpus, tokenizer, store, WindowSampler(store.train, t.seq_len, t.batch_size, t.seed),
                         val_batches(store.val, t.seq_len, t.batch_size, t.eval_size))


def train_briefly(spec: Spec, tokens: Tokens | None = None, record: bool = True,
                  evaluate: bool = False, tracker=NULL_TRACKER) -> tuple[dict[str, list[float]], list[float], float | None]:
    """Train `spec` for its train.steps through the shared loop (CPU, nothing recorded, a scratch run directory).
    Returns ({coordinate: its RMS at each step's training forward}, the training loss of each step, the final
    validation loss when `evaluate`). Coordinates: `embedding` (the first block's input), `block<i>`, `logits`."""
    from archspec.train.build import prepare
    from archspec.train.loop import Trainer

    tokens = tokens or Tokens()
    with tempfile.TemporaryDirectory(prefix="archspec-mup-") as run_dir:
        trainer = Trainer(spec, device="cpu", run_dir=run_dir, compile=False, cache=tokens.cache,
                          build=prepare(spec, tokens.data(spec)))
        model = trainer.model
        rms: dict[str, list[float]] = {}
        handles = []
        if record:
            def keep(name, value) -> None:
                if model.training:  # training forwards only: an evaluation is not a step
                    rms.setdefault(name, []).append(_rms(value))

            handles.append(model.blocks[0].register_forward_pre_hook(lambda mod, args: keep("embedding", args[0])))
            for i, block in enumerate(model.blocks):
                handles.append(block.register_forward_hook(
                    lambda mod, args, out, i=i: keep(f"block{i}", out)))
            handles.append(model.register_forward_hook(
                lambda mod, args, out: keep("logits", out[0] if isinstance(out, tuple) else out)))
        losses = []
        try:
            for _ in range(spec.train.steps):
                losses.append(trainer.train_step().loss)
                tracker.update(advance=1)
            val = trainer.evaluate()["val_loss"] if evaluate else None
        finally:
            for h in handles:
                h.remove()
    return rms, losses, val


def slope(widths: list[int], values: list[float]) -> float:
    """Least-squares slope of log(value) against log(width)."""
    xs = [math.log(w) for w in widths]
    ys = [math.log(max(v, 1e-30)) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


@dataclass
class CoordCheck:
    """One parametrization's coordinate check: rms[coordinate][width index][step]."""

    name: str
    parametrization: str
    widths: list[int]
    steps: int
    rms: dict[str, list[list[float]]] = field(default_factory=dict)
    losses: list[list[float]] = field(default_factory=list)

    @property
    def coordinates(self) -> list[str]:
        return list(self.rms)

    def at(self, coordinate: str, step: int = -1) -> list[float]:
        """The coordinate's RMS at each width, at `step` (default the last)."""
        return [per_width[step] for per_width in self.rms[coordinate]]

    def slopes(self, step: int = -1) -> dict[str, float]:
        return {c: slope(self.widths, self.at(c, step)) for c in self.rms}

    def not_flat(self, bound: float = SLOPE_BOUND) -> list[str]:
        """The coordinates whose |slope| at the last step exceeds `bound`, steepest first."""
        slopes = self.slopes()
        return sorted((c for c, s in slopes.items() if abs(s) > bound), key=lambda c: -abs(slopes[c]))

    def trend(self, coordinate: str, bound: float = SLOPE_BOUND) -> str:
        """"grows" or "shrinks" with the width (|slope| > bound), else ""."""
        s = self.slopes()[coordinate]
        return "" if abs(s) <= bound else ("grows" if s > 0 else "shrinks")

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.name, "parametrization": self.parametrization, "widths": self.widths,
                "steps": self.steps, "slope_bound": SLOPE_BOUND, "slopes": self.slopes(),
                "slopes_at_init": self.slopes(0), "flat": not self.not_flat(), "not_flat": self.not_flat(),
                "rms": {c: {str(w): v for w, v in zip(self.widths, per_width)} for c, per_width in self.rms.items()},
                "loss": {str(w): v for w, v in zip(self.widths, self.losses)}}


def coordinate_check(spec: Spec, widths: list[int], *, steps: int = 10, batch_size: int = 8, seq_len: int = 64,
                     parametrization: str | None = None, cache: str | Path | None = None,
                     tracker=NULL_TRACKER) -> CoordCheck:
    """Train `spec` at each width (`parametrization`: the spec's own unless given) and collect the coordinates.
    `tracker` (archspec.console.Tracker) advances by one a training step."""
    param = parametrization or spec.model.parametrization
    specs = [brief_recipe(widened(spec, w, param), steps, batch_size, seq_len) for w in widths]  # all checked first
    check = CoordCheck(spec.name, param, list(widths), steps)
    tokens = Tokens(cache)
    for w, wide in zip(widths, specs):
        tracker.update(f"{param}: width {w}")
        rms, losses, _ = train_briefly(wide, tokens, tracker=tracker)
        for c, values in rms.items():
            check.rms.setdefault(c, []).append(values)
        check.losses.append(losses)
    return check


def plot_checks(checks: list[CoordCheck], path: Path) -> Path:
    """One panel per parametrization: each coordinate's RMS at the last step against width (log-log), its slope in
    the legend, and the same at initialisation dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(checks), figsize=(5.5 * len(checks), 4.2), squeeze=False, sharey=True)
    for ax, check in zip(axes[0], checks):
        slopes = check.slopes()
        colours = plt.cm.viridis([i / max(1, len(check.rms) - 1) for i in range(len(check.rms))])
        for colour, c in zip(colours, check.rms):
            ax.plot(check.widths, check.at(c), "o-", color=colour, label=f"{c} ({slopes[c]:+.2f})")
            ax.plot(check.widths, check.at(c, 0), ":", color=colour, alpha=0.5)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(check.widths, [str(w) for w in check.widths])
        verdict = "flat" if not check.not_flat() else ", ".join(f"{c} {check.trend(c)}" for c in check.not_flat()[:3])
        ax.set_title(f"{check.name}, {check.parametrization}: {verdict}", fontsize=10)
        ax.set_xlabel(f"d_model (activation RMS at step {check.steps} of {check.steps}; dotted: step 1, at init)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, title="coordinate (slope)", title_fontsize=7)
    axes[0][0].set_ylabel("RMS")
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise UserError(f"--plot {path}: cannot write the PNG: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return path


def rate_transfer(spec: Spec, widths: list[int], rates: list[float], *, steps: int = 30, batch_size: int = 8,
                  seq_len: int = 64, cache: str | Path | None = None) -> dict[int, dict[float, float]]:
    """{width: {rate: final validation loss}}: `spec` trained at each width and rate (warmup and cosine decay, the
    same seed and batches at every point)."""
    out: dict[int, dict[float, float]] = {}
    tokens = Tokens(cache)
    for w in widths:
        wide = widened(spec, w)
        out[w] = {}
        for lr in rates:
            _, _, val = train_briefly(brief_recipe(wide, steps, batch_size, seq_len, lr, schedule=True), tokens,
                                      record=False, evaluate=True)
            out[w][lr] = val if val is not None and math.isfinite(val) else math.inf
    return out


def best_rates(grid: dict[int, dict[float, float]]) -> dict[int, float]:
    return {w: min(losses, key=lambda lr: (losses[lr], lr)) for w, losses in grid.items()}


__all__ = ["WIDTH_KEYS", "SLOPE_BOUND", "DEFAULT_WIDTHS", "parse_widths", "widened", "brief_recipe", "train_briefly",
           "slope", "Tokens", "CoordCheck", "coordinate_check", "plot_checks", "rate_transfer", "best_rates"]
