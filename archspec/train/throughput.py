"""Peak FLOP/s of a device, for model FLOPs utilisation (MFU = model FLOPs per second ÷ peak).

CUDA: the vendor's dense bf16 tensor-core peak from a table of known parts. CPU (and an unknown GPU): the best rate of
a large matmul in the dtype the loop trains in, measured once per (processor, threads, torch version) and cached. So
CPU "MFU" is the fraction of this machine's measured matmul rate, not of a datasheet peak; runs never rewrite it.

Every MFU comes with its FLOP convention (OUR_CONVENTION) and, for dense models, the 6N + 12·L·H·Q·T figure beside it.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import time
from pathlib import Path

import torch

from archspec.cache import atomic_write_text

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


CEILING_FILE = "peak_flops.json"
_REMEASURED: set[str] = set()  # keys this process has measured already (a ceiling taken under load, once a process)


def peak_flops(device: torch.device, dtype: torch.dtype, cache: Path, store: bool = True) -> tuple[float, str]:
    """(peak FLOP/s of one device, what the figure is).

    CUDA with a known part: its datasheet bf16 peak. Otherwise (CPU, an unknown GPU): the ceiling measured once per
    (processor, threads, dtype, torch version) and cached in `cache/peak_flops.json`. A run only ever reads it: no run
    rewrites it, whatever it achieves (an MFU above 1 is flagged instead, see `mfu_flag`). `archspec peak --measure`
    measures it again, to be run in a quiet moment. `store=False` (a command that only reads, such as a dry run):
    measure when nothing is cached, but keep nothing."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = _table_peak(name)
        if peak is not None and dtype == torch.bfloat16:
            return peak, f"datasheet bf16 peak of {name}"
    key = _measurement_key(device, dtype)
    entry = read_ceiling(device, dtype, cache)
    # One ceiling per machine, stored, that only ever rises: a measurement under load is a lower bound of the
    # machine's rate, so it is kept until a higher one replaces it (a quiet moment, `archspec peak --measure`), and no
    # run under load can lower it (every run's MFU is a fraction of the same figure).
    if entry is None and not store:  # measured once a process, kept in memory only
        if key not in _UNSTORED:
            _UNSTORED[key] = measure_ceiling(device, dtype, cache, store=False)
        entry = _UNSTORED[key]
    if entry is None:
        entry = measure_ceiling(device, dtype, cache)
    elif (store and entry.get("under_load") and device.type == "cpu" and not machine_busy()
          and key not in _REMEASURED):
        _REMEASURED.add(key)  # quiet now: measured again, once a process, and kept if higher
        entry = measure_ceiling(device, dtype, cache)
    if entry.get("under_load"):
        return entry["flops"], (f"this machine's matmul rate, measured under load (load average "
                                f"{entry['load_average']:.1f}; the highest so far: no run lowers it; `archspec peak "
                                f"--measure` in a quiet moment raises it) ({key}, {entry['measured_at']})")
    return entry["flops"], f"this machine's measured matmul rate ({key}, {entry['measured_at']})"


_UNSTORED: dict[str, dict] = {}  # ceilings a read-only command measured (peak_flops(store=False)), this process only


def machine_busy() -> bool:
    """Whether other work is using the CPUs now (1-minute load average above a quarter of the cores)."""
    try:
        return os.getloadavg()[0] > 0.25 * (os.cpu_count() or 1)
    except OSError:
        return False


def _read_table(cache: Path) -> dict:
    try:
        table = json.loads((cache / CEILING_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def read_ceiling(device: torch.device, dtype: torch.dtype, cache: Path) -> dict | None:
    """The cached measurement, or None. Entries from before the record held a date (bare numbers) may have been
    raised by runs (an older release did that), so they are not trusted: None, and the caller measures afresh."""
    entry = _read_table(cache).get(_measurement_key(device, dtype))
    if isinstance(entry, dict) and isinstance(entry.get("flops"), (int, float)) and entry["flops"] > 0:
        return entry
    return None


def measure_ceiling(device: torch.device, dtype: torch.dtype, cache: Path, repeats: int = 10,
                    store: bool = True) -> dict:
    """Measure the matmul rate now and (`store`) keep it in the per-user cache (the only writer of the file) when it
    is higher than the stored one: other work only ever slows a measurement down, so the highest is the machine's
    figure, and a measurement under load never lowers it. Returns the entry the cache holds now (`latest`: this
    measurement's rate)."""
    # Seeded apart from the run's RNG: measuring must not change the training random stream.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        slow = device.type == "cpu" and dtype != torch.float32  # no native bf16 on most CPUs: ~0.3 GFLOP/s
        n = 256 if slow else 2048
        flops = measure_matmul_flops(device, dtype, n=n, repeats=repeats)
    busy = device.type == "cpu" and machine_busy()
    entry = {"flops": flops, "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "how": f"best of {repeats} {n}x{n} matmuls", "load_average": os.getloadavg()[0],
             **({"under_load": True} if busy else {})}
    old = read_ceiling(device, dtype, cache)
    if old is not None and old["flops"] >= flops:
        return {**old, "latest": flops}
    if store:
        table = _read_table(cache)
        table[_measurement_key(device, dtype)] = entry
        _store(cache / CEILING_FILE, table)
    return {**entry, "latest": flops}


def _store(path: Path, table: dict) -> None:
    """Keep the measurement for next time; a cache that cannot be written (full disk) only costs a re-measurement."""
    try:
        atomic_write_text(path, json.dumps(table, indent=2, sort_keys=True))
    except OSError:
        pass


# ── the FLOP conventions an MFU can be quoted in ─────────────────────────────────────────────────────────────────

OUR_CONVENTION = "exact matmul FLOPs, causal attention at (T+1)/2 keys, train = 3 × forward"
PALM_CONVENTION = "6N + 12·L·H·Q·T (PaLM, nanoGPT): N params less position tables, attention at all T keys"


def palm_train_flops_per_token(acc, n_layers: int, n_heads: int, head_dim: float) -> int | None:
    """Training FLOPs per token by the 6N + 12·L·H·Q·T convention (PaLM appendix B; nanoGPT's estimate_mfu), the one
    most published MFU figures use. Ours counts the causal mask's (T+1)/2 keys and no non-matmul parameters (norms,
    an untied input embedding), so it is a few percent lower. None for models with routed experts (N is ambiguous)."""
    if acc.active != acc.total:
        return None
    n = acc.total - acc.by_component.get("position", 0)
    return 6 * n + round(12 * n_layers * n_heads * head_dim * acc.seq_len)  # head_dim: (q·k + v widths) / 2


def mfu_flag(value: float) -> str | None:
    """Why an MFU cannot be taken at face value, or None. Above 1 means the ceiling was measured on a busy machine
    (or the FLOP count is off): flagged, never hidden by raising the ceiling."""
    if value > 1.0:  # the figure itself is never printed: it says nothing about the run
        return ("MFU above 100%: the ceiling is below what this run achieved; measure it again in a quiet moment "
                "with `archspec peak --measure`")
    return None


def mfu(flops_per_token: float, tokens_per_s: float, peak_per_device: float, devices: int) -> float:
    return flops_per_token * tokens_per_s / (peak_per_device * devices)


def reset_peak_memory(device: torch.device) -> None:
    """Start this run's peak-memory window: a sweep trains many runs in one process, and each reports its own peak.
    CUDA: the allocator's peak stats. Linux: writing 5 to /proc/self/clear_refs resets VmHWM (peak RSS) to the
    current RSS. Elsewhere the process-lifetime peak is all there is (`peak_memory_bytes` then over-reports)."""
    if device.type == "cuda":
        torch.cuda.init()  # the allocator's stats refuse a device ("Invalid device argument") before CUDA starts
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_memory_bytes(device: torch.device) -> int:
    """Peak since `reset_peak_memory`: CUDA allocated bytes, or the process's peak RSS (VmHWM) on Linux."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB: the process's peak RSS
