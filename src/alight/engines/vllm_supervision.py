"""`VLLMEngine`'s supervision of the vLLM server it started: a server that died (killed for
memory, a crash) is started again on the served directory, so on the weights of the last update,
with the backoff and budget of `alight.restarts.RestartPolicy`; each restart is logged and counted
(`restarts`, in the run's metrics as `faults/engine_restarts`).

A watcher task looks every `watch_interval_s` whether the server still runs, so a death between
steps is repaired before the next call; a call that was in flight when the server died is sent
again once a server runs (`_request`), so an agent sees a slower answer, not an error. Past the
budget every call fails at once with EngineUnavailableError (HTTP 502 from the proxy).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from alight.engines.vllm_server import VLLMProcess
from alight.errors import ConfigError, EngineUnavailableError
from alight.restarts import RestartPolicy, Restarts

logger = logging.getLogger(__name__)


class Supervised:
    """The restart of a dead vLLM server, for `VLLMEngine` (which sets `_process` and `_version`)."""

    _process: VLLMProcess | None
    _version: int

    if TYPE_CHECKING:  # VLLMEngine's

        async def _launch(self) -> None: ...

        async def _send(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any: ...

    def _supervise(self, max_restarts: int, backoff_s: float, window_s: float, watch_interval_s: float) -> None:
        try:
            policy = RestartPolicy(backoff_s=backoff_s, budget=max_restarts, window_s=window_s)
        except ValueError:
            raise ConfigError(
                "vllm engine: max_restarts and restart_backoff_s are >= 0 and restart_window_s > 0"
            ) from None
        self._restarts = Restarts(policy)
        self._watch_interval_s = watch_interval_s
        self._launches = 0  # servers that came up so far: a failed call knows which one it reached
        self._down: str | None = None  # why no server runs now (a restart failed), until one starts
        self._given_up: str | None = None  # the budget is spent: every call fails with this
        self._recovery: asyncio.Lock | None = None  # one restart at a time (calls, watcher, updates)
        self._watcher: asyncio.Task[None] | None = None

    @property
    def restarts(self) -> int:
        """Restarts of a server that had died (not those of weight updates)."""
        return self._restarts.count

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One call to the server; sent again (as often as the restart budget allows) when the
        server died under it and was restarted."""
        import httpx

        while True:
            if self._recovery is not None and self._recovery.locked():
                async with self._recovery:  # a restart is under way: wait for it, do not fail on it
                    pass
            launch = self._launches
            try:
                return await self._send(method, path, body)
            except EngineUnavailableError as err:
                unreachable = isinstance(err.__cause__, httpx.TransportError)
                if not (unreachable or self._died()) or not await self._recovered(launch):
                    raise  # a server that answers with an error: its answer stands

    def _start_watching(self) -> None:
        self._watcher = asyncio.create_task(self._watch(), name="alight-vllm-watcher")

    async def _stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None

    def _died(self) -> str | None:
        """Why the server this engine started is not running, though it should (None: it runs, or
        it is not this engine's to restart)."""
        if self._process is None:
            return None
        if self._down is not None:
            return self._down
        code = self._process.returncode
        return None if code is None else f"exited with code {code}"

    async def _recovered(self, launch: int) -> bool:
        """A call to server number `launch` failed: whether that server had died and another runs
        now (restarted here, or by another call or the watcher), so the call may be sent again.
        False: the server still runs (the failure was its own answer), or is not ours to restart.
        EngineUnavailableError when the restart budget is spent or the restart failed."""
        if self._recovery is None:
            return False
        if self._given_up is not None:
            raise EngineUnavailableError(self._given_up)
        deadline = time.monotonic() + 2.0  # a server being killed may still look alive for a moment
        while self._launches == launch and self._died() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        async with self._recovery:
            if self._given_up is not None:
                raise EngineUnavailableError(self._given_up)
            if self._launches != launch and self._died() is None:
                return True  # restarted meanwhile
            why = self._died()
            if why is None:
                return False
            await self._restart(why)
            return True

    async def _restart(self, why: str) -> None:
        """Start the server again on the served directory (the weights of the last update), after
        the policy's backoff; called holding `_recovery`."""
        assert self._process is not None
        log = self._process.log_path
        delay = self._restarts.next_delay()
        if delay is None:
            policy = self._restarts.policy
            self._given_up = (
                f"vllm engine: the vLLM server {why} and was restarted {policy.budget} times within "
                f"{policy.window_s:.0f} s already: not again (engine.options.max_restarts); see {log}"
            )
            logger.error("%s", self._given_up)
            raise EngineUnavailableError(self._given_up)
        logger.warning(
            "vllm engine: the vLLM server %s; restarting it in %.1f s (restart %d; weights version %d; see %s)",
            why,
            delay,
            self._restarts.count,
            self._version,
            log,
        )
        await asyncio.sleep(delay)
        await asyncio.to_thread(self._process.stop)  # what it left running (engine-core processes)
        try:
            await self._launch()
        except (ConfigError, TimeoutError) as err:
            self._down = f"did not start again ({err})"
            raise EngineUnavailableError(f"vllm engine: the vLLM server {self._down}") from None
        logger.warning("vllm engine: the vLLM server is back (restart %d)", self._restarts.count)

    async def _restart_until_up(self, why: str) -> None:
        """Restart the server until one comes up, within the budget (EngineUnavailableError past
        it); called holding `_recovery`."""
        while True:
            try:
                await self._restart(why)
                return
            except EngineUnavailableError:
                if self._given_up is not None:
                    raise
                why = self._down or why

    async def _watch(self) -> None:
        """Restart the server soon after it dies, not at the next call (a run between steps)."""
        while True:
            await asyncio.sleep(self._watch_interval_s)
            if self._given_up is None and self._died() is not None:
                try:
                    await self._recovered(self._launches)
                except EngineUnavailableError:
                    continue  # logged; the next call (or look) tries again within the budget
                except Exception:
                    logger.exception("vllm engine: restarting the vLLM server failed")
