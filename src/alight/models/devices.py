"""What a device computes natively: the embedded backend's `algorithm.precision: auto` and the
embedded engine's `engine.dtype: auto` read it (bfloat16 where the hardware has it, else float32)."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((line for line in text.splitlines() if line.startswith(("flags", "Features"))), "")
    return frozenset(line.partition(":")[2].split())


def native_bf16(device: str) -> bool:
    """Whether `device` (cpu, cuda, cuda:N) computes bfloat16 matrix products natively."""
    import torch

    if device.startswith("cuda"):
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device != "cpu":
        return False
    cpu = torch.cpu
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        check = getattr(cpu, probe, None)
        if check is not None and check():
            return True
    return "bf16" in _cpu_flags()  # ARM's BF16 extension (Graviton 3, Neoverse V1/N2, Apple M2+ Linux)
