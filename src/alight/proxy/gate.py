"""Pause and drain around weight updates, so no call fails and every call is served by one version.

Calls pass the gate on the way in (`enter`) and leave it when their answer is complete. A weight
update closes the gate (new calls wait, they are not refused), waits for the calls inside to
finish, swaps the weights, sets the new version and opens the gate again. A call therefore runs
entirely on the weights of the version it read when it entered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class WeightGate:
    """Admission control for one event loop."""

    def __init__(self, version: int | None = None) -> None:
        self.version = version
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._inside = 0
        self._updating = asyncio.Lock()  # one update at a time

    @property
    def in_flight(self) -> int:
        return self._inside

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    async def enter(self) -> int | None:
        """Wait while an update runs, then count the call in; returns the version serving it."""
        while not self._open.is_set():
            await self._open.wait()
        self._inside += 1
        self._idle.clear()
        return self.version

    def leave(self) -> None:
        self._inside -= 1
        if self._inside == 0:
            self._idle.set()

    @contextlib.asynccontextmanager
    async def call(self) -> AsyncIterator[int | None]:
        version = await self.enter()
        try:
            yield version
        finally:
            self.leave()

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Hold new calls and wait for the ones inside, then run the body; the gate reopens
        whether the body succeeds or not."""
        async with self._updating:
            self._open.clear()
            try:
                await self._idle.wait()
                yield
            finally:
                self._open.set()

    @contextlib.asynccontextmanager
    async def exclusive(self, version: int) -> AsyncIterator[None]:
        """`held`, and on success the gate serves `version` from then on."""
        async with self.held():
            yield
            self.version = version
