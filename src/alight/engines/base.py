"""The `Engine` interface: what the LLM proxy needs from an inference backend.

An engine turns an OpenAI-style chat (or completion) request into a `Generation` that carries,
besides the assistant message, the exact prompt and response token ids and the response
log-probs, so the trainer can learn from the call. Engines: `embedded` (transformers, in
process), `vllm` (a `vllm serve` process), `litellm` (any model LiteLLM reaches).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    from alight.config.schema import EngineConfig

TokenIdsSource = Literal["engine", "tokenizer", "none"]


#: The sampling settings every engine applies unless a request sets them: no top-k, min-p or penalty.
#: Recorded log-probs are then log_softmax(logits / T) over the whole vocabulary, the trainer's.
NEUTRAL_SAMPLING: dict[str, Any] = {
    "top_k": -1,  # -1: off (vLLM 0.32 prefers 0, older releases refuse it)
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


@dataclass
class SamplingParams:
    """Sampling settings of one request (OpenAI names)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None  # None: the engine's default limit
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = True  # alight always records them when the engine can


@dataclass
class ChatRequest:
    """One chat completion call, already validated by the proxy."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None  # "auto", "none", "required" or {"type": "function", ...}
    response_format: dict[str, Any] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    extra: dict[str, Any] = field(default_factory=dict)  # provider-specific fields passed through
    agent: str | None = None  # the agent making the call (per-agent LoRA engines pick its adapter)


@dataclass
class CompletionRequest:
    """One legacy completions call: raw prompt text (or token ids) in, text out."""

    model: str
    prompt: str | list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    extra: dict[str, Any] = field(default_factory=dict)
    agent: str | None = None  # the agent making the call (per-agent LoRA engines pick its adapter)


@dataclass
class Generation:
    """An engine's answer, with what the trainer needs to learn from it."""

    model: str
    text: str  # the raw generated text (tool-call markup included)
    message: dict[str, Any]  # OpenAI assistant message: role, content, tool_calls
    finish_reason: str  # "stop", "length" or "tool_calls"
    prompt_token_ids: list[int] | None = None
    response_token_ids: list[int] | None = None
    response_logprobs: list[float] | None = None
    token_ids_source: TokenIdsSource = "engine"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    weights_version: int | None = None  # version of the weights that produced it, where known
    adapter: str | None = None  # the LoRA adapter that answered (per-agent LoRA); None: the base weights
    sampling: dict[str, Any] | None = None  # the settings the engine sampled with, where it says (on the span)


@dataclass
class TextDelta:
    """A streamed piece of the assistant's visible content."""

    text: str


StreamEvent = TextDelta | Generation  # zero or more deltas, then exactly one Generation


@dataclass(frozen=True)
class EngineCapabilities:
    """What the rest of alight may ask of an engine kind (it never compares the kind's name)."""

    trainable: bool = True  # serves weights alight updates: a run can train the policy it serves
    in_process: bool = False  # holds the weights in this process (the trainer shares its device and threads)
    adapters: bool = False  # answers each agent with its own LoRA adapter (per-agent LoRA)


class Engine(abc.ABC):
    """An inference backend. All methods are safe to call concurrently from one event loop.

    Each kind is registered by name in `alight.engines.factory.ENGINES` (`engine.kind`) and states,
    as class attributes and class methods, what others ask about it: `capabilities`,
    `options_from_config` (its constructor's arguments from the config's `engine` section),
    `loads_model` (whether a model spec is resolved into a directory for it), `endpoint` (the
    server it calls, where one exists already) and `check_config`."""

    name: str = "engine"
    capabilities: ClassVar[EngineCapabilities] = EngineCapabilities()

    @classmethod
    def options_from_config(cls, engine: EngineConfig, model: str) -> dict[str, Any]:
        """Keyword arguments of this kind's constructor for the config's `engine` section serving
        `model` (what `loads_model` resolved, or the spec as it is); `engine.options` and a
        backend's options are added by the factory. None values are left to the constructor."""
        return {"model": model, "served_name": engine.served_name}

    @classmethod
    def loads_model(cls, engine: EngineConfig) -> bool:
        """Whether this engine loads a model directory alight resolves for it (`alight.models.resolve`);
        False where it calls a server that holds its own model (the spec is then passed as it is)."""
        return True

    @classmethod
    def endpoint(cls, engine: EngineConfig) -> str | None:
        """The URL of an existing server this engine calls (checked early by `alight dev`); None
        where alight holds or starts the model itself."""
        return None

    @classmethod
    def check_config(cls, options: dict[str, Any]) -> None:
        """ConfigError, in one line, for constructor `options` this kind cannot run with, before the
        run's long work starts (default: they are checked when the engine starts)."""
        return None

    @property
    @abc.abstractmethod
    def model_names(self) -> list[str]:
        """Model names this engine answers to (the first is its default)."""

    @property
    def weights_version(self) -> int | None:
        """Version of the weights being served, None where the engine cannot tell."""
        return None

    @property
    def max_context(self) -> int | None:
        """Longest prompt + response in tokens, where known."""
        return None

    @property
    def restarts(self) -> int:
        """How often the engine restarted a server of its own that had died (0 where it has none)."""
        return 0

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Load the model or connect; called once before the first request."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release the model, processes and connections."""

    @abc.abstractmethod
    async def chat(self, request: ChatRequest) -> Generation:
        """Answer a chat request."""

    async def chat_stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """Answer a chat request as content deltas followed by the final `Generation`.

        Tool-call markup never appears in the deltas; tool calls arrive in the final message.
        The default streams the whole content in one piece."""
        generation = await self.chat(request)
        content = generation.message.get("content")
        if content:
            yield TextDelta(content)
        yield generation

    @abc.abstractmethod
    async def complete(self, request: CompletionRequest) -> Generation:
        """Answer a legacy completions request (no chat template)."""

    async def sleep(self) -> None:  # noqa: B027 - optional hook
        """Release accelerator memory while a colocated trainer updates the policy (vLLM's sleep
        mode); the proxy calls it with no request in flight. Default: keep everything."""

    async def wake_up(self) -> None:  # noqa: B027 - optional hook
        """Take back what `sleep` released, before the new weights load. Default: nothing to do."""

    async def update_weights(self, weights: Mapping[str, Any] | str, version: int) -> None:
        """Serve new weights from now on: a state dict or a checkpoint directory. The proxy
        calls it with no request in flight."""
        raise NotImplementedError(f"the {self.name} engine cannot take new weights")
