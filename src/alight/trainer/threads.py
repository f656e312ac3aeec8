"""CPU threads of a run: how many PyTorch uses in the trainer process, and that idle ones sleep.

The trainer process runs the warm start, the backend's updates and, in a thread behind the LLM
proxy, the embedded engine; the runner processes run agents, which need no torch threads. They
share the machine's cores with each other and with whatever else runs there. Left alone, PyTorch
starts one OpenMP thread per core, and GNU OpenMP's idle threads spin before they sleep: at each of
the thousands of small parallel regions of a step, a thread whose partner was preempted by another
process burns the time slice that partner needs. On a 2-core machine beside other work that made
the warm start up to 13x slower (benchmarks/contention_bench.py measures it; README, Benchmarks).

`trainer.torch_threads` / `trainer.torch_interop_threads` choose: "auto" (see `auto_threads`), a
number, or "torch" (PyTorch's defaults, the environment untouched). Unless `torch_threads` is
"torch", idle OpenMP threads sleep (OMP_WAIT_POLICY=PASSIVE) when the environment sets no policy.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from alight.errors import ConfigError

logger = logging.getLogger(__name__)

AUTO, TORCH = "auto", "torch"
WAIT_POLICY = "OMP_WAIT_POLICY"


def usable_cpus() -> int:
    """The cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def auto_threads(device: str, cpus: int) -> int:
    """Intra-op threads for "auto": half the usable cores on CPU, one when a GPU does the math.

    Half: the trainer's neighbours (runner processes, the store, other work on the machine) keep
    the rest. On 2 cores that is one thread, measured best beside other load there: no OpenMP
    barrier can wait on a preempted partner (README, Benchmarks: contention).
    """
    return 1 if device.startswith("cuda") else max(1, cpus // 2)


@dataclass(frozen=True)
class ThreadPolicy:
    """The torch thread counts of the trainer process (None: PyTorch's default), the count an update
    or warm start runs with (None: the same), and whether idle OpenMP threads sleep rather than spin."""

    intra_op: int | None
    interop: int | None
    passive_wait: bool
    update_intra_op: int | None = None

    @classmethod
    def from_config(
        cls, torch_threads: object, interop_threads: object, device: str = "cpu", *, mode: str = "async"
    ) -> ThreadPolicy:
        """The policy of `trainer.torch_threads` / `trainer.torch_interop_threads`; ConfigError
        names a value that is neither "auto", "torch" nor a positive number. With "auto" on CPU in
        `mode` sync, the update and the warm start take every usable core: nothing else runs then
        (the runners wait for the next step and the engine for new weights), unless the environment
        sets OMP_NUM_THREADS (then they keep the run's count)."""
        intra = _threads("trainer.torch_threads", torch_threads)
        interop = _threads("trainer.torch_interop_threads", interop_threads)
        pinned = "OMP_NUM_THREADS" in os.environ  # the environment chose OpenMP's threads (CI, a container)
        alone = intra == AUTO and mode == "sync" and not device.startswith("cuda") and not pinned
        return cls(
            intra_op=auto_threads(device, usable_cpus()) if intra == AUTO else None if intra == TORCH else int(intra),
            interop=1 if interop == AUTO else None if interop == TORCH else int(interop),
            passive_wait=intra != TORCH,  # the intra-op threads are OpenMP's; inter-op ones never spin
            update_intra_op=usable_cpus() if alone else None,
        )

    @contextmanager
    def updating(self) -> Iterator[None]:
        """The update's thread count in the calling thread while it runs (torch's count is per OS
        thread once set: enter it in the thread that runs the update)."""
        if self.update_intra_op is None:
            yield
            return
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(self.update_intra_op)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def apply(self) -> None:
        """Set the wait policy (effective only before torch's first import: OpenMP reads it once),
        then torch's thread counts."""
        if self.passive_wait and WAIT_POLICY not in os.environ:
            if "torch" in sys.modules:
                logger.info("torch was imported before the run: set %s=PASSIVE before it to apply it", WAIT_POLICY)
            os.environ[WAIT_POLICY] = "PASSIVE"  # runner processes inherit it too
        import torch

        if self.intra_op is not None:
            torch.set_num_threads(self.intra_op)
        if self.interop is not None and torch.get_num_interop_threads() != self.interop:
            try:
                torch.set_num_interop_threads(self.interop)
            except RuntimeError:  # torch allows it once, before any inter-op work: the first setting stays
                logger.info("torch inter-op threads stay at %d (set earlier)", torch.get_num_interop_threads())
        logger.info(
            "torch threads: %d intra-op, %d inter-op; OpenMP wait policy %s",
            torch.get_num_threads(),
            torch.get_num_interop_threads(),
            os.environ.get(WAIT_POLICY, "default (spin, then sleep)"),
        )


def _threads(name: str, value: object) -> str:
    text = str(value).strip().lower()
    if text in (AUTO, TORCH) or (text.isdigit() and int(text) >= 1):
        return text
    raise ConfigError(f"{name} must be auto, torch or a positive number of threads, got {value!r}")
