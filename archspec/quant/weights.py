"""Quantized weights: the two schemes' arithmetic and the modules that compute with them.

int8: torchao's weight-only INT8 (`Int8WeightOnlyConfig`): one int8 per weight, one fp32 scale (and zero point) per
output row. On an `nn.Linear` torchao's tensor subclass replaces the weight and its own kernel runs the matmul; stacked
weights (MoE experts) keep the same parts (`Int8Tensor.from_hp`, per row) and are rebuilt when the model reads them.

int4: group-wise asymmetric min-max (archspec's own; torchao 0.18 has no CPU int4 path that packs): each run of
`group_size` weights along the input width gets a scale (max - min) / 15 and its minimum, q = round((w - min) / scale)
in 0..15, w ≈ q · scale + min. Two values are packed per byte (low nibble: the even column). On the CPU an
`Int4Linear` decoding one token runs aten's `_weight_int4pack_mm_for_cpu` (tinygemm's layout, repacked once when first
used: not stored); with more rows (a prompt, an evaluation batch: the kernel is far slower there, KERNEL_MAX_ROWS),
elsewhere, or where the kernel's shape rules fail (out features a multiple of 16), it unpacks and multiplies.
No GPTQ/AWQ calibration: torchao's GPTQ is a CUDA-only prototype.

Every quantized weight is a `QWeight`: its scheme, shape and plain tensors (`parts`), which is what a quantized
checkpoint stores (plain tensors only: `torch.load(weights_only=True)` reads it) and what the byte counts add up.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from archspec.errors import UserError
from archspec.quant.schemes import GROUP_SIZES, SCHEMES  # noqa: F401  (re-exported: archspec.quant.weights.SCHEMES)

INT4_LEVELS = 15  # 4 bits: 0..15
KERNEL_GROUPS = (32, 64, 128, 256)  # what _weight_int4pack_mm_for_cpu takes
# Rows (tokens) up to which the int4 kernel runs: measured on this 2-core CPU (torch 2.13, 128 → 352 features, one
# thread) it takes 0.09 ms for one row but 9.9 ms for 16 and 600 ms for 1024, where unpacking and an fp32 matmul take
# 1.4 and 14 ms: the kernel is for decoding one token at a time.
KERNEL_MAX_ROWS = 1


def torchao():
    """The torchao package (the `archspec[quant]` extra), imported quietly: its CUDA-only libraries that fail to load
    on a CPU machine are logged by torchao as warnings, which say nothing about this model."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # torchao's own loader, and torch's pytree on torchao's enum registration (a deprecation of torch's)
            logs = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
            levels = [log.level for log in logs]
            for log in logs:
                log.setLevel(logging.ERROR)
            try:
                import torchao as ao
                from torchao.quantization import Int8Tensor, Int8WeightOnlyConfig, quantize_  # noqa: F401
            finally:
                for log, level in zip(logs, levels):
                    log.setLevel(level)
    except ImportError as e:
        raise UserError(f"int8 quantization runs on torchao, which is not installed ({e}); install the extra: "
                        "pip install 'archspec[quant]'") from None
    return ao


@dataclass
class QWeight:
    """One quantized weight: its scheme, its full-precision shape, its group size (int4) and its plain tensors."""

    scheme: str
    shape: tuple[int, ...]
    group_size: int | None
    parts: dict[str, torch.Tensor]  # int8: qdata, scale, zero_point; int4: packed, scale, minimum

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.parts.values())

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The fp32 weight (or only the rows `rows` of its first dimension: an embedding's lookup)."""
        p = {k: (v if rows is None else v[rows]) for k, v in self.parts.items()}
        if self.scheme == "int8":
            return (p["qdata"].float() - p["zero_point"].float()) * p["scale"]
        q = unpack_int4(p["packed"])  # (..., K) in 0..15
        groups = q.reshape(*q.shape[:-1], -1, self.group_size).float()  # (..., K / G, G)
        w = groups * p["scale"][..., None] + p["minimum"][..., None]
        return w.reshape(q.shape)


def quantize_int8(w: torch.Tensor) -> QWeight:
    """torchao's per-row weight-only INT8 of any weight whose last dimension is its input width."""
    torchao()
    from torchao.quantization import Int8Tensor
    from torchao.quantization.granularity import PerRow

    t = Int8Tensor.from_hp(w.detach().float(), granularity=PerRow())
    return QWeight("int8", tuple(w.shape), None, int8_parts(t))


def int8_parts(t) -> dict[str, torch.Tensor]:
    """A torchao Int8Tensor's plain tensors (a symmetric one has zero points of 0: kept, they are what it holds)."""
    zero = getattr(t, "zero_point", None)
    if zero is None:
        zero = torch.zeros_like(t.scale, dtype=torch.int8)
    return {"qdata": t.qdata.detach(), "scale": t.scale.detach(), "zero_point": zero.detach()}


def quantize_int4(w: torch.Tensor, group_size: int) -> QWeight:
    """Group-wise asymmetric min-max int4 along the last dimension, two values per byte."""
    k = w.shape[-1]
    if k % group_size or k % 2:
        raise ValueError(f"input width {k} is not a multiple of the group size {group_size}")
    g = w.detach().float().reshape(*w.shape[:-1], k // group_size, group_size)  # (..., K / G, G)
    minimum = g.amin(dim=-1)
    scale = ((g.amax(dim=-1) - minimum) / INT4_LEVELS).clamp_min(torch.finfo(torch.float32).tiny)
    q = ((g - minimum[..., None]) / scale[..., None]).round().clamp(0, INT4_LEVELS).to(torch.uint8).reshape(w.shape)
    return QWeight("int4", tuple(w.shape), group_size,
                   {"packed": pack_int4(q), "scale": scale.contiguous(), "minimum": minimum.contiguous()})


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """(..., K) values in 0..15 → (..., K / 2) bytes: column 2j in the low nibble, 2j + 1 in the high one."""
    q = q.to(torch.uint8)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_int4`: (..., K / 2) bytes → (..., K) uint8 values."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def quantize(w: torch.Tensor, scheme: str, group_size: int | None) -> QWeight:
    if scheme == "int8":
        return quantize_int8(w)
    if scheme == "int4":
        return quantize_int4(w, group_size or GROUP_SIZES[-1])
    raise ValueError(f"unknown scheme {scheme!r}")


# ── modules ───────────────────────────────────────────────────────────────────────────────────────────────────


class Int4Linear(nn.Module):
    """An nn.Linear whose weight is int4 (`QWeight` parts as buffers, so its state_dict is the stored form)."""

    def __init__(self, qweight: QWeight, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.group_size = qweight.group_size
        for name, t in qweight.parts.items():
            self.register_buffer(name, t)
        self.bias = nn.Parameter(bias.detach(), requires_grad=False) if bias is not None else None
        self._kernel: tuple[torch.Tensor, torch.Tensor] | None = None  # tinygemm's layout, made on first use

    @property
    def qweight(self) -> QWeight:
        return QWeight("int4", (self.out_features, self.in_features), self.group_size,
                       {k: getattr(self, k) for k in ("packed", "scale", "minimum")})

    def kernel_usable(self, x: torch.Tensor) -> bool:
        return (x.device.type == "cpu" and x.dtype == torch.float32 and self.out_features % 16 == 0
                and x.numel() // self.in_features <= KERNEL_MAX_ROWS
                and self.group_size in KERNEL_GROUPS and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"))

    def _kernel_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._kernel is None:
            q = unpack_int4(self.packed).to(torch.int32)  # (N, K)
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
            # tinygemm's convention: w = (q - 8) · scale + zero, so zero = minimum + 8 · scale
            zero = self.minimum + 8 * self.scale
            scales_zeros = torch.stack([self.scale, zero], dim=-1).transpose(0, 1).contiguous()  # (K / G, N, 2)
            self._kernel = (packed, scales_zeros)
        return self._kernel

    def _load_from_state_dict(self, *args, **kwargs):  # new parts: the kernel's copy is made again
        self._kernel = None
        return super()._load_from_state_dict(*args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel_usable(x):
            packed, scales_zeros = self._kernel_weights()
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, self.in_features), packed,
                                                           self.group_size, scales_zeros)
            y = y.reshape(*x.shape[:-1], self.out_features)
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.qweight.dequantize().to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}"


class QuantizedParameters(nn.Module):
    """Stands in for a plain container module (a MoE layer's stacked `experts`) whose parameters the generated code
    reads directly (`self.experts.up_proj.transpose(1, 2)`): each quantized one reads back as its fp32 weight, rebuilt
    from the parts (buffers `<name>__<part>`) on each access; the others are the original parameters."""

    def __init__(self, original: nn.Module, quantized: dict[str, QWeight]):
        nn.Module.__init__(self)  # not the original class's __init__ (see `quantized_parameters`): nothing allocated
        for name, p in original.named_parameters(recurse=False):
            if name not in quantized:
                self.register_parameter(name, p)
        for name, b in original.named_buffers(recurse=False):
            self.register_buffer(name, b)
        for name, child in original.named_children():
            self.add_module(name, child)
        self.__dict__["_quantized"] = {n: (q.scheme, q.shape, q.group_size, tuple(q.parts)) for n, q in quantized.items()}
        for name, q in quantized.items():
            for part, t in q.parts.items():
                self.register_buffer(f"{name}__{part}", t)

    def qweight(self, name: str) -> QWeight:
        scheme, shape, group, parts = self.__dict__["_quantized"][name]
        return QWeight(scheme, shape, group, {p: self._buffers[f"{name}__{p}"] for p in parts})

    def __getattr__(self, name: str):
        if name in self.__dict__.get("_quantized", ()):
            return self.qweight(name).dequantize()
        return super().__getattr__(name)


def quantized_parameters(original: nn.Module, quantized: dict[str, QWeight]) -> QuantizedParameters:
    """A QuantizedParameters standing in for `original`. When the original's class has code of its own (the generated
    MoE's `Experts`: its forward reads its weights), the stand-in is of a subclass of both, so that code runs on the
    weights read back."""
    cls = type(original)
    if cls is nn.Module:
        return QuantizedParameters(original, quantized)
    return type(f"Quantized{cls.__name__}", (QuantizedParameters, cls), {})(original, quantized)


class QuantizedEmbedding(nn.Module):
    """An nn.Embedding whose table is quantized: a lookup dequantizes only the rows it reads."""

    def __init__(self, qweight: QWeight):
        super().__init__()
        self.__dict__["_layout"] = (qweight.scheme, qweight.shape, qweight.group_size, tuple(qweight.parts))
        for part, t in qweight.parts.items():
            self.register_buffer(part, t)

    @property
    def qweight(self) -> QWeight:
        scheme, shape, group, parts = self.__dict__["_layout"]
        return QWeight(scheme, shape, group, {p: self._buffers[p] for p in parts})

    @property
    def weight(self) -> torch.Tensor:  # a reader of the whole table (a tied head that was not quantized)
        return self.qweight.dequantize()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.qweight.dequantize(idx)
