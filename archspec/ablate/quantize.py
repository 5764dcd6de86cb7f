"""A sweep's `quantize:` option: each finished run quantized at each scheme, once, and the figures its report reads.

    quantize: [int8, int4]        # in a sweep file (archspec.ablate.sweep)
    quantize_group_size: 32       # optional: int4's group (default: what `archspec quantize` picks)

The quantization is `archspec quantize`'s own (`archspec.quantize.quantize_source`: the run's validation set, the
checkpoint beside the run's, the evaluation `quant.<scheme>` in the registry). A run that already holds an evaluation
of that scheme (at the sweep's group size, embeddings as trained) is not quantized again: as resuming skips finished
runs, rerunning a sweep quantizes nothing new. A sweep without a group size accepts an int4 evaluation at any group
size the command chose by itself or was given.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from archspec.quantize import TASK_PREFIX


def scheme_group(scheme: str, group_size: int | None) -> int | None:
    """The group size `archspec quantize` is asked for: int4's, never int8's (one scale per output row)."""
    return group_size if scheme == "int4" else None


def matching(evaluations: Iterable[dict[str, Any]], scheme: str, group_size: int | None) -> dict[str, Any] | None:
    """The latest of a run's evaluations (`Registry.evaluations`) that is this scheme at this group size (None: any),
    with the embedding and head as trained; None when there is none."""
    want = scheme_group(scheme, group_size)
    found = None
    for e in evaluations:  # oldest first: the latest one stays
        params = e.get("params") or {}
        if e.get("task") != TASK_PREFIX + scheme or params.get("embeddings"):
            continue
        if want is not None and params.get("group_size") != want:
            continue
        found = e
    return found


def quantize_runs(run_ids: Iterable[str], schemes: list[str], group_size: int | None, registry_url: str | None, *,
                  cache=None, on_event: Callable[[str], None] = lambda line: None) -> dict[str, int]:
    """Quantize each finished run at each scheme it has no evaluation of yet; counts of `quantized` and `skipped`."""
    from archspec.quantize import quantize_source
    from archspec.registry import Registry

    counts = {"quantized": 0, "skipped": 0}
    registry = Registry(registry_url)
    try:
        for run_id in run_ids:
            done = registry.evaluations(run_id)
            for scheme in schemes:
                if matching(done, scheme, group_size) is not None:
                    counts["skipped"] += 1
                    continue
                result = quantize_source(run_id, scheme, group_size=scheme_group(scheme, group_size),
                                         registry_url=registry_url, cache=cache)
                counts["quantized"] += 1
                on_event(f"{run_id}: {scheme} val loss {result.val_loss_before:.4f} → {result.val_loss_after:.4f} "
                         f"({result.val_loss_delta:+.4f}), {result.metrics()['size_ratio']:.2f}× smaller")
    finally:
        registry.close()
    return counts


def run_figures(evaluations: Iterable[dict[str, Any]], schemes: Iterable[str], group_size: int | None
                ) -> dict[str, dict[str, float]]:
    """scheme → the metrics of its matching evaluation (val_loss_delta, size_ratio, ...), for the schemes a run has."""
    evaluations = list(evaluations)
    out = {}
    for scheme in schemes:
        e = matching(evaluations, scheme, group_size)
        if e is not None:
            out[scheme] = dict(e["metrics"])
    return out


def recorded_schemes(evaluations: Iterable[dict[str, Any]]) -> list[str]:
    """The schemes a run has been quantized at (a report rebuilt without the sweep file shows those)."""
    from archspec.quant.schemes import SCHEMES

    tasks = {e.get("task") for e in evaluations}
    return [s for s in SCHEMES if TASK_PREFIX + s in tasks]


__all__ = ["matching", "quantize_runs", "run_figures", "recorded_schemes", "scheme_group"]
