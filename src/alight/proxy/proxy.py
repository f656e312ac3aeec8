"""`Proxy`: an engine, the store its spans go to, and the gate that keeps weight updates clean.

The proxy lives on one event loop (the server's, see `ProxyServer`); `update_weights` and `flush`
may be awaited from any other loop or thread too, they run on the proxy's loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from alight.engines.base import Engine
from alight.errors import AlightError, ConfigError, NotFoundError
from alight.proxy.completion_objects import TokenTexts
from alight.proxy.gate import WeightGate
from alight.proxy.protocol import ProxyError
from alight.proxy.recorder import SpanRecorder
from alight.store.base import Store

logger = logging.getLogger(__name__)

T = TypeVar("T")


#: Sampling fields a proxy may default when a request omits them.
SAMPLING_DEFAULTS = ("temperature", "top_p", "max_tokens", "seed")


class Proxy:
    """OpenAI-compatible front of an engine that records one LLM span per call.

    `store` (optional) receives the spans of calls made for a rollout attempt; use it on the
    proxy's loop only (across threads or processes, give the proxy a `StoreClient`). `version` is
    the resources version recorded on spans until the first `update_weights` (default: the
    engine's weights version). The proxy starts and closes the engine, and closes the store unless
    `close_store` is false. `default_sampling` (temperature, top_p, max_tokens, seed) fills what a
    request leaves out: the trainer's sampling settings apply to agents that set none.
    """

    def __init__(
        self,
        engine: Engine,
        store: Store | None = None,
        *,
        version: int | None = None,
        close_store: bool = True,
        default_sampling: Mapping[str, Any] | None = None,
    ) -> None:
        unknown = set(default_sampling or {}) - set(SAMPLING_DEFAULTS)
        if unknown:
            raise ConfigError(f"proxy: default_sampling takes {', '.join(SAMPLING_DEFAULTS)}, not {sorted(unknown)}")
        self.default_sampling = {k: v for k, v in (default_sampling or {}).items() if v is not None}
        self._rollout_sampling: dict[str, dict[str, Any]] = {}
        self.engine = engine
        self.store = store
        self.close_store = close_store
        self.recorder = SpanRecorder(store)
        self.gate = WeightGate(version)
        self._explicit_version = version is not None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._token_texts: TokenTexts | None = None

    @property
    def version(self) -> int | None:
        """The resources version the next call is served with."""
        return self.gate.version

    @property
    def model_names(self) -> list[str]:
        return self.engine.model_names

    # -- life cycle -------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return self._loop is not None

    async def start(self) -> None:
        """Start the engine on this loop; the proxy is bound to it from now on."""
        await self.engine.start()
        self._loop = asyncio.get_running_loop()
        if not self._explicit_version:
            self.gate.version = self.engine.weights_version
        self._token_texts = _token_texts_of(self.engine)

    async def close(self) -> None:
        """Store every pending span, then close the engine and the store."""
        try:
            await self.recorder.flush()
        finally:
            try:
                await self.engine.close()
            finally:
                if self.store is not None and self.close_store:
                    await self.store.close()
                self._loop = None

    # -- for the trainer ----------------------------------------------------------------------
    async def update_weights(self, weights: Mapping[str, Any] | str, version: int) -> None:
        """Serve `weights` (a state dict or a checkpoint directory) as `version` from now on.

        New calls wait (they do not fail) while calls in flight finish; then the engine loads the
        weights and later calls carry `version`. Callable from any event loop."""
        await self._on_loop(self._update_weights(weights, version))

    async def _update_weights(self, weights: Mapping[str, Any] | str, version: int) -> None:
        async with self.gate.exclusive(version):
            logger.info("proxy: calls drained; loading weights version %d", version)
            await self.engine.update_weights(weights, version)
        logger.info("proxy: serving weights version %d", version)

    async def offloaded(self, work: Callable[[], T]) -> T:
        """Run `work` (blocking: in a worker thread) with new calls held, the calls in flight
        finished and the engine asleep (its accelerator memory released for a colocated update);
        the engine wakes afterwards whether `work` succeeds or not. Callable from any event loop."""
        return await self._on_loop(self._offloaded(work))

    async def _offloaded(self, work: Callable[[], T]) -> T:
        async with self.gate.held():
            await self.engine.sleep()
            try:
                return await asyncio.to_thread(work)
            finally:
                await self.engine.wake_up()

    def set_rollout_sampling(self, rollout_ids: Sequence[str], sampling: Mapping[str, Any] | None) -> None:
        """Defaults for the calls of these rollouts that override `default_sampling` (validation
        runs greedy this way); None forgets them. What a request sets itself still wins."""
        unknown = set(sampling or {}) - set(SAMPLING_DEFAULTS)
        if unknown:
            raise ConfigError(f"proxy: rollout sampling takes {', '.join(SAMPLING_DEFAULTS)}, not {sorted(unknown)}")
        for rollout_id in rollout_ids:
            if sampling is None:
                self._rollout_sampling.pop(rollout_id, None)
            else:
                given = {k: v for k, v in sampling.items() if v is not None}  # None: keep the default
                self._rollout_sampling[rollout_id] = {**self.default_sampling, **given}

    def sampling_for(self, rollout_id: str | None) -> Mapping[str, Any]:
        """The sampling defaults of a call made for `rollout_id`."""
        if rollout_id is None:
            return self.default_sampling
        return self._rollout_sampling.get(rollout_id) or self.default_sampling

    async def flush(self) -> None:
        """Return once the span of every call answered so far is in the store. Callable from any loop."""
        await self._on_loop(self.recorder.flush())

    async def _on_loop(self, work: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        if loop is None or loop is asyncio.get_running_loop():
            return await work
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, loop))

    # -- for the routes -------------------------------------------------------------------------
    def check_model(self, name: str) -> None:
        if name not in self.engine.model_names:
            raise ProxyError(
                f"The model '{name}' does not exist; this server serves {', '.join(self.engine.model_names)}.",
                status=404,
                param="model",
                code="model_not_found",
            )

    @property
    def token_texts(self) -> TokenTexts | None:
        return self._token_texts


def engine_error(err: Exception) -> ProxyError:
    """What the client sees when the engine fails: a 400 when its request is at fault, else the
    engine's own 5xx (502 for an unreachable upstream) or 500."""
    if isinstance(err, ProxyError):
        return err
    if isinstance(err, NotFoundError):
        return ProxyError(str(err), status=404, code=err.code)
    if isinstance(err, AlightError) and err.http_status < 500 and not isinstance(err, ConfigError):
        return ProxyError(str(err), code=err.code)  # ContextLengthError: OpenAI's context_length_exceeded
    if isinstance(err, AlightError):
        status = err.http_status if err.http_status >= 500 else 500
        return ProxyError(str(err), status=status, type="server_error", code=err.code)
    return ProxyError(f"The engine failed: {type(err).__name__}: {err}", status=500, type="server_error")


def _token_texts_of(engine: Engine) -> TokenTexts | None:
    """Per-token text pieces from the engine's tokenizer, when it exposes one."""
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None or not hasattr(tokenizer, "decode"):
        return None

    def texts(ids: Sequence[int]) -> list[str]:
        return [str(tokenizer.decode([i], skip_special_tokens=False)) for i in ids]

    return texts
