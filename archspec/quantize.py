"""`archspec quantize`: a run's weights to int8 or int4, evaluated on the run's own validation set, written beside the
run's checkpoint, and recorded as an evaluation of the run (`quant.<scheme>.<key>` in filters).

    result = quantize_source("1a2b3c4d", "int4")      # a run id, a run directory or a checkpoint file
    result.to_json()["val_loss_delta"], result.checkpoint, result.evaluation_id
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from archspec.console import NULL_TRACKER
from archspec.errors import UserError, printable
from archspec.quant.model import QuantPlan, apply_plan, quant_plan, quantized_state

TASK_PREFIX = "quant."  # an evaluation's task: quant.int8, quant.int4 (the registry's `evaluations` table)


@dataclass
class QuantResult:
    run_id: str | None
    plan: QuantPlan
    bytes: dict[str, int]
    val_loss_before: float
    val_loss_after: float
    checkpoint: str
    source: str
    evaluation_id: int | None = None
    not_recorded: str = ""  # why no evaluation was recorded
    kept: dict[str, str] = field(default_factory=dict)

    @property
    def val_loss_delta(self) -> float:
        return self.val_loss_after - self.val_loss_before

    def to_json(self) -> dict[str, Any]:
        """Exactly the keys `archspec quantize --json` prints."""
        return {"scheme": self.plan.scheme, "group_size": self.plan.group_size,
                "quantized_modules": list(self.plan.weights), **self.bytes,
                "val_loss_before": self.val_loss_before, "val_loss_after": self.val_loss_after,
                "val_loss_delta": self.val_loss_delta, "checkpoint": self.checkpoint}

    def metrics(self) -> dict[str, float]:
        """What the evaluation records (filters: `quant.int4.val_loss_delta < 0.05`, `quant.int8.size_ratio`)."""
        return {**{k: float(v) for k, v in self.bytes.items()}, "val_loss_before": self.val_loss_before,
                "val_loss_after": self.val_loss_after, "val_loss_delta": self.val_loss_delta,
                "val_loss_ratio": self.val_loss_after / self.val_loss_before,
                "size_ratio": self.bytes["weight_bytes_before"] / self.bytes["weight_bytes_after"],
                "quantized_modules": float(len(self.plan.weights))}


@torch.no_grad()
def val_loss(model: nn.Module, batches, tracker=NULL_TRACKER) -> float:
    """The loop's validation loss (archspec.train.loop.Trainer.evaluate): the mean over the fixed windows."""
    model.eval()
    loss_sum, windows = 0.0, 0
    for inputs, targets, *media in batches:  # a media corpus's batches carry their media (archspec.train.step)
        _, loss = model(inputs, targets, **({"media": media[0]} if media else {}))
        loss_sum += loss.item() * len(inputs)
        windows += len(inputs)
        tracker.update(advance=1)
    return loss_sum / windows


def quantized_path(checkpoint: Path, plan: QuantPlan) -> Path:
    """Beside the run's checkpoint: checkpoint-int8.pt, checkpoint-int4-g64.pt (+ -emb with the embeddings)."""
    name = f"checkpoint-{plan.scheme}" + (f"-g{plan.group_size}" if plan.group_size else "")
    return checkpoint.parent / (name + ("-emb" if plan.embeddings else "") + ".pt")


def quantize_source(source: str, scheme: str, *, group_size: int | None = None, embeddings: bool = False,
                    registry_url: str | None = None, record: bool = True, cache: str | Path | None = None,
                    tracker=NULL_TRACKER) -> QuantResult:
    """`tracker` (archspec.console.Tracker): the progress shown, in validation batches (two evaluations) plus the
    quantization itself."""
    from archspec.loading import load_model, resolve_source
    from archspec.spec import canonical_dict
    from archspec.cache import cache_dir
    from archspec.train.checkpoint import QUANTIZED_FORMAT, WEIGHTS_FORMAT, load_any, save_quantized
    from archspec.train.data import build_data

    kind, path = resolve_source(source, registry_url)
    if kind == "spec":
        raise UserError(f"{printable(source)}: a spec has no trained weights to quantize; pass a run id, a run "
                        "directory or a checkpoint")
    state = load_any(path)
    if state["format"] == QUANTIZED_FORMAT:
        raise UserError(f"{path}: already quantized ({state['quant'].get('scheme')}); quantize the full-precision "
                        f"checkpoint it was made from ({printable(str(state['source']), 200)})")
    loaded = load_model(str(path))
    spec, model = loaded.spec, loaded.model
    plan = quant_plan(model, spec, scheme, group_size, embeddings)  # refusals before any work
    data = build_data(spec, cache_dir(cache))  # the run's own validation windows (same recipe, same data hash)
    tracker.update("evaluating as trained", total=2 * len(data.val_batches) + 1)
    before = val_loss(model, data.val_batches, tracker)
    tracker.update(f"quantizing ({scheme})")
    counts = apply_plan(model, plan)
    tracker.update(f"evaluating {scheme}", advance=1)
    after = val_loss(model, data.val_batches, tracker)
    if not math.isfinite(after):
        raise UserError(f"{path}: the {scheme} model's validation loss is {after}; nothing written")
    from archspec.paths import new_output

    # Beside the checkpoint read, as resolved; a link there (pointing anywhere) is never written through.
    out = new_output(quantized_path(path, plan), "quantized checkpoint", replace=True)
    weights = state["format"] == WEIGHTS_FORMAT
    save_quantized(out, {
        "spec_hash": state["spec_hash"], "spec": canonical_dict(spec), "model": quantized_state(model),
        "quant": plan.to_json(), "source": str(path), "run_id": state.get("run_id"),
        "tokenizer": None if weights else state.get("tokenizer"),
        "tokenizer_files": dict(state["tokenizer"]) if weights else {},
    })
    result = QuantResult(state.get("run_id"), plan, counts, before, after, str(out), str(path), kept=plan.kept)
    if record:
        _record(result, registry_url)
    else:
        result.not_recorded = "--no-record"
    return result


def _record(result: QuantResult, registry_url: str | None) -> None:
    from archspec.registry import Registry, default_url
    from archspec.train.report import code_version

    if result.run_id is None:
        result.not_recorded = "the checkpoint names no run (a weights checkpoint)"
        return
    url = registry_url or default_url()
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file():
        result.not_recorded = f"no registry at {url}"
        return
    registry = Registry(url)
    try:
        if registry.run_status(result.run_id) is None:
            result.not_recorded = f"run {result.run_id} is not in registry {url}"
            return
        registry.upgrade()
        params = {**result.plan.to_json(), "source": result.source,
                  "kept": result.kept}  # what the units kept as trained, and why
        result.evaluation_id = registry.record_evaluation(result.run_id, TASK_PREFIX + result.plan.scheme, params,
                                                          result.metrics(), result.checkpoint, code_version())
    finally:
        registry.close()
