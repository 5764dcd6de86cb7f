"""Weight-only quantization of trained runs (`archspec quantize`, `archspec sample --quantize`): int8 through torchao
(the `archspec[quant]` extra), int4 group-wise packed by archspec. See `archspec.quant.weights` (the schemes),
`archspec.quant.model` (which weights: the units decide; the stored form; the bytes). The command (evaluate on the
run's validation set, write the checkpoint, record the evaluation) is archspec.quantize, above this package: it loads
the run (archspec.loading) and its data (archspec.train), which this package never imports.

The names below are imported when first used, so that `archspec.quant.schemes` (the scheme names a sweep file is
checked against) is read without importing torch."""

from archspec.quant.schemes import GROUP_SIZES, SCHEMES

_LAZY = {"QuantPlan": "model", "apply_plan": "model", "quant_plan": "model", "quantized_state": "model",
         "weight_bytes": "model", "QWeight": "weights"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"archspec.quant.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'archspec.quant' has no attribute {name!r}")


__all__ = ["QuantPlan", "apply_plan", "quant_plan", "quantized_state", "weight_bytes", "GROUP_SIZES", "SCHEMES",
           "QWeight"]
