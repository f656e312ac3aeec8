"""The arithmetic of the embedded backend's forward passes: float32, or bfloat16 autocast.

`algorithm.precision`:

- `fp32` (default): every matrix product in float32.
- `bf16`: the decoder's matrix products in bfloat16 under `torch.autocast` (forward, and backward
  through the same casts); the weights, their gradients and the optimizer stay float32 (master
  weights), and so do the residual stream, the norms and the output layer: the log-probs a ratio
  is taken from come out of a float32 output layer and log-softmax (`chunked.head_log_probs`).
- `auto`: `bf16` where the device computes bfloat16 natively (a CPU with AVX512-BF16 or AMX, an
  ARM CPU with BF16, a CUDA GPU that supports it), else `fp32`.

A CPU without native bfloat16 emulates it, slower than float32: `bf16` there runs with a warning.
How far bf16 moves a batch's loss, log-probs and gradient from fp32 is measured in
`tests/backends/test_precision.py` (the tolerances are stated there) and `benchmarks/update_bench.py`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from alight.errors import ConfigError
from alight.models.devices import native_bf16

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16", "auto")


def check_precision(value: object) -> None:
    """ConfigError, in one line, for a value that is not a precision."""
    if value not in PRECISIONS:
        raise ConfigError(f"algorithm.precision must be one of {', '.join(PRECISIONS)}, got {value!r}")


def resolve_precision(setting: str, device: str) -> str:
    """`fp32` or `bf16`: what `setting` (fp32 | bf16 | auto) means on `device`; warns where
    bf16 is asked for and the device emulates it."""
    check_precision(setting)
    if setting == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    if setting == "bf16" and not native_bf16(device):
        logger.warning(
            "algorithm.precision=bf16: %s has no native bfloat16, so it is emulated and slower than fp32"
            " (precision=auto picks fp32 here)",
            device,
        )
    return setting


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[object]:
    """The context a forward runs in: bfloat16 autocast for `bf16`, nothing for `fp32`."""
    import torch

    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
