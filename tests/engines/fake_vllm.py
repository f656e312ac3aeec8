"""A fake `vllm` command for tests where no GPU is (a stand-in, not vLLM: no model runs here).

`python fake_vllm.py --model MODEL_DIR --host H --port P ...` (the options alight gives vLLM's
OpenAI server) serves the scripted OpenAI server on that
port; its answer names a digest of MODEL_DIR/model.safetensors, re-read on start and on
`reload_weights`, so a test can tell which weights are served. Exits with code 3 when
MODEL_DIR/crash exists (once, deleting it, for MODEL_DIR/crash_once); answers reload_weights
with 404 while MODEL_DIR/no_reload exists.

Sleep mode as vLLM 0.31 serves it: `POST /sleep?level=N`, `POST /wake_up[?tags=...]` and
`GET /is_sleeping` exist only with VLLM_SERVER_DEV_MODE=1 (else 404), and /sleep answers 500 unless
the command carried `--enable-sleep-mode`. Each sleep-mode call is printed as `fake vllm: POST /sleep?...`
(the engine writes this output to its vllm.log), so a test reads the calls in order there.

Calls in flight during a reload: with FAKE_VLLM_DELAY_S set, a chat answer takes that long, and
prints `fake vllm weights: begin <digest>`, `... end <digest at begin> <digest at end>`; each
reload prints `fake vllm weights: reload <digest>`. A chat whose weights were swapped while it ran (what a
real vLLM reloading mid-request would serve: the later tokens by the new weights) answers the mixed
text `weights <old>-><new>`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tests.fixtures.openai_server import Reply, ScriptedOpenAIServer


class FakeVLLMServer(ScriptedOpenAIServer):
    """The scripted server with vLLM's sleep-mode rules, printing each sleep-mode call."""

    sleep_enabled: bool = False  # the command carried --enable-sleep-mode
    delay_s: float = 0.0  # FAKE_VLLM_DELAY_S: how long a chat answer takes
    digest: str = ""  # of the weights served now

    async def _chat(self, request: Request) -> Response:
        begun = self.digest
        print(f"fake vllm weights: begin {begun}", flush=True)
        await asyncio.sleep(self.delay_s)
        response = await super()._chat(request)
        ended = self.digest
        print(f"fake vllm weights: end {begun} {ended}", flush=True)
        if begun != ended and response.status_code == 200:  # swapped mid-call: a mixed answer
            data = json.loads(bytes(response.body))
            data["choices"][0]["message"]["content"] = f"weights {begun}->{ended}"
            return JSONResponse(data)
        return response

    def record_sleep_call(self, call: str) -> None:
        super().record_sleep_call(call)
        print(f"fake vllm: {call}", flush=True)

    async def _sleep_mode(self, request: Request) -> Response:
        if request.url.path == "/sleep" and self.sleep_endpoints and not self.sleep_enabled:
            self.record_sleep_call(f"{request.method} {request.url.path}?{request.url.query}")
            return JSONResponse({"error": {"message": "sleep mode is not enabled"}}, status_code=500)
        return await super()._sleep_mode(request)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--enable-sleep-mode", action="store_true")
    args, _ = parser.parse_known_args()
    model = Path(args.model)
    if (model / "crash").exists():
        sys.exit(3)
    if (model / "crash_once").exists():  # dies while starting once (killed for memory), then starts
        (model / "crash_once").unlink()
        sys.exit(3)
    server = FakeVLLMServer(Reply(), model=None, port=args.port)
    server.sleep_endpoints = os.environ.get("VLLM_SERVER_DEV_MODE") == "1"
    server.sleep_enabled = args.enable_sleep_mode
    server.delay_s = float(os.environ.get("FAKE_VLLM_DELAY_S", "0"))

    def read_weights() -> bool:
        if (model / "no_reload").exists():  # act as a vLLM that cannot reload in place
            return False
        digest = hashlib.sha256((model / "model.safetensors").read_bytes()).hexdigest()[:12]
        server.script.content = f"weights {digest}"
        server.digest = digest
        print(f"fake vllm weights: reload {digest}", flush=True)
        return True

    read_weights()
    server.on_reload = read_weights
    server.start()
    print("fake vllm serving", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
