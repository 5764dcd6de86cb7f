"""Low-precision training beside fp32/bf16 (`train.precision`): fp16 with dynamic loss scaling, and fp8.

fp16: autocast fp16 and `torch.amp.GradScaler` (on the CPU too): the loss is multiplied by the scale before backward,
the gradients are unscaled before clipping, and a step whose gradients overflowed (inf/NaN) is skipped, never
applied; the scale halves then, and doubles after `growth_interval` clean steps. The loop records `loss_scale` and
`skipped_steps`.

fp8: torchao's float8 training (`convert_to_float8_training`) of the linears the units quantize
(`KindUnit.quantized_weights`: the attention and FFN projections; routers, norms, embedding and head stay bf16),
per-tensor or row-wise scales (`train.fp8_scaling`), on a CUDA device with FP8 matmuls (compute capability ≥ 8.9:
Ada, Hopper, Blackwell); everything else runs under bf16 autocast. Refused elsewhere, before the run starts.
"""

from __future__ import annotations

import torch
from torch import nn

from archspec.errors import UserError

FP8_CAPABILITY = (8, 9)  # torch._scaled_mm's float8 kernels: Ada (8.9), Hopper (9.0) and later


def fp8_problem(device: torch.device) -> str | None:
    """Why this device cannot train in fp8 (None: it can)."""
    if device.type != "cuda":
        return (f"train.precision fp8: needs a CUDA device with FP8 matmuls (compute capability ≥ 8.9: Ada, Hopper); "
                f"this run is on {device.type}; use precision bf16, fp16 or fp32 here")
    cap = torch.cuda.get_device_capability(device)
    if tuple(cap) < FP8_CAPABILITY:
        return (f"train.precision fp8: {torch.cuda.get_device_name(device)} has compute capability "
                f"{cap[0]}.{cap[1]}, without FP8 matmuls (needs ≥ 8.9: Ada, Hopper); use precision bf16")
    return None


def check_precision(precision: str, device: torch.device, parallel_kind: str, distributed: bool) -> None:
    """Refuse a precision this device or layout cannot run, before anything is built or recorded."""
    if precision == "fp8":
        problem = fp8_problem(device)
        if problem:
            raise UserError(problem)
    if precision == "fp16" and distributed and parallel_kind == "fsdp":
        raise UserError("train.precision fp16: loss scaling under FSDP needs a sharded gradient scaler, which the "
                        "loop does not run; use precision bf16 with FSDP (or parallel ddp)")


def loss_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """The dynamic loss scaler of precision fp16; None for every other precision."""
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None


def fp8_linears(model: nn.Module, spec) -> list[str]:
    """The linears float8 training converts: those whose weight the units quantize, with both widths multiples of 16
    (torch._scaled_mm's rule)."""
    from archspec.quant.model import _unit_weights

    names, _ = _unit_weights(model, spec)
    out = []
    for name in names:
        path, _, attr = name.rpartition(".")
        module = model.get_submodule(path)
        if attr == "weight" and isinstance(module, nn.Linear) and module.in_features % 16 == 0 \
                and module.out_features % 16 == 0:
            out.append(path)
    return out


def convert_fp8(model: nn.Module, spec, scaling: str) -> list[str]:
    """Swap the `fp8_linears` for torchao's Float8Linear (in place); returns their names."""
    from archspec.quant.weights import torchao

    torchao()
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    chosen = set(fp8_linears(model, spec))
    if not chosen:
        raise UserError("train.precision fp8: no linear layer of this model has widths that are multiples of 16; "
                        "use precision bf16")
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(scaling),
                               module_filter_fn=lambda module, fqn: fqn in chosen)
    return sorted(chosen)
