"""The scripted OpenAI server with two more routes: legacy text completions and the Responses API.

Both answer with the script's next message as text (no model runs here), under `/v1/...` and the
alight proxy shape `/rollout/{rollout_id}/attempt/{attempt_id}/v1/...`, and log every request in
`requests` like the chat route does.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fixtures.openai_server import ReceivedRequest, ScriptedOpenAIServer

USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


class AllRoutesServer(ScriptedOpenAIServer):
    """`ScriptedOpenAIServer` plus `POST .../v1/completions` and `POST .../v1/responses`."""

    async def _received(self, request: Request) -> tuple[dict[str, Any], str]:
        body = await request.json()
        received = ReceivedRequest(
            path=request.url.path,
            headers={key.lower(): value for key, value in request.headers.items()},
            body=body,
            rollout_id=request.path_params.get("rollout_id"),
            attempt_id=request.path_params.get("attempt_id"),
        )
        with self._lock:
            self.requests.append(received)
        return body, str(self.next_message(body).get("content") or "")

    async def _text(self, request: Request) -> Response:
        body, text = await self._received(request)

        def completion(text: str, finish: str | None, usage: dict[str, int] | None = None) -> dict[str, Any]:
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
            out: dict[str, Any] = {"id": "cmpl-1", "object": "text_completion", "created": int(time.time())}
            return {**out, "model": self.model, "choices": [choice], **({"usage": usage} if usage else {})}

        if not body.get("stream"):
            return JSONResponse(completion(text, "stop", USAGE))

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(text), 4):
                yield f"data: {json.dumps(completion(text[start : start + 4], None))}\n\n".encode()
            yield f"data: {json.dumps(completion('', 'stop'))}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def _responses(self, request: Request) -> Response:
        _, text = await self._received(request)
        content = [{"type": "output_text", "text": text, "annotations": []}]
        output = [{"type": "message", "id": "msg_1", "status": "completed", "role": "assistant", "content": content}]
        return JSONResponse(
            {
                "id": "resp_1",
                "object": "response",
                "created_at": int(time.time()),
                "status": "completed",
                "model": self.model,
                "output": output,
                "parallel_tool_calls": False,
                "tool_choice": "auto",
                "tools": [],
            }
        )

    def start(self) -> AllRoutesServer:
        proxy = "/rollout/{rollout_id}/attempt/{attempt_id}"
        routes = [Route("/v1/models", self._models, methods=["GET"])]
        for prefix in ("", proxy):
            routes += [
                Route(f"{prefix}/v1/chat/completions", self._chat, methods=["POST"]),
                Route(f"{prefix}/v1/completions", self._text, methods=["POST"]),
                Route(f"{prefix}/v1/responses", self._responses, methods=["POST"]),
            ]
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        sock.listen(128)
        self.port = sock.getsockname()[1]
        app = Starlette(routes=routes)
        config = uvicorn.Config(app, loop="asyncio", access_log=False, log_level="warning", log_config=None)
        server = self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(server.serve(sockets=[sock])), name="scripted-openai-all", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the scripted OpenAI server did not start")
            time.sleep(0.01)
        return self

    def __enter__(self) -> AllRoutesServer:
        return self.start()
