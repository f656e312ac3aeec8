"""verl on CPU: a verl platform plugin for `verl.trainer.device: cpu` (imported inside verl's workers).

verl 0.9.1 has no CPU platform: with no accelerator it falls back to "nvidia". It registers outside
platforms, though: `VERL_PLATFORM` names one and `VERL_USE_EXTERNAL_MODULES` names the module that
`verl/__init__` imports to register it. The verl backend passes both to its Ray workers
(`config.CPU_WORKER_ENV`, through the workers' `runtime_env`), so importing verl there imports this module,
which

- registers `CpuPlatform`: device `cpu`, vendor `cpu`, gloo, no Ray accelerator resource, and a
  device module (`CpuDevice`: torch.cpu plus no-op cache and memory calls, the CPU RNG);
- registers verl's FSDP engines (language and value models) for device `cpu`;
- starts a plain gloo process group where verl would start `cpu:gloo,cpu:gloo` (torch refuses a
  device type twice), so verl finds one already there;
- has FSDP2's CPU offload of forward-only models (the reference) not pin memory (pinning needs an
  accelerator).

Only the device changes: the workers, their update and the batches alight sends them are the GPU
path's. FSDP1 needs a GPU (it hard-codes `sync_module_states=True`), so the CPU device forces
`strategy: fsdp2` (`config.alight_settings`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch

from alight.backends.verl.config import CPU_PLATFORM as PLATFORM

logger = logging.getLogger(__name__)


class CpuDevice:
    """verl's `get_torch_device()` on CPU: `torch.cpu`, plus the CUDA calls verl makes on its
    device module (cache, memory statistics, RNG, streams) as no-ops or the CPU's own."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    def current_device(self) -> str:
        return "cpu"  # verl moves tensors `.to(current_device())`: an index would name an accelerator

    def device_count(self) -> int:
        return 1

    def is_available(self) -> bool:
        return True

    def set_device(self, device: Any) -> None:
        return None

    def synchronize(self, device: Any = None) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def ipc_collect(self) -> None:
        return None

    def memory_allocated(self, device: Any = None) -> int:
        return 0

    def memory_reserved(self, device: Any = None) -> int:
        return 0

    def max_memory_allocated(self, device: Any = None) -> int:
        return 0

    def max_memory_reserved(self, device: Any = None) -> int:
        return 0

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        return None

    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        return None

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        """(free, total) bytes of the machine's memory."""
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page

    def get_device_name(self, device: Any = None) -> str:
        return "cpu"

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)


def gloo_process_group(timeout_second: int | None = None, backend: str | None = None) -> None:
    """verl's `initialize_global_process_group_ray` on CPU: one gloo group from Ray's rank variables."""
    from datetime import timedelta

    import torch.distributed as dist

    if dist.is_initialized():
        return
    dist.init_process_group(
        backend="gloo",
        rank=int(os.environ.get("RANK", 0)),
        world_size=int(os.environ.get("WORLD_SIZE", 1)),
        timeout=timedelta(seconds=timeout_second) if timeout_second is not None else None,
        init_method=os.environ.get("DIST_INIT_METHOD"),
    )


def unpinned_offload_policy(*args: Any, **kwargs: Any) -> Any:
    """FSDP2's `CPUOffloadPolicy` without pinned memory (verl asks for pinned; CPU has nothing to pin for)."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    kwargs["pin_memory"] = False
    return CPUOffloadPolicy(*args, **kwargs)


class CpuPlatformMixin:
    """verl's platform interface on the CPU (gloo, no accelerator, no profiler): the body of
    `CpuPlatform`, which `_platform_class` puts on verl's `PlatformBase` when it registers."""

    device = CpuDevice()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return self.device

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # chosen by VERL_PLATFORM only, never by verl's auto-detection

    def current_device(self) -> str:
        return "cpu"  # verl moves tensors `.to(get_device_id())`: an index would name an accelerator

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "ALIGHT_CPU_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {}  # no accelerator to reserve: the placement group's CPU bundles place the workers

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _platform_class() -> type[Any]:
    from verl.plugin.platform import PlatformBase, PlatformRegistry

    class CpuPlatform(CpuPlatformMixin, PlatformBase):  # type: ignore[misc]
        """verl's platform interface on the CPU (gloo, no accelerator, no profiler)."""

    registered: type[Any] = PlatformRegistry.register(platform=PLATFORM)(CpuPlatform)
    return registered


def register() -> None:
    """Register the platform, the FSDP engines for device `cpu`, the gloo group and the unpinned offload."""
    _platform_class()  # first: importing verl's engines asks for the platform
    import verl.utils.distributed as distributed
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    for model_type, engine in (
        ("language_model", transformer_impl.FSDPEngineWithLMHead),
        ("value_model", transformer_impl.FSDPEngineWithValueHead),
    ):
        if "cpu" not in EngineRegistry._engines[model_type]["fsdp2"]:
            EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device="cpu")(engine)
    distributed.initialize_global_process_group_ray = gloo_process_group  # type: ignore[attr-defined]
    workers = sys.modules.get("verl.workers.engine_workers")  # imported before this module: it holds its own name
    if workers is not None:
        workers.initialize_global_process_group_ray = gloo_process_group  # type: ignore[attr-defined]
    transformer_impl.CPUOffloadPolicy = unpinned_offload_policy  # type: ignore[attr-defined, assignment]
    logger.debug("verl platform %s registered", PLATFORM)


register()
