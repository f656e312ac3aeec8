"""What every part of the stack that restarts something after it died shares: a backoff that
doubles from `backoff_s` up to `max_backoff_s`, and a budget of `budget` restarts within any
`window_s` seconds, past which the fault is final (a part that keeps dying does not loop forever).

The vLLM server process (`alight.engines.vllm_engine`) and the in-process store server and LLM
proxy (`alight.serving.background`) restart this way; each restart is logged and counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RestartPolicy:
    """How often a dead part is restarted, and how long after its death."""

    backoff_s: float = 1.0  # before the first restart in a window; doubled for each later one
    max_backoff_s: float = 30.0
    budget: int = 5  # restarts allowed within any window_s seconds (0: never restart)
    window_s: float = 600.0

    def __post_init__(self) -> None:
        if self.budget < 0 or self.backoff_s < 0 or self.max_backoff_s < 0 or self.window_s <= 0:
            raise ValueError(f"a restart policy takes budget, backoffs >= 0 and window_s > 0, not {self}")


@dataclass
class Restarts:
    """The restarts of one part: `next_delay()` when it died, `count` of those done."""

    policy: RestartPolicy = field(default_factory=RestartPolicy)
    clock: Callable[[], float] = time.monotonic
    count: int = 0
    _times: list[float] = field(default_factory=list)

    def next_delay(self) -> float | None:
        """The part died now: seconds to wait before restarting it (the restart is counted), or
        None when the budget of the last `window_s` seconds is spent (nothing is counted)."""
        now = self.clock()
        self._times = [t for t in self._times if now - t < self.policy.window_s]
        if len(self._times) >= self.policy.budget:
            return None
        delay = min(self.policy.max_backoff_s, self.policy.backoff_s * 2 ** len(self._times))
        self._times.append(now)
        self.count += 1
        return float(delay)

    @property
    def recent(self) -> int:
        """Restarts within the last `window_s` seconds."""
        now = self.clock()
        return sum(1 for t in self._times if now - t < self.policy.window_s)
