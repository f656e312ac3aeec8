"""`Optimization`: one AdamW and its learning-rate schedule (linear warm-up), stepped together.

The embedded backend holds one for the policy (and a fresh one for the warm start); the per-agent
LoRA backend holds one per agent, so each adapter's schedule advances only on its own updates.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from alight.backends.checks import warmup_schedule
from alight.config.schema import AlgorithmConfig

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


class Optimization:
    """AdamW over `params` with `algorithm`'s betas and weight decay, at `lr` warmed up over
    `warmup_steps` steps; gradient clipping at `algorithm.max_grad_norm` (0: none)."""

    def __init__(
        self, params: Iterable[torch.nn.Parameter], algorithm: AlgorithmConfig, *, lr: float, warmup_steps: int
    ) -> None:
        import torch

        self.params = list(params)
        self.max_grad_norm = algorithm.max_grad_norm
        betas = (algorithm.betas[0], algorithm.betas[1])
        self.optimizer: Any = torch.optim.AdamW(self.params, lr=lr, betas=betas, weight_decay=algorithm.weight_decay)
        self.scheduler: Any = torch.optim.lr_scheduler.LambdaLR(self.optimizer, warmup_schedule(warmup_steps))

    @property
    def lr(self) -> float:
        """The learning rate the next step uses."""
        return float(self.scheduler.get_last_lr()[0])

    @property
    def started(self) -> bool:
        """Whether AdamW has taken a step (its moments exist)."""
        return bool(self.optimizer.state)

    def step(self) -> float:
        """Clip, step the optimizer and scheduler, zero the gradients; returns the gradient norm."""
        import torch

        max_norm = self.max_grad_norm if self.max_grad_norm > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        if math.isfinite(norm):
            self.optimizer.step()
        else:  # a non-finite gradient would poison the weights: skip this step
            logger.warning("non-finite gradient norm: optimizer step skipped")
        self.scheduler.step()
        self.zero_grad()
        return norm

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the optimizer's state, the scheduler's state)."""
        return self.optimizer.state_dict(), self.scheduler.state_dict()

    def load_state_dict(self, optimizer: dict[str, Any], scheduler: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(optimizer)
        self.scheduler.load_state_dict(scheduler)
