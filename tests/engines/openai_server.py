"""A small scripted OpenAI-compatible server on loopback, answering like vLLM does.

It stands in for a remote endpoint (vLLM, SGLang, a provider) in the litellm and vLLM engine tests:
it replies with a scripted assistant message, and when the request asks `return_token_ids` it adds
vLLM's fields (`prompt_token_ids` at the top level of chat responses and on completion choices,
`token_ids` on every choice). Every request body is kept in `requests`.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


@dataclass
class Script:
    """What the server answers."""

    content: str | None = "Hello from the server."
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str = "stop"
    prompt_token_ids: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    token_ids: list[int] = field(default_factory=lambda: [10, 11, 12])
    status: int = 200  # anything else: an error response with `error_message`
    error_message: str = "bad request"
    reload_status: int = 200  # not 200: the dev endpoint POST /collective_rpc answers 404


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ScriptedOpenAIServer:
    """`with ScriptedOpenAIServer() as server:` serves on `server.base_url` (".../v1")."""

    def __init__(self, script: Script | None = None, *, port: int | None = None) -> None:
        self.script = script or Script()
        self.requests: list[dict[str, Any]] = []
        self.rpc_calls: list[dict[str, Any]] = []
        self.on_reload: Any = None  # called by reload_weights; False: answer 404 as a vLLM without it
        self.port = port or _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def _logprobs_chat(self) -> dict[str, Any]:
        return {"content": [{"token": f"t{i}", "logprob": -0.5 - i, "top_logprobs": []} for i in self.script.token_ids]}

    def _app(self) -> Any:
        app = FastAPI()

        def error() -> JSONResponse:
            body = {"error": {"message": self.script.error_message, "type": "BadRequestError", "code": 400}}
            return JSONResponse(body, status_code=self.script.status)

        @app.get("/health")
        async def health() -> dict[str, str]:
            return {}

        @app.post("/collective_rpc")
        async def collective_rpc(request: Request) -> Any:
            self.rpc_calls.append(await request.json())
            reloaded = self.on_reload() if self.on_reload is not None else True
            if self.script.reload_status != 200 or not reloaded:
                return JSONResponse({"error": "no such method"}, status_code=404)
            return {"results": [None]}

        @app.post("/reset_prefix_cache")
        async def reset_prefix_cache() -> dict[str, str]:
            return {}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await request.json()
            self.requests.append(body)
            if self.script.status != 200:
                return error()
            message: dict[str, Any] = {"role": "assistant", "content": self.script.content}
            if self.script.tool_calls:
                message["tool_calls"] = self.script.tool_calls
            choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": self.script.finish_reason}
            data: dict[str, Any] = {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "m"),
                "choices": [choice],
                "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
            }
            if body.get("logprobs"):
                choice["logprobs"] = self._logprobs_chat()
            if body.get("return_token_ids"):
                data["prompt_token_ids"] = self.script.prompt_token_ids
                choice["token_ids"] = self.script.token_ids
            return data

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            body = await request.json()
            self.requests.append(body)
            if self.script.status != 200:
                return error()
            choice: dict[str, Any] = {"index": 0, "text": self.script.content or "", "finish_reason": "length"}
            if body.get("logprobs") is not None:
                choice["logprobs"] = {
                    "tokens": [f"t{i}" for i in self.script.token_ids],
                    "token_logprobs": [-0.5 - i for i in self.script.token_ids],
                    "top_logprobs": None,
                    "text_offset": list(range(len(self.script.token_ids))),
                }
            if body.get("return_token_ids"):
                choice["prompt_token_ids"] = self.script.prompt_token_ids
                choice["token_ids"] = self.script.token_ids
            return {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body.get("model", "m"),
                "choices": [choice],
                "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
            }

        return app

    def start(self) -> ScriptedOpenAIServer:
        import uvicorn

        config = uvicorn.Config(self._app(), host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the scripted OpenAI server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=5)

    def __enter__(self) -> ScriptedOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
