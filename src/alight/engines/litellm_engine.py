"""The litellm engine: any model LiteLLM reaches (an OpenAI-compatible server such as vLLM or
SGLang, OpenAI, Azure, Anthropic, Ollama...), called through the `litellm` package.

Token ids, in order of preference: from the endpoint (vLLM answers `return_token_ids: true` with
prompt and response ids; token_ids_source "engine"), else from a Hugging Face tokenizer named in
the config (the chat template applied to the messages, and to the reply; "tokenizer"), else none:
the generation records text only ("none").
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

from alight.chat_template import ChatTokenizer, render_prompt, render_reply, template_messages
from alight.engines.base import ChatRequest, CompletionRequest, Engine, EngineCapabilities, Generation, SamplingParams
from alight.engines.openai_response import generation_from_response, optional_sampling
from alight.engines.toolcalls import validate_tools
from alight.errors import (
    AlightError,
    ConfigError,
    ContextLengthError,
    EngineUnavailableError,
    InvalidRequestError,
    one_line,
)

if TYPE_CHECKING:
    from alight.config.schema import EngineConfig

logger = logging.getLogger(__name__)


def import_litellm() -> Any:
    """Import litellm offline: without LITELLM_LOCAL_MODEL_COST_MAP it fetches a price list at import."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    # LiteLLM logs every call at INFO, partly to stdout (which `--json` output owns): warnings only.
    litellm.suppress_debug_info = True
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return litellm


def translate_litellm_error(err: Exception) -> AlightError:
    """A LiteLLM exception as the alight error the proxy reports (one line)."""
    litellm = import_litellm()
    message = one_line(str(err) or type(err).__name__, 300)  # LiteLLM's messages name the error class
    if isinstance(err, litellm.AuthenticationError | litellm.PermissionDeniedError):
        return ConfigError(f"litellm engine: the endpoint refused the credentials: {message}")
    if isinstance(err, litellm.ContextWindowExceededError):
        return ContextLengthError(message)
    if isinstance(err, litellm.BadRequestError | litellm.NotFoundError | litellm.UnprocessableEntityError):
        return InvalidRequestError(message)
    return EngineUnavailableError(f"litellm engine: {message}")


class LiteLLMEngine(Engine):
    """Calls `litellm.acompletion` / `atext_completion` for a LiteLLM model string.

    `api_key_env` names the environment variable that holds the key (never the key itself).
    `return_token_ids` asks the endpoint for vLLM's token ids and log-probs; None asks only for
    self-hosted endpoints (a `base_url`, or a `hosted_vllm/` model), since providers such as
    OpenAI reject unknown fields."""

    name = "litellm"

    capabilities = EngineCapabilities(trainable=False)  # a model alight reaches, never one it updates

    @classmethod
    def options_from_config(cls, engine: EngineConfig, model: str) -> dict[str, Any]:
        options = {
            **super().options_from_config(engine, model),
            "base_url": engine.base_url,
            "api_key_env": engine.api_key_env,
            "tokenizer": engine.tokenizer,
        }
        if engine.tokenizer is not None:  # the template renders with the tokenizer alight loads
            options["chat_template"] = engine.chat_template
        return options

    @classmethod
    def loads_model(cls, engine: EngineConfig) -> bool:
        return False  # a LiteLLM model string, passed as it is

    @classmethod
    def endpoint(cls, engine: EngineConfig) -> str | None:
        return engine.base_url

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str | None = None,  # name of the env var holding the API key
        tokenizer: str | os.PathLike[str] | None = None,  # HF tokenizer dir for token ids the endpoint lacks
        chat_template: str = "auto",  # the tokenizer's template (see alight.models.chat_templates)
        served_name: str | None = None,  # model name the proxy answers to (default: `model`)
        extra_body: dict[str, Any] | None = None,  # extra JSON fields sent with every request
        timeout_s: float = 600.0,
        return_token_ids: bool | None = None,  # None: only for self-hosted endpoints
        max_context: int | None = None,
    ) -> None:
        if not model:
            raise ConfigError("litellm engine: model (a LiteLLM model string such as 'openai/gpt-4o') is required")
        self._model = model
        self._base_url = base_url
        self._api_key_env = api_key_env
        self._tokenizer_path = str(tokenizer) if tokenizer is not None else None
        self._chat_template = chat_template
        self._served_name = served_name or model
        self._extra_body = dict(extra_body or {})
        self._timeout_s = timeout_s
        self._ask_ids = (
            return_token_ids if return_token_ids is not None else bool(base_url) or model.startswith("hosted_vllm/")
        )
        self._max_context = max_context
        self._tokenizer: ChatTokenizer | None = None
        self._tokenizer_lock = threading.Lock()

    @property
    def model_names(self) -> list[str]:
        return list(dict.fromkeys([self._served_name, self._model]))

    @property
    def max_context(self) -> int | None:
        return self._max_context

    async def start(self) -> None:
        self._api_key()
        await asyncio.to_thread(import_litellm)
        if self._tokenizer_path is not None:
            await asyncio.to_thread(self._load_tokenizer)

    def _api_key(self) -> str | None:
        if self._api_key_env is None:
            return "EMPTY" if self._base_url else None  # self-hosted servers often need none; the SDK wants one
        key = os.environ.get(self._api_key_env)
        if not key:
            raise ConfigError(f"litellm engine: environment variable {self._api_key_env} (api_key_env) is not set")
        return key

    def _load_tokenizer(self) -> ChatTokenizer:
        with self._tokenizer_lock:
            if self._tokenizer is None:
                from alight.models.chat_templates import load_tokenizer

                assert self._tokenizer_path is not None  # only called when the config names a tokenizer
                try:
                    self._tokenizer = load_tokenizer(self._tokenizer_path, self._chat_template)
                except (OSError, ValueError) as err:
                    first = (str(err).splitlines() or [type(err).__name__])[0]
                    raise ConfigError(
                        f"litellm engine: cannot load tokenizer {self._tokenizer_path!r}: {first}"
                    ) from err
            return self._tokenizer

    def _check_model(self, name: str) -> None:
        if name not in self.model_names:
            raise InvalidRequestError(f"unknown model {name!r}; this engine serves {', '.join(self.model_names)}")

    def _common(self, sampling: SamplingParams, extra: dict[str, Any]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self._model,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "timeout": self._timeout_s,
            "drop_params": True,  # providers that lack a parameter (seed, logprobs...) get the call without it
        }
        kwargs.update(optional_sampling(sampling))
        if self._base_url:
            kwargs["api_base"] = self._base_url
        key = self._api_key()
        if key is not None:
            kwargs["api_key"] = key
        body = {**self._extra_body, **extra}
        if self._ask_ids:
            body["return_token_ids"] = True
        if body:
            kwargs["extra_body"] = body
        return kwargs

    async def _call(self, function: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        litellm = await asyncio.to_thread(import_litellm)
        try:
            response = await getattr(litellm, function)(**kwargs)
        except AlightError:
            raise
        except Exception as err:
            raise translate_litellm_error(err) from err
        data: dict[str, Any] = response.model_dump() if hasattr(response, "model_dump") else dict(response)
        return data

    async def chat(self, request: ChatRequest) -> Generation:
        self._check_model(request.model)
        tools = validate_tools(request.tools)
        template_messages(request.messages)  # bad messages fail here, not at the provider
        kwargs = self._common(request.sampling, request.extra)
        kwargs["messages"] = request.messages
        if tools:
            kwargs["tools"] = tools
            if request.tool_choice is not None:
                kwargs["tool_choice"] = request.tool_choice
        if request.response_format is not None:
            kwargs["response_format"] = request.response_format
        if self._ask_ids and request.sampling.logprobs:
            kwargs["logprobs"] = True
        data = await self._call("acompletion", kwargs)
        generation = generation_from_response(data, model=self._served_name, chat=True)
        if generation.token_ids_source == "none" and self._tokenizer_path is not None:
            await asyncio.to_thread(self._chat_ids_from_tokenizer, generation, request.messages, tools)
        return generation

    async def complete(self, request: CompletionRequest) -> Generation:
        self._check_model(request.model)
        if not request.prompt:
            raise InvalidRequestError("the prompt is empty")
        kwargs = self._common(request.sampling, request.extra)
        kwargs["prompt"] = request.prompt
        if self._ask_ids and request.sampling.logprobs:
            kwargs["logprobs"] = 1
        data = await self._call("atext_completion", kwargs)
        generation = generation_from_response(data, model=self._served_name, chat=False)
        if generation.token_ids_source == "none" and self._tokenizer_path is not None:
            await asyncio.to_thread(self._completion_ids_from_tokenizer, generation, request.prompt)
        return generation

    # -- token ids from a local tokenizer ----------------------------------------------------------

    def _end_ids(self, tokenizer: ChatTokenizer) -> set[int]:
        ends = {tokenizer.eos_token_id}
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
            ends.add(im_end)
        return {i for i in ends if isinstance(i, int)}

    def _chat_ids_from_tokenizer(
        self, generation: Generation, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> None:
        """Prompt ids: the template with the generation prompt. Response ids: what the template puts
        after it for the reply, through its end-of-turn token (without it when cut by length)."""
        tokenizer = self._load_tokenizer()
        prompt = render_prompt(tokenizer, messages, tools)
        reply = render_reply(tokenizer, messages, tools, generation.message)
        ids = list(tokenizer.encode(reply or generation.text, add_special_tokens=False))
        ends = [i for i, token in enumerate(ids) if token in self._end_ids(tokenizer)]
        if ends:
            ids = ids[: ends[-1] + (0 if generation.finish_reason == "length" else 1)]
        self._set_ids(generation, list(tokenizer.encode(prompt, add_special_tokens=False)), ids)

    def _completion_ids_from_tokenizer(self, generation: Generation, prompt: str | list[int]) -> None:
        tokenizer = self._load_tokenizer()
        prompt_ids = list(prompt) if isinstance(prompt, list) else list(tokenizer.encode(prompt))
        self._set_ids(generation, prompt_ids, list(tokenizer.encode(generation.text, add_special_tokens=False)))

    @staticmethod
    def _set_ids(generation: Generation, prompt_ids: list[int], response_ids: list[int]) -> None:
        generation.prompt_token_ids, generation.response_token_ids = prompt_ids, response_ids
        generation.response_logprobs = None  # the endpoint's log-probs belong to its own tokens
        generation.token_ids_source = "tokenizer"
        generation.prompt_tokens = generation.prompt_tokens or len(prompt_ids)  # the endpoint's usage wins
        generation.completion_tokens = generation.completion_tokens or len(response_ids)
