"""Inference engines behind the LLM proxy: embedded (transformers), vLLM, LiteLLM."""

from alight.engines.base import (
    ChatRequest,
    CompletionRequest,
    Engine,
    Generation,
    SamplingParams,
    StreamEvent,
    TextDelta,
)

__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "Engine",
    "Generation",
    "SamplingParams",
    "StreamEvent",
    "TextDelta",
]
