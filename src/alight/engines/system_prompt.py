"""`SystemPromptEngine`: an engine that adds a system prompt to chat requests that have none
(`alight serve --system-prompt`, e.g. the best prompt of an APO run); everything else passes through."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import Any

from alight.engines.base import ChatRequest, CompletionRequest, Engine, Generation, StreamEvent


class SystemPromptEngine(Engine):
    """Wraps `engine`; a chat request whose messages hold no system (or developer) message gets
    `system_prompt` as its first message. Requests that bring their own are left as they are."""

    def __init__(self, engine: Engine, system_prompt: str) -> None:
        self.engine = engine
        self.system_prompt = system_prompt
        self.name = engine.name

    def with_prompt(self, request: ChatRequest) -> ChatRequest:
        if not self.system_prompt or any(m.get("role") in ("system", "developer") for m in request.messages):
            return request
        messages = [{"role": "system", "content": self.system_prompt}, *request.messages]
        return dataclasses.replace(request, messages=messages)

    @property
    def model_names(self) -> list[str]:
        return self.engine.model_names

    @property
    def tokenizer(self) -> Any:  # the proxy decodes per-token texts with it, when the engine has one
        return getattr(self.engine, "tokenizer", None)

    @property
    def weights_version(self) -> int | None:
        return self.engine.weights_version

    @property
    def max_context(self) -> int | None:
        return self.engine.max_context

    async def start(self) -> None:
        await self.engine.start()

    async def close(self) -> None:
        await self.engine.close()

    async def chat(self, request: ChatRequest) -> Generation:
        return await self.engine.chat(self.with_prompt(request))

    async def chat_stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        async for event in self.engine.chat_stream(self.with_prompt(request)):
            yield event

    async def complete(self, request: CompletionRequest) -> Generation:
        return await self.engine.complete(request)

    async def sleep(self) -> None:
        await self.engine.sleep()

    async def wake_up(self) -> None:
        await self.engine.wake_up()

    async def update_weights(self, weights: Mapping[str, Any] | str, version: int) -> None:
        await self.engine.update_weights(weights, version)
