"""What a person watching a run sees, on stderr (stdout is kept for `--json`): a rich progress bar with loss, tok/s
and ETA, and one line per evaluation. Disabled, every method is a no-op, so the loop never branches on it."""

from __future__ import annotations

from archspec.console import MarkupConsole
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class ProgressBar:
    def __init__(self, enabled: bool, total: int, description: str = "train"):
        self.enabled, self.total, self.description = enabled, total, description
        self.console = MarkupConsole(stderr=True, soft_wrap=True)  # long run lines stay whole in logs
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss [cyan]{task.fields[loss]}"),
            TextColumn("[green]{task.fields[tok_s]}[/] tok/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not enabled,
        )
        self._task = None

    def start(self, done: int = 0) -> None:
        """Show the bar from `done` steps (a resumed run); elapsed time and ETA count from here."""
        self._task = self._progress.add_task(self.description, total=self.total, completed=done, loss="-", tok_s="-")
        self._progress.start()

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        if self._task is None:
            self.start(step - 1)
        self._progress.update(self._task, completed=step, loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:,.0f}")

    def log(self, message: str) -> None:
        if self.enabled:
            self._progress.console.print(message, highlight=False)
