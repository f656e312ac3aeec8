"""`wait_until_ended` (every store's `wait_for_rollouts`): each check asks only for the rollouts
not yet seen ended, and the answer keeps the caller's order."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from alight.store.base import EndSignal, wait_until_ended
from alight.types import Rollout, RolloutStatus, Task


def _rollout(rollout_id: str) -> Rollout:
    return Rollout(rollout_id=rollout_id, task=Task(input={}), status=RolloutStatus.SUCCEEDED)


def test_each_check_asks_only_for_rollouts_not_seen_ended() -> None:
    ended: list[str] = []
    asked: list[list[str]] = []

    async def fetch(ids: Sequence[str]) -> list[Rollout]:
        asked.append(list(ids))
        return [_rollout(i) for i in reversed(ended) if i in ids]  # in another order than asked

    async def scenario() -> list[Rollout]:
        signal = EndSignal()

        async def end(rollout_id: str, after: float) -> None:
            await asyncio.sleep(after)
            ended.append(rollout_id)
            signal.notify()

        ending = [asyncio.create_task(end(i, 0.05 * (n + 1))) for n, i in enumerate(["c", "a", "b"])]
        found = await wait_until_ended(fetch, ["a", "b", "c", "a"], timeout=5.0, signal=signal, poll_s=5.0)
        await asyncio.gather(*ending)
        return found

    found = asyncio.run(scenario())
    assert [r.rollout_id for r in found] == ["a", "b", "c"]  # the caller's order, a duplicate once
    # none ended at first; then c ends (found), a ends (found), b ends: each found one is not asked again
    assert asked == [["a", "b", "c"], ["a", "b", "c"], ["a", "b"], ["b"]]


def test_timeout_returns_those_ended_in_the_callers_order() -> None:
    async def fetch(ids: Sequence[str]) -> list[Rollout]:
        return [_rollout(i) for i in ids if i in ("z", "x")][::-1]

    found = asyncio.run(wait_until_ended(fetch, ["x", "y", "z"], timeout=0.05, signal=EndSignal(), poll_s=0.01))
    assert [r.rollout_id for r in found] == ["x", "z"]
