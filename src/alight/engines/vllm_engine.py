"""The vLLM engine: starts `vllm serve` on the policy (GPU), asks it for token ids and log-probs,
and reloads weights after an update.

Requests go to vLLM's OpenAI API with `return_token_ids: true`, `logprobs: true` and
`skip_special_tokens: false`, so the answer has the prompt and response ids and the raw text,
tool-call markup included; alight parses the Hermes `<tool_call>` blocks itself (as the embedded
engine does), so no vLLM tool parser flags are needed. Weight updates write the new weights into
the directory vLLM serves and ask it to reload them from disk (`/collective_rpc` with
`reload_weights`, available with VLLM_SERVER_DEV_MODE=1, which the engine sets); if that fails,
the process is restarted on the new weights.

Sleep mode (on by default) lets vLLM and a colocated trainer share one GPU by turns: the server
starts with `--enable-sleep-mode`, and while the trainer updates the policy the proxy calls
`sleep()` (`POST /sleep?level=N`, a dev endpoint like /collective_rpc) and then `wake_up()`
(`POST /wake_up`). Level 1 moves the weights to CPU RAM and frees the KV cache; level 2 frees
both (no CPU copy, for hosts short of RAM) and wake-up reloads the weights from the served
directory, the order vLLM's sleep-mode guide gives (wake the weights, reload, wake the KV cache).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from alight.engines.base import ChatRequest, CompletionRequest, Engine, Generation, SamplingParams
from alight.engines.openai_response import generation_from_response, optional_sampling
from alight.engines.toolcalls import assistant_message, validate_tools
from alight.engines.vllm_server import (
    VLLMProcess,
    free_port,
    link_model_dir,
    serve_command,
    vllm_executable,
    write_weights,
)
from alight.errors import AlightError, ConfigError, EngineUnavailableError, InvalidRequestError, one_line

logger = logging.getLogger(__name__)

END_OF_TURN_TEXTS = ("<|im_end|>", "<|endoftext|>")
SLEEP_LEVELS = (1, 2)


def _body(sampling: SamplingParams, served_name: str, extra: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """The fields every vLLM request of alight's carries: ids back, special tokens kept (the
    <tool_call> markup is one in some tokenizers), the sampling settings; then `extra` on top."""
    body: dict[str, Any] = {
        "model": served_name,
        **fields,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "return_token_ids": True,
        "skip_special_tokens": False,
    }
    body.update(optional_sampling(sampling))
    return {**body, **extra}


def chat_body(request: ChatRequest, served_name: str) -> dict[str, Any]:
    """vLLM chat request body for an alight ChatRequest."""
    fields: dict[str, Any] = {"messages": request.messages, "logprobs": request.sampling.logprobs}
    tools = validate_tools(request.tools)
    if tools:
        fields["tools"] = tools
        fields["tool_choice"] = "none"  # tools go into the template; alight parses the calls itself
    if request.response_format is not None:
        fields["response_format"] = request.response_format
    return _body(request.sampling, served_name, request.extra, **fields)


def completion_body(request: CompletionRequest, served_name: str) -> dict[str, Any]:
    """vLLM completions request body (prompt text or token ids)."""
    fields: dict[str, Any] = {"prompt": request.prompt}
    if request.sampling.logprobs:
        fields["logprobs"] = 1
    return _body(request.sampling, served_name, request.extra, **fields)


def generation_from_vllm(
    data: dict[str, Any], *, chat: bool, served_name: str, parse_tools: bool, weights_version: int | None
) -> Generation:
    """A Generation from a vLLM response: ids from vLLM, tool calls parsed from the raw text."""
    generation = generation_from_response(data, model=served_name, chat=chat, weights_version=weights_version)
    text = generation.text
    for end in END_OF_TURN_TEXTS:  # vLLM leaves the stop token out of the text; be sure of it
        text = text.removesuffix(end)
    generation.text = text
    if chat:
        generation.message = assistant_message(text, parse_tools=parse_tools)
        if generation.message.get("tool_calls") and generation.finish_reason == "stop":
            generation.finish_reason = "tool_calls"
    else:
        generation.message = {"role": "assistant", "content": text}
    return generation


def _error_message(response: Any) -> str:
    try:
        body = response.json()
    except ValueError:
        return one_line(response.text, 300) or f"HTTP {response.status_code}"
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else body.get("message") or body.get("detail")
    return one_line(str(message or body), 300)


class VLLMEngine(Engine):
    """Serves `model` ("tiny" or a model directory) with a `vllm serve` child process on a GPU.

    With `base_url` it talks to a vLLM server that is already running instead (weight updates
    then need that server to run with VLLM_SERVER_DEV_MODE=1 and serve a directory it can reload;
    sleeping needs it to run with --enable-sleep-mode as well, else the engine warns once and
    the server keeps its GPU memory)."""

    name = "vllm"

    def __init__(
        self,
        model: str | os.PathLike[str] = "tiny",
        *,
        base_url: str | None = None,  # an already running vLLM server (".../v1"): start none
        host: str = "127.0.0.1",
        port: int | None = None,  # None: a free port
        served_name: str | None = None,
        gpu_memory_utilization: float = 0.5,
        dtype: str = "auto",
        max_model_len: int | None = None,
        seed: int | None = 0,
        logprobs_mode: str | None = "processed_logprobs",  # log-probs after temperature, like the embedded engine
        sleep_mode: bool = True,  # --enable-sleep-mode: free the GPU while a colocated trainer updates the policy
        sleep_level: int = 1,  # 1: weights to CPU RAM, KV cache freed; 2: both freed, weights re-read on wake-up
        extra_args: Sequence[str] = (),  # more `vllm serve` arguments, verbatim
        startup_timeout_s: float = 900.0,
        request_timeout_s: float = 600.0,
        work_dir: str | os.PathLike[str] | None = None,  # served model links, new weights, vllm.log
        cache_dir: str | os.PathLike[str] | None = None,  # where "tiny" is built
    ) -> None:
        if sleep_level not in SLEEP_LEVELS:
            raise ConfigError(f"vllm engine: sleep_level is 1 or 2, not {sleep_level!r}")
        self._source = str(model)
        self._served_name = served_name or ("tiny" if self._source == "tiny" else Path(self._source).name)
        self._base_url = base_url.rstrip("/") if base_url else None
        self._host, self._port = host, port
        self._options = {
            "gpu_memory_utilization": gpu_memory_utilization,
            "dtype": dtype,
            "max_model_len": max_model_len,
            "seed": seed,
            "logprobs_mode": logprobs_mode,
        }
        self._max_model_len = max_model_len
        self._extra_args = list(extra_args)
        self._startup_timeout_s, self._request_timeout_s = startup_timeout_s, request_timeout_s
        self._work_dir = Path(work_dir) if work_dir is not None else None
        self._cache_dir = cache_dir
        self._process: VLLMProcess | None = None
        self._serving_dir: Path | None = None
        self._version = 0
        self._sleep_mode, self._sleep_level = sleep_mode, sleep_level
        self._asleep = False
        self._cannot_sleep = False  # a base_url server without sleep mode: warned once, never asked again

    @property
    def model_names(self) -> list[str]:
        return [self._served_name]

    @property
    def weights_version(self) -> int | None:
        return self._version

    @property
    def max_context(self) -> int | None:
        if self._max_model_len is not None:
            return self._max_model_len
        if self._serving_dir is not None:
            config = json.loads((self._serving_dir / "config.json").read_text())
            return int(config.get("max_position_embeddings") or 0) or None
        return None

    @property
    def server_root(self) -> str:
        """The server's root URL (no /v1)."""
        if self._base_url is not None:
            return self._base_url.removesuffix("/v1")
        return f"http://{self._host}:{self._port}"

    # -- process ---------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._base_url is not None:
            await self._get("/health")
            return
        executable = vllm_executable()
        await asyncio.to_thread(self._prepare_dir)
        self._port = self._port or free_port(self._host)
        assert self._serving_dir is not None and self._work_dir is not None
        command = serve_command(
            executable,
            self._serving_dir,
            host=self._host,
            port=self._port,
            served_name=self._served_name,
            sleep_mode=self._sleep_mode,
            extra_args=self._extra_args,
            **self._options,  # type: ignore[arg-type]
        )
        self._process = VLLMProcess(command, self._work_dir / "vllm.log", env={"VLLM_SERVER_DEV_MODE": "1"})
        await self._launch()

    def _prepare_dir(self) -> None:
        import tempfile

        if self._work_dir is None:
            self._work_dir = Path(tempfile.mkdtemp(prefix="alight-vllm-"))
        if self._source == "tiny":
            from alight.engines.embedded import tiny_model_dir

            source = tiny_model_dir(self._cache_dir)
        else:
            source = Path(self._source)
        self._serving_dir = link_model_dir(source, self._work_dir / "model")

    async def _launch(self) -> None:
        assert self._process is not None
        self._process.start()
        self._asleep = False  # a new process starts awake
        try:
            await asyncio.to_thread(self._process.wait_healthy, f"{self.server_root}/health", self._startup_timeout_s)
        except BaseException:
            await asyncio.to_thread(self._process.stop)
            raise

    async def close(self) -> None:
        if self._process is not None:
            await asyncio.to_thread(self._process.stop)
            self._process = None

    # -- HTTP --------------------------------------------------------------------------------------

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        import httpx

        try:
            async with httpx.AsyncClient(timeout=self._request_timeout_s) as client:
                response = await client.request(method, f"{self.server_root}{path}", json=body)
        except httpx.HTTPError as err:
            raise EngineUnavailableError(f"vllm engine: {self.server_root} did not answer: {err!r}") from err
        if response.status_code in (400, 404, 422):
            raise InvalidRequestError(_error_message(response))
        if response.status_code >= 300:
            raise EngineUnavailableError(f"vllm engine: HTTP {response.status_code}: {_error_message(response)}")
        return response.json() if response.content else None

    async def _get(self, path: str) -> Any:
        return await self._request("GET", path)

    def _check_model(self, name: str) -> None:
        if name not in self.model_names:
            raise InvalidRequestError(f"unknown model {name!r}; this engine serves {', '.join(self.model_names)}")

    async def chat(self, request: ChatRequest) -> Generation:
        self._check_model(request.model)
        body = chat_body(request, self._served_name)
        version = self._version
        data = await self._request("POST", "/v1/chat/completions", body)
        parse_tools = "tools" in body and request.tool_choice != "none"
        return generation_from_vllm(
            data, chat=True, served_name=self._served_name, parse_tools=parse_tools, weights_version=version
        )

    async def complete(self, request: CompletionRequest) -> Generation:
        self._check_model(request.model)
        version = self._version
        data = await self._request("POST", "/v1/completions", completion_body(request, self._served_name))
        return generation_from_vllm(
            data, chat=False, served_name=self._served_name, parse_tools=False, weights_version=version
        )

    # -- weights -------------------------------------------------------------------------------------

    async def update_weights(self, weights: Mapping[str, Any] | str, version: int) -> None:
        """Write the weights into the served directory and have vLLM reload them (restart if it cannot).

        The proxy calls this with no request in flight."""
        if self._serving_dir is None:
            raise ConfigError("vllm engine: weight updates need the engine to start the vLLM server itself")
        await asyncio.to_thread(write_weights, self._serving_dir, weights)
        try:
            await self._request("POST", "/collective_rpc", {"method": "reload_weights"})
        except AlightError as err:
            logger.warning("vllm engine: in-place reload failed (%s); restarting vllm serve", err)
            await self.close_and_restart()
        else:
            try:  # cached prefixes were computed by the old weights
                await self._request("POST", "/reset_prefix_cache")
            except AlightError as err:
                logger.warning("vllm engine: could not reset the prefix cache: %s", err)
        self._version = version
        logger.info("vllm engine: serving weights version %d", version)

    async def close_and_restart(self) -> None:
        """Stop the vLLM process and start it again on the served directory (the fallback reload)."""
        if self._process is None:
            raise EngineUnavailableError("vllm engine: no vLLM process to restart")
        await asyncio.to_thread(self._process.stop)
        await self._launch()

    # -- sleep mode ------------------------------------------------------------------------------

    @property
    def asleep(self) -> bool:
        """Whether the server is asleep now (between `sleep` and `wake_up`)."""
        return self._asleep

    async def sleep(self) -> None:
        """Have vLLM free its GPU memory (`POST /sleep?level=N`). The proxy calls it with no request
        in flight. Nothing happens with sleep_mode off, or (after one warning) with a base_url
        server that cannot sleep."""
        if not self._sleep_mode or self._cannot_sleep or self._asleep:
            return
        # mode=wait: vLLM lets a request still running finish (a shared base_url server may have some)
        if await self._dev_post(f"/sleep?level={self._sleep_level}&mode=wait", may_lack=self._process is None):
            self._asleep = True
            logger.info("vllm engine: asleep (level %d)", self._sleep_level)

    async def wake_up(self) -> None:
        """Take the GPU memory back (`POST /wake_up`); at level 2, reload the served weights first."""
        if not self._asleep:
            return
        if self._sleep_level == 1:
            await self._dev_post("/wake_up")
        else:  # level 2 kept no copy of the weights: allocate them, read them from disk, then the KV cache
            await self._dev_post("/wake_up?tags=weights")
            await self._request("POST", "/collective_rpc", {"method": "reload_weights"})
            await self._dev_post("/wake_up?tags=kv_cache")
        self._asleep = False
        logger.info("vllm engine: awake")

    async def _dev_post(self, path: str, *, may_lack: bool = False) -> bool:
        """POST to one of vLLM's dev endpoints. With `may_lack`, a refusal (no such endpoint: the
        server runs without VLLM_SERVER_DEV_MODE=1; or no --enable-sleep-mode) is a warning and False."""
        import httpx

        try:
            async with httpx.AsyncClient(timeout=self._request_timeout_s) as client:
                response = await client.post(f"{self.server_root}{path}")
        except httpx.HTTPError as err:
            raise EngineUnavailableError(f"vllm engine: {self.server_root} did not answer: {err!r}") from err
        if response.status_code < 300:
            return True
        message = f"vllm engine: POST {path} answered HTTP {response.status_code}: {_error_message(response)}"
        if not may_lack:
            raise EngineUnavailableError(message)
        self._cannot_sleep = True
        logger.warning(
            "%s; the server at %s keeps its GPU memory during updates (start it with VLLM_SERVER_DEV_MODE=1 "
            "and --enable-sleep-mode to let it sleep, or set sleep_mode: false to skip this)",
            message,
            self.server_root,
        )
        return False
