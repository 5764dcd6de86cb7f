"""Weight-only quantization of trained runs (`archspec quantize`, `archspec sample --quantize`): int8 through torchao
(the `archspec[quant]` extra), int4 group-wise packed by archspec. See `archspec.quant.weights` (the schemes),
`archspec.quant.model` (which weights: the units decide; the stored form; the bytes) and `archspec.quant.run` (the
command: evaluate on the run's validation set, write the checkpoint, record the evaluation)."""

from archspec.quant.model import QuantPlan, apply_plan, quant_plan, quantized_state, weight_bytes
from archspec.quant.weights import GROUP_SIZES, SCHEMES, QWeight

__all__ = ["QuantPlan", "apply_plan", "quant_plan", "quantized_state", "weight_bytes", "GROUP_SIZES", "SCHEMES",
           "QWeight"]
