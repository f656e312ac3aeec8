"""A scripted engine: answers by rule with tool calls, JSON or text, as a trained model would.

It stands in for a model that can call tools and follow a JSON schema, which the untrained tiny
model cannot. Behind a `ProxyServer` it is also the scripted OpenAI-compatible upstream that the
`litellm` engine talks to. Its token ids are the UTF-8 bytes of the text, log-probs a constant.
"""

from __future__ import annotations

import json
from typing import Any

from alight.engines.base import ChatRequest, CompletionRequest, Engine, Generation

TEXT = "The answer is 5."


class ScriptedEngine(Engine):
    """Rules, first match wins: a JSON response format gets `json_answer` as content; offered
    tools (unless tool_choice is "none", or the last message is a tool result) get a call to the
    chosen or first tool with `tool_arguments[name]`; anything else gets `text`."""

    name = "scripted"

    def __init__(
        self,
        *,
        model: str = "scripted",
        tool_arguments: dict[str, dict[str, Any]] | None = None,
        json_answer: dict[str, Any] | None = None,
        text: str = TEXT,
    ) -> None:
        self._model = model
        self.tool_arguments = tool_arguments or {}
        self.json_answer = json_answer or {}
        self.text = text
        self.requests: list[ChatRequest] = []

    @property
    def model_names(self) -> list[str]:
        return [self._model]

    async def chat(self, request: ChatRequest) -> Generation:
        self.requests.append(request)
        message: dict[str, Any] = {"role": "assistant", "content": self.text}
        fmt = (request.response_format or {}).get("type")
        if fmt in ("json_schema", "json_object"):
            message["content"] = json.dumps(self.json_answer)
        elif request.tools and request.tool_choice != "none" and request.messages[-1]["role"] != "tool":
            name = request.tools[0]["function"]["name"]
            if isinstance(request.tool_choice, dict):
                name = request.tool_choice["function"]["name"]
            arguments = json.dumps(self.tool_arguments.get(name, {}))
            call = {
                "id": f"call_{len(self.requests)}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            text = f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'
            return self._generation(request.messages, text, message, "tool_calls")
        return self._generation(request.messages, message["content"], message, "stop")

    async def complete(self, request: CompletionRequest) -> Generation:
        prompt = request.prompt if isinstance(request.prompt, str) else ""
        return self._generation(
            [{"role": "user", "content": prompt}], self.text, {"role": "assistant", "content": self.text}, "stop"
        )

    def _generation(
        self, messages: list[dict[str, Any]], text: str, message: dict[str, Any], finish: str
    ) -> Generation:
        prompt = list(json.dumps(messages).encode())
        response = list(text.encode())
        return Generation(
            model=self._model,
            text=text,
            message=message,
            finish_reason=finish,
            prompt_token_ids=prompt,
            response_token_ids=response,
            response_logprobs=[-0.5] * len(response),
            prompt_tokens=len(prompt),
            completion_tokens=len(response),
        )
