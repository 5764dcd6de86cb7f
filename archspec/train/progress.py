"""What a person watching a run sees, on stderr (stdout is kept for `--json`): a progress line with step, loss,
tokens/s and ETA, and one line per evaluation. Disabled, every method is a no-op, so the loop never branches on it.

The progress line fits the console's width (archspec.console: $COLUMNS, the terminal, or a pipe's width) by leaving
whole fields out, least useful first (the description, tokens/s, elapsed time, then the bar), so step, loss and ETA
stay readable down to 40 columns and no number is ever cut."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, RenderResult
from rich.progress import Progress
from rich.text import Text

from archspec.console import MarkupConsole, number, shown, terminal_width
from archspec.train.metrics import EvalWindow, live_rate_label

SEPARATOR = " · "
BAR_MIN, BAR_MAX = 10, 40  # the bar's width: left out below BAR_MIN columns, never wider than BAR_MAX
DROP_ORDER = ("description", "rate", "elapsed", "bar")  # what goes first when the line does not fit


def clock(seconds: float | None) -> str:
    """h:mm:ss (hours unbounded); `-:--:--` while unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-:--:--"
    s = max(0, round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


@dataclass(frozen=True)
class SweepPosition:
    """Where a run stands in a sweep (passed as the loop's `progress`): its place, and the estimated seconds of the
    sweep's work after it (training and evaluation), so that the run's progress line also says when the sweep ends."""

    label: str  # e.g. "sweep ffn 2/4"
    after_s: float | None  # None: no estimate

    def __bool__(self) -> bool:
        return True


def progress_line(width: int, *, step: int, total: int, loss: float | None, rate: tuple[float, int] | None,
                  elapsed: float | None, remaining: float | None, description: str = "train",
                  sweep_remaining: float | None = None) -> Text:
    """The progress line at `width` columns: every field that fits, whole. `rate`: (tokens/s, steps averaged).
    `remaining` counts the run's evaluations still to come; `sweep_remaining` (in a sweep) the sweep's rest too."""
    eta = f"ETA {clock(remaining)}"
    if sweep_remaining is not None:
        eta += f" (sweep {clock(None if remaining is None else remaining + sweep_remaining)})"
    fields = {
        "description": Text(shown(description), style="bold"),
        "step": Text(f"{step}/{total}"),
        "loss": Text.assemble("loss ", ("-" if loss is None else f"{loss:.4f}", "cyan")),
        "rate": (Text.assemble((f"{rate[0]:,.0f}", "green"), f" {live_rate_label(rate[1])}") if rate
                 else Text("- tok/s")),
        "elapsed": Text(f"elapsed {clock(elapsed)}"),
        "eta": Text(eta),
    }
    dropped: list[str] = []
    for n in range(len(DROP_ORDER) + 1):
        dropped = list(DROP_ORDER[:n])
        shown_fields = [k for k in ("step", "loss", "rate", "elapsed", "eta") if k not in dropped]
        head = [] if "description" in dropped else ["description"]
        used = sum(fields[k].cell_len for k in head + shown_fields) + len(SEPARATOR) * (len(shown_fields) - 1)
        used += len(head)  # the space after the description
        if "bar" not in dropped:
            room = width - used - 1  # the bar's space before the step
            if room >= BAR_MIN:
                return _assemble(fields, head, shown_fields, _bar(min(room, BAR_MAX), step, total))
            continue
        if used <= width:
            return _assemble(fields, head, shown_fields, None)
    # Narrower still (a 6-digit step count at 40 columns): the essentials with plain spaces between them; below
    # that they overflow whole rather than be cut.
    return _assemble(fields, [], ["step", "loss", "eta"], None, separator=" ")


def _bar(width: int, step: int, total: int) -> Text:
    done = min(width, round(width * step / total)) if total else width
    style = "bar.finished" if total and step >= total else "bar.complete"
    return Text.assemble(("━" * done, style), ("━" * (width - done), "bar.back"))


def _assemble(fields: dict[str, Text], head: list[str], keys: list[str], bar: Text | None,
              separator: str = SEPARATOR) -> Text:
    line = Text(no_wrap=True, overflow="ignore")
    for k in head:
        line.append_text(fields[k])
        line.append(" ")
    if bar is not None:
        line.append_text(bar)
        line.append(" ")
    for i, k in enumerate(keys):
        if i:
            line.append(separator)
        line.append_text(fields[k])
    return line


def eval_line(step: int, total: int, val: dict[str, float], window: EvalWindow | None) -> str:
    """One evaluation: val loss and perplexity, then the learning rate of the last step and the gradient norm (before
    clipping) over the steps since the previous evaluation, each saying which steps it is of."""
    line = f"step {step:>{len(str(total))}}/{total} · val loss {val['val_loss']:.4f} · ppl {val['val_ppl']:.2f}"
    if window is not None:
        steps = f"step {window.last}" if window.first >= window.last else f"steps {window.first}–{window.last}"
        line += (f" · lr {window.lr:.2e} (step {window.last}) · grad norm {number(window.grad_norm_mean)} mean, "
                 f"{number(window.grad_norm_max)} max ({steps})")
    return line


class _Line:
    """The progress display's renderable: laid out again at every refresh, at the width rich offers."""

    def __init__(self, progress: Progress):
        self.progress = progress

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for task in self.progress.tasks:
            remaining = task.fields.get("remaining")
            yield progress_line(options.max_width, step=int(task.completed), total=int(task.total or 0),
                                loss=task.fields.get("loss"), rate=task.fields.get("rate"), elapsed=task.elapsed,
                                remaining=0.0 if task.finished else remaining,
                                description=task.description, sweep_remaining=task.fields.get("sweep_after"))


class _Display(Progress):
    def get_renderables(self):
        yield _Line(self)


class ProgressBar:
    """The run's progress line. Its ETA is the steps left at the current step time plus the evaluations left at the
    measured evaluation time (before the first evaluation: its forward tokens at a third of a training token's time),
    so a run that evaluates often is not promised early (`plan` tells it the run's evaluation schedule)."""

    def __init__(self, enabled: bool, total: int, description: str = "train", console: Console | None = None,
                 sweep: SweepPosition | None = None):
        self.enabled, self.total, self.description = enabled, total, description
        self.sweep = sweep
        if sweep is not None:
            self.description = sweep.label
        self.tokens_per_step, self.eval_tokens, self.eval_every = 0, 0, 0
        self.eval_times: list[float] = []
        # soft_wrap: long run lines stay whole in logs
        self.console = console or MarkupConsole(stderr=True, soft_wrap=True, width=terminal_width(sys.stderr))
        self._progress = _Display(console=self.console, disable=not enabled)
        self._task = None

    def start(self, done: int = 0) -> None:
        """Show the bar from `done` steps (a resumed run); elapsed time and ETA count from here."""
        self._task = self._progress.add_task(self.description, total=self.total, completed=done, loss=None, rate=None,
                                             remaining=None, sweep_after=None)
        self._progress.start()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    def plan(self, tokens_per_step: int, eval_tokens: int, eval_every: int) -> None:
        """The run's evaluation schedule (every `eval_every` steps and at the last, `eval_tokens` tokens each)."""
        self.tokens_per_step, self.eval_tokens, self.eval_every = tokens_per_step, eval_tokens, eval_every

    def evaluated(self, seconds: float) -> None:
        """An evaluation took `seconds`: the ETA uses the measured time from here on."""
        self.eval_times.append(seconds)

    def remaining(self, step: int, rate: tuple[float, int] | None) -> float | None:
        """Seconds left: the steps after `step` and the evaluations among them (None until a rate is measured)."""
        if not rate or rate[0] <= 0 or not self.tokens_per_step:
            return None
        step_s = self.tokens_per_step / rate[0]
        every = self.eval_every or self.total
        done = min(step, self.total)
        evals_left = (  # evaluations at multiples of `every` and at the last step, less those done
            self.total // every + (1 if self.total % every else 0)
            - (done // every + (1 if done == self.total and self.total % every else 0)))
        if self.eval_times:
            eval_s = sum(self.eval_times) / len(self.eval_times)
        else:  # a forward token costs about a third of a training token
            eval_s = self.eval_tokens * step_s / (3 * self.tokens_per_step)
        return max(0, self.total - step) * step_s + max(0, evals_left) * eval_s

    def update(self, step: int, loss: float, rate: tuple[float, int] | None) -> None:
        """rate: (tokens/s, over how many recent steps), `RunMetrics.live_rate`."""
        if self._task is None:
            self.start(step - 1)
        self._progress.update(self._task, completed=step, loss=loss, rate=rate, remaining=self.remaining(step, rate),
                              sweep_after=self.sweep.after_s if self.sweep is not None else None)

    def line(self) -> Text | None:
        """The progress line as it is now, at the console's width (None before the first step)."""
        if self._task is None:
            return None
        return next(iter(_Line(self._progress).__rich_console__(self.console, self.console.options)))

    def log(self, message: str) -> None:
        if self.enabled:
            self._progress.console.print(message, highlight=False)
