"""The weights a vLLM server holds: new ones loaded, and in sleep mode the GPU memory freed and taken back.

Weight updates write the new weights into the directory vLLM serves and ask it to reload them from
disk (`/collective_rpc` with `reload_weights`, available with VLLM_SERVER_DEV_MODE=1, which the
engine sets); if that fails, the process is restarted on the new weights.

Sleep mode (on by default on a GPU) lets vLLM and a colocated trainer share one GPU by turns: the
server starts with `--enable-sleep-mode`, and while the trainer updates the policy the proxy calls
`sleep()` (`POST /sleep?level=N`, a dev endpoint like /collective_rpc) and then `wake_up()`
(`POST /wake_up`). Level 1 moves the weights to CPU RAM and frees the KV cache; level 2 frees
both (no CPU copy, for hosts short of RAM) and wake-up reloads the weights from the served
directory, the order vLLM's sleep-mode guide gives (wake the weights, reload, wake the KV cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alight.engines.vllm_requests import error_message
from alight.engines.vllm_server import VLLMProcess, write_weights
from alight.errors import AlightError, ConfigError, EngineUnavailableError

logger = logging.getLogger(__name__)


class ServedWeights:
    """`VLLMEngine`'s weight updates (in place or by a restart) and sleep mode, over vLLM's dev endpoints."""

    # set by VLLMEngine.__init__ and start
    _serving_dir: Path | None
    _reload: str  # "in_place" or "restart"
    _version: int
    _process: VLLMProcess | None
    _sleep_mode: bool
    _sleep_level: int
    _asleep: bool
    _cannot_sleep: bool
    _request_timeout_s: float
    _recovery: asyncio.Lock | None

    if TYPE_CHECKING:  # VLLMEngine's

        @property
        def server_root(self) -> str: ...

        async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any: ...

        async def _launch(self) -> None: ...

        async def _restart_until_up(self, why: str) -> None: ...

    # -- weights -------------------------------------------------------------------------------------

    async def update_weights(self, weights: Mapping[str, Any] | str, version: int) -> None:
        """Write the weights into the served directory and have vLLM load them: in place, or by a
        restart where the in-place reload cannot be trusted (`reload`) or fails.

        The proxy calls this with no request in flight."""
        if self._serving_dir is None:
            raise ConfigError("vllm engine: weight updates need the engine to start the vLLM server itself")
        await asyncio.to_thread(write_weights, self._serving_dir, weights)
        if self._reload == "restart":
            await self.close_and_restart()
        else:
            try:
                await self._request("POST", "/collective_rpc", {"method": "reload_weights"})
            except AlightError as err:
                logger.warning("vllm engine: in-place reload failed (%s); restarting the vLLM server", err)
                await self.close_and_restart()
            else:
                try:  # cached prefixes were computed by the old weights
                    await self._request("POST", "/reset_prefix_cache")
                except AlightError as err:
                    logger.warning("vllm engine: could not reset the prefix cache: %s", err)
        self._version = version
        logger.info("vllm engine: serving weights version %d", version)

    async def close_and_restart(self) -> None:
        """Stop the vLLM process and start it again on the served directory (the fallback reload)."""
        if self._process is None:
            raise EngineUnavailableError("vllm engine: no vLLM process to restart")
        async with self._recovery or contextlib.nullcontext():  # not while the watcher restarts it
            await asyncio.to_thread(self._process.stop)
            try:
                await self._launch()
            except (ConfigError, TimeoutError) as err:  # died while starting (killed for memory): supervised
                if self._recovery is None:
                    raise
                await self._restart_until_up(f"died while starting on new weights ({err})")

    # -- sleep mode ------------------------------------------------------------------------------

    @property
    def asleep(self) -> bool:
        """Whether the server is asleep now (between `sleep` and `wake_up`)."""
        return self._asleep

    async def sleep(self) -> None:
        """Have vLLM free its GPU memory (`POST /sleep?level=N`). The proxy calls it with no request
        in flight. Nothing happens with sleep_mode off, or (after one warning) with a base_url
        server that cannot sleep."""
        if not self._sleep_mode or self._cannot_sleep or self._asleep:
            return
        # mode=wait: vLLM lets a request still running finish (a shared base_url server may have some)
        if await self._dev_post(f"/sleep?level={self._sleep_level}&mode=wait", may_lack=self._process is None):
            self._asleep = True
            logger.info("vllm engine: asleep (level %d)", self._sleep_level)

    async def wake_up(self) -> None:
        """Take the GPU memory back (`POST /wake_up`); at level 2, reload the served weights first."""
        if not self._asleep:
            return
        if self._sleep_level == 1:
            await self._dev_post("/wake_up")
        else:  # level 2 kept no copy of the weights: allocate them, read them from disk, then the KV cache
            await self._dev_post("/wake_up?tags=weights")
            await self._request("POST", "/collective_rpc", {"method": "reload_weights"})
            await self._dev_post("/wake_up?tags=kv_cache")
        self._asleep = False
        logger.info("vllm engine: awake")

    async def _dev_post(self, path: str, *, may_lack: bool = False) -> bool:
        """POST to one of vLLM's dev endpoints. With `may_lack`, a refusal (no such endpoint: the
        server runs without VLLM_SERVER_DEV_MODE=1; or no --enable-sleep-mode) is a warning and False."""
        import httpx

        try:
            async with httpx.AsyncClient(timeout=self._request_timeout_s) as client:
                response = await client.post(f"{self.server_root}{path}")
        except httpx.HTTPError as err:
            raise EngineUnavailableError(f"vllm engine: {self.server_root} did not answer: {err!r}") from err
        if response.status_code < 300:
            return True
        message = f"vllm engine: POST {path} answered HTTP {response.status_code}: {error_message(response)}"
        if not may_lack:
            raise EngineUnavailableError(message)
        self._cannot_sleep = True
        logger.warning(
            "%s; the server at %s keeps its GPU memory during updates (start it with VLLM_SERVER_DEV_MODE=1 "
            "and --enable-sleep-mode to let it sleep, or set sleep_mode: false to skip this)",
            message,
            self.server_root,
        )
        return False
