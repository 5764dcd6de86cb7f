"""Peak FLOP/s of a device, for model FLOPs utilisation (MFU = model FLOPs per second ÷ peak).

CUDA: the vendor's dense bf16 tensor-core peak from a table of known parts. CPU (and an unknown GPU): the best rate of
a large matmul in the dtype the loop trains in, measured once per (processor, threads, torch version) and cached, so
CPU MFU reads as a share of what this machine's matmul can actually do.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import torch

from archspec.train.cache import atomic_write_text

# Dense bf16 peaks (FLOP/s) from NVIDIA datasheets; first match of the device name wins, so list specific names first.
CUDA_BF16_PEAK = [
    ("H200", 989.4e12),
    ("H100 PCIe", 756.0e12),
    ("H100", 989.4e12),  # SXM (reported as "H100 80GB HBM3")
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("RTX 4090", 165.2e12),
]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure_matmul_flops(device: torch.device, dtype: torch.dtype, n: int = 2048, repeats: int = 10) -> float:
    """Best FLOP/s of an n×n by n×n matmul (2n³ FLOPs) over repeats, after one warm-up: the best, because other
    work on the machine only ever slows a repeat down."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    best = float("inf")
    for i in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:  # the first one warms up kernels and caches
            best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def _table_peak(name: str) -> float | None:
    return next((peak for key, peak in CUDA_BF16_PEAK if key in name), None)


def _measurement_key(device: torch.device, dtype: torch.dtype) -> str:
    if device.type == "cuda":
        return f"cuda|{torch.cuda.get_device_name(device)}|{dtype}|torch {torch.__version__}"
    return f"cpu|{cpu_name()}|{torch.get_num_threads()} threads|{dtype}|torch {torch.__version__}"


def peak_flops(device: torch.device, dtype: torch.dtype, cache: Path) -> tuple[float, str]:
    """(peak FLOP/s of one device, where the figure comes from)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = _table_peak(name)
        if peak is not None and dtype == torch.bfloat16:
            return peak, f"datasheet bf16 peak of {name}"
    key = _measurement_key(device, dtype)
    return _cached_measurement(key, device, dtype, cache), f"measured matmul rate ({key})"


def raise_measured_peak(device: torch.device, dtype: torch.dtype, cache: Path, achieved: float) -> float:
    """A run that achieved more than the cached "peak" proves the measurement was taken on a busy machine: the peak
    is at least what was achieved, so the cache keeps the higher figure (and MFU stays a fraction)."""
    key = _measurement_key(device, dtype)
    path = cache / "peak_flops.json"
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    table[key] = max(float(table.get(key, 0.0)), achieved)
    _store(path, table)
    return table[key]


def _store(path: Path, table: dict) -> None:
    """Keep the measurement for next time; a cache that cannot be written (full disk) only costs a re-measurement."""
    try:
        atomic_write_text(path, json.dumps(table, indent=2, sort_keys=True))
    except OSError:
        pass


def _cached_measurement(key: str, device: torch.device, dtype: torch.dtype, cache: Path) -> float:
    path = cache / "peak_flops.json"
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    if key not in table:
        # Seeded apart from the run's RNG: measuring must not change the training random stream.
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            slow = device.type == "cpu" and dtype != torch.float32  # no native bf16 on most CPUs: ~0.3 GFLOP/s
            table[key] = measure_matmul_flops(device, dtype, n=256 if slow else 2048)
        _store(path, table)
    return float(table[key])


def mfu(flops_per_token: float, tokens_per_s: float, peak_per_device: float, devices: int) -> float:
    return flops_per_token * tokens_per_s / (peak_per_device * devices)
