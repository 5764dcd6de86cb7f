"""What a training run returns (`TrainResult`), how a non-finite step stops it, and the spec of a shortened run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from archspec.spec import Spec, canonical_dict, load_spec_dict


class NonFiniteLoss(Exception):
    """A step produced a NaN/inf loss or gradient norm; the update was not applied."""


@dataclass
class TrainResult:
    run_id: str
    status: str  # FINISHED | FAILED (KILLED and crashes propagate as exceptions)
    error: str | None
    step: int  # optimizer steps completed, counting those before a resume
    metrics: dict[str, float]  # the summary sent to the logger
    losses: list[float] = field(default_factory=list)  # train loss of every step this call ran
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, val_loss)
    run_dir: Path | None = None
    checkpoint: Path | None = None
    nothing_to_do: bool = False  # --resume of a FINISHED run at its final step: not trained, nothing recorded

    def to_json(self) -> dict[str, Any]:
        out = {"run_id": self.run_id, "status": self.status, "error": self.error, "step": self.step,
               **self.metrics, "run_dir": str(self.run_dir), "checkpoint": str(self.checkpoint) if self.checkpoint else None}
        if self.nothing_to_do:
            out["nothing_to_do"] = True
        return out


def with_steps(spec: Spec, steps: int) -> Spec:
    """The spec with train.steps replaced, validated again. A warmup longer than the shortened run is cut to the
    run's length (a 5-step smoke test of a preset with 10 warmup steps should just run)."""
    overrides = [f"train.steps={int(steps)}"]
    if spec.train.warmup_steps > steps:
        overrides.append(f"train.warmup_steps={int(steps)}")
    return load_spec_dict(canonical_dict(spec), overrides, origin=f"{spec.name} (--steps {steps})")
