"""The litellm engine against a real scripted OpenAI-compatible server on loopback (vLLM-style ids)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from alight.engines.base import ChatRequest, CompletionRequest, SamplingParams
from alight.engines.litellm_engine import LiteLLMEngine
from alight.errors import ConfigError, EngineUnavailableError, InvalidRequestError
from tests.fixtures.openai_server import Reply, ScriptedOpenAIServer

pytest.importorskip("litellm")

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Hi"}]
CALL = {"id": "call_9", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


@pytest.fixture
def server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer(model=None) as srv:
        yield srv


def chat(model: str = "policy", **kwargs: object) -> ChatRequest:
    return ChatRequest(model=model, messages=MESSAGES, sampling=SamplingParams(temperature=0.5, max_tokens=9), **kwargs)  # type: ignore[arg-type]


async def test_token_ids_and_logprobs_from_the_endpoint(server: ScriptedOpenAIServer) -> None:
    engine = LiteLLMEngine("openai/policy", base_url=server.url, served_name="policy", extra_body={"top_k": 5})
    generation = await engine.chat(chat())
    assert generation.token_ids_source == "engine"
    assert generation.prompt_token_ids == [1, 2, 3, 4]
    assert generation.response_token_ids == [10, 11, 12]
    assert generation.response_logprobs == [-10.5, -11.5, -12.5]
    assert generation.message == {"role": "assistant", "content": "Hello from the server."}
    assert generation.text == "Hello from the server."
    assert (generation.finish_reason, generation.model) == ("stop", "policy")
    assert (generation.prompt_tokens, generation.completion_tokens) == (4, 3)
    sent = server.requests[-1].body
    assert sent["return_token_ids"] is True and sent["logprobs"] is True and sent["top_k"] == 5
    assert (sent["model"], sent["messages"], sent["temperature"], sent["max_tokens"]) == ("policy", MESSAGES, 0.5, 9)


async def test_tool_calls_come_back_in_openai_form(server: ScriptedOpenAIServer) -> None:
    server.script = Reply(content=None, tool_calls=[CALL], finish_reason="tool_calls")
    engine = LiteLLMEngine("openai/policy", base_url=server.url, served_name="policy")
    generation = await engine.chat(chat(tools=TOOLS, tool_choice="auto"))
    assert generation.finish_reason == "tool_calls"
    assert generation.message["content"] is None
    assert generation.message["tool_calls"] == [CALL]
    assert server.requests[-1].body["tools"] == TOOLS


async def test_token_ids_from_a_local_tokenizer_when_the_endpoint_has_none(
    server: ScriptedOpenAIServer, tiny_dir: Path
) -> None:
    engine = LiteLLMEngine(
        "openai/policy", base_url=server.url, served_name="policy", tokenizer=tiny_dir, return_token_ids=False
    )
    generation = await engine.chat(chat())
    assert "return_token_ids" not in server.requests[-1].body and "logprobs" not in server.requests[-1].body
    assert generation.token_ids_source == "tokenizer"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    assert generation.prompt_token_ids is not None and generation.response_token_ids is not None
    assert tokenizer.decode(generation.prompt_token_ids) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(generation.response_token_ids) == "Hello from the server.<|im_end|>"
    assert generation.response_logprobs is None

    server.script = Reply(content=None, tool_calls=[CALL], finish_reason="tool_calls")
    generation = await engine.chat(chat(tools=TOOLS))
    assert generation.response_token_ids is not None
    assert tokenizer.decode(generation.response_token_ids) == (
        '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call><|im_end|>'
    )


async def test_text_only_without_ids_or_tokenizer(server: ScriptedOpenAIServer) -> None:
    engine = LiteLLMEngine("openai/policy", base_url=server.url, served_name="policy", return_token_ids=False)
    generation = await engine.chat(chat())
    assert generation.token_ids_source == "none"
    assert generation.prompt_token_ids is None and generation.response_token_ids is None
    assert generation.response_logprobs is None
    assert generation.message["content"] == "Hello from the server."


async def test_completions_with_ids_and_with_a_tokenizer(server: ScriptedOpenAIServer, tiny_dir: Path) -> None:
    engine = LiteLLMEngine("openai/policy", base_url=server.url, served_name="policy")
    generation = await engine.complete(CompletionRequest(model="policy", prompt="Once"))
    assert (generation.token_ids_source, generation.prompt_token_ids) == ("engine", [1, 2, 3, 4])
    assert generation.response_token_ids == [10, 11, 12]
    assert generation.response_logprobs == [-10.5, -11.5, -12.5]
    assert generation.finish_reason == "length"
    assert server.requests[-1].body["prompt"] == "Once"

    local = LiteLLMEngine(
        "openai/policy", base_url=server.url, served_name="policy", tokenizer=tiny_dir, return_token_ids=False
    )
    generation = await local.complete(CompletionRequest(model="policy", prompt="Once"))
    assert generation.token_ids_source == "tokenizer"
    assert generation.prompt_token_ids is not None and len(generation.prompt_token_ids) == 4
    assert generation.response_token_ids is not None and len(generation.response_token_ids) == len(generation.text)


async def test_errors(server: ScriptedOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = LiteLLMEngine("openai/policy", base_url=server.url, served_name="policy")
    with pytest.raises(InvalidRequestError, match="unknown model"):
        await engine.chat(chat("other"))
    with pytest.raises(InvalidRequestError, match="tools"):
        await engine.chat(chat(tools=[{"type": "function", "function": {}}]))
    server.script = Reply(status=400, error_message="This model's maximum context length is 1024 tokens")
    with pytest.raises(InvalidRequestError, match="maximum context length") as err:
        await engine.chat(chat())
    assert "\n" not in str(err.value)
    server.script = Reply(status=503, error_message="overloaded")
    with pytest.raises(EngineUnavailableError):
        await engine.chat(chat())
    server.script = Reply()
    assert (await engine.chat(chat())).text == "Hello from the server."

    keyed = LiteLLMEngine("openai/policy", base_url=server.url, api_key_env="ALIGHT_TEST_KEY", served_name="p")
    monkeypatch.delenv("ALIGHT_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="ALIGHT_TEST_KEY"):
        await keyed.start()
    monkeypatch.setenv("ALIGHT_TEST_KEY", "sk-test")
    await keyed.start()
    assert (await keyed.chat(chat("p"))).text == "Hello from the server."


async def test_unreachable_endpoint_is_engine_unavailable() -> None:
    engine = LiteLLMEngine("openai/policy", base_url="http://127.0.0.1:9/v1", served_name="policy", timeout_s=5)
    with pytest.raises(EngineUnavailableError):
        await engine.chat(chat())
