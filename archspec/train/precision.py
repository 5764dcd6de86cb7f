"""A run's numeric precision in one object: the autocast dtype, fp16's loss scaler, fp8's float8 linears, the FSDP
mixed-precision policy, and the element sizes the memory plan counts with (archspec.recipe.RecipeView).

    precision = Precision.of(spec.train, device, world)   # refuses what the device or layout cannot run
    precision.convert(model, spec)                         # fp8: the float8 linears, in place
    with precision.autocast(): loss = model(x, y)[1]
    precision.backward(loss)                               # fp16: scaled
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

from archspec.quant.precision import check_precision, convert_fp8, loss_scaler
from archspec.recipe import RecipeView


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """None: plain fp32. `auto` is bf16 autocast on a CUDA device that has bf16, fp32 elsewhere (CPUs without native
    bf16 run it hundreds of times slower)."""
    if precision == "fp32":
        return None
    if precision in ("bf16", "fp8"):  # fp8: the float8 linears (archspec.quant.precision) inside bf16 autocast
        return torch.bfloat16
    if precision == "fp16":
        return torch.float16
    return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None


@dataclass
class Precision:
    name: str  # train.precision
    device: torch.device
    amp_dtype: torch.dtype | None  # the compute dtype (None: fp32)
    scaler: torch.amp.GradScaler | None  # fp16: dynamic loss scaling
    fp8_scaling: str = "tensorwise"
    autocast_dtype: torch.dtype | None = None  # None once FSDP's (or replicate's) bf16 parameters replace autocast
    fp8_linears: list[str] = field(default_factory=list)
    skipped_steps: int = 0  # fp16: steps whose gradients overflowed, skipped

    @classmethod
    def of(cls, recipe, device: torch.device, world) -> Precision:
        check_precision(recipe.precision, device, recipe.parallel.kind, world.distributed)
        amp = autocast_dtype(recipe.precision, device)
        return cls(recipe.precision, device, amp, loss_scaler(recipe.precision, device), recipe.fp8_scaling, amp)

    def convert(self, model: nn.Module, spec) -> None:
        """fp8: swap the float8-capable linears for torchao's (before any parallelism touches the model)."""
        if self.name == "fp8":
            self.fp8_linears = convert_fp8(model, spec, self.fp8_scaling)

    # ── compute ──

    def autocast(self) -> AbstractContextManager:
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def fsdp_policy(self):
        """FSDP2's MixedPrecisionPolicy: bf16 parameters (gathered in bf16, so matmuls run in bf16) with fp32 gradient
        reduction on CUDA; full fp32 on CPU, where bf16 has no fast kernels."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if self.device.type == "cuda" and self.amp_dtype is not None:
            return MixedPrecisionPolicy(param_dtype=self.amp_dtype, reduce_dtype=torch.float32)
        return MixedPrecisionPolicy()

    def parameters_replace_autocast(self) -> None:
        """Under FSDP (or replicate) on CUDA the bf16 parameters of `fsdp_policy` replace autocast."""
        if self.device.type == "cuda":
            self.autocast_dtype = None

    def element_bytes(self) -> int:
        """Element size of matmul inputs and outputs (the memory plan's rule, archspec.recipe)."""
        return RecipeView(1, 1, 1, precision=self.name).matmul_bytes(self.device.type)

    # ── the loss scaler (fp16) ──

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of `loss`; fp16: of the scaled loss, so small gradients stay above fp16's smallest."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer) -> None:
        """fp16: true gradients before norms and clipping (records any inf/NaN found)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def overflowed(self, grad_norm: float) -> bool:
        """fp16: overflowed gradients are the loss scale's to handle (the step is skipped); a non-finite loss is not."""
        return self.scaler is not None and not math.isfinite(grad_norm)

    def optimizer_step(self, optimizer, overflow: bool) -> None:
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)  # skipped when unscale_ found inf/NaN gradients
        self.scaler.update()  # halves the scale after an overflow, grows it after enough clean steps
        self.skipped_steps += overflow

    def metrics(self) -> dict[str, float]:
        """fp16: the scale the next step uses, and the overflowed steps so far."""
        if self.scaler is None:
            return {}
        return {"loss_scale": float(self.scaler.get_scale()), "skipped_steps": float(self.skipped_steps)}

    def state_dict(self) -> dict | None:
        if self.scaler is None:
            return None
        return {**self.scaler.state_dict(), "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state) -> None:
        """fp16: the scale carries on where it was (ValueError: not a loss scaler's state)."""
        if self.scaler is None or not isinstance(state, dict):
            return
        state = dict(state)
        self.skipped_steps = int(state.pop("skipped_steps", 0))
        try:
            self.scaler.load_state_dict(state)
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise ValueError(str(e)) from None

    # ── how it is shown ──

    def describe(self) -> str:
        """The run's start line: what computes in which dtype."""
        if self.fp8_linears:
            return f"fp8 ({self.fp8_scaling}) in {len(self.fp8_linears)} linears, bf16 autocast"
        return {torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast + loss scaling"}.get(
            self.amp_dtype, "fp32")

    def tag(self) -> str:
        """The registry's `precision` tag."""
        return "float8" if self.fp8_linears else str(self.amp_dtype or torch.float32).replace("torch.", "")
