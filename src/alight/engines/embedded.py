"""The embedded engine: a `transformers` causal LM served in process, on CPU or GPU.

Concurrent requests run in one batch that they join and leave one token at a time (continuous
batching), on one background thread that owns the model (`alight.engines.batching`), so no torch
work happens on the event loop. Each answer carries the exact prompt ids (the chat template's
text, encoded), the response ids and their log-probs, and the version of the weights that
produced it; `update_weights` lets the running rows finish, then swaps weights in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alight.chat_template import render_prompt
from alight.engines.agent_adapters import AgentAdapters
from alight.engines.base import (
    NEUTRAL_SAMPLING,
    ChatRequest,
    CompletionRequest,
    Engine,
    EngineCapabilities,
    Generation,
    SamplingParams,
    StreamEvent,
    TextDelta,
)
from alight.engines.batching import BatchWorker, Job, Join, answer, deliver
from alight.engines.sampling import Decoder, Sequence, SequenceOutput
from alight.engines.toolcalls import PlainTextStream, ToolCallStreamFilter, assistant_message, validate_tools
from alight.engines.weights import load_weights_into
from alight.errors import ConfigError, ContextLengthError, InvalidRequestError
from alight.models.devices import native_bf16
from alight.models.resolve import TINY

if TYPE_CHECKING:
    from alight.config.schema import EngineConfig

logger = logging.getLogger(__name__)

DTYPES = ("auto", "float32", "bfloat16", "float16")


class EmbeddedEngine(Engine):
    """A Hugging Face causal LM with its chat template and Hermes tool calls, batched in one thread.

    `model` is a spec `alight.models.resolve.resolve_model` takes (the tiny model, built once into
    `cache_dir`; a model directory, a GGUF file, a packaged model's name, a hub id);
    `chat_template` chooses its template (`alight.models.chat_templates`).
    Response token ids stop at and include the end-of-turn token (`<|im_end|>` or eos) when the
    model generated it; the text excludes it. Log-probs are log_softmax(logits / T) at each sampled
    token, T = temperature (T = 1 when temperature is 0), from the logits that sampled it.
    Requests join the running batch between two tokens (`continuous_batching`; False: static
    batches, each running to its end while new requests wait).
    With `adapters` (agent names), one LoRA adapter per agent answers that agent's calls (see
    `alight.engines.agent_adapters`; `lora`: peft LoraConfig arguments of adapters not saved).
    """

    name = "embedded"
    capabilities = EngineCapabilities(trainable=True, in_process=True, adapters=True)

    @classmethod
    def options_from_config(cls, engine: EngineConfig, model: str) -> dict[str, Any]:
        return {
            **super().options_from_config(engine, model),
            "device": engine.device,
            "dtype": engine.dtype,
            "max_batch_size": engine.max_batch_size,
            "chat_template": engine.chat_template,
        }

    def __init__(
        self,
        model: str | os.PathLike[str] = TINY,
        *,
        device: str = "cpu",
        dtype: str = "float32",  # auto: bfloat16 on a GPU or a CPU with native bfloat16, else float32
        max_batch_size: int = 32,
        max_new_tokens: int = 512,  # limit of a request that sets no max_tokens
        max_context: int | None = None,  # None: the model's max_position_embeddings
        batch_wait_ms: float = 10.0,  # an idle engine waits this long after each request for another one
        max_batch_wait_ms: float = 100.0,  # ... and at most this long after its first (later ones join)
        seed: int | None = None,  # seeds requests that bring no seed; None: torch's global RNG
        served_name: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,  # where "tiny" is built
        torch_threads: int | None = None,  # CPU threads for torch (process-wide); None: torch's default
        adapters: list[str] | None = None,  # per-agent LoRA: the agents that get an adapter
        lora: dict[str, Any] | None = None,  # per-agent LoRA: peft LoraConfig arguments of new adapters
        chat_template: str = "auto",  # see alight.models.chat_templates
        continuous_batching: bool = True,  # False: a batch runs to its end before the next one starts
    ) -> None:
        if dtype not in DTYPES:
            raise ConfigError(f"embedded engine: dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if max_batch_size < 1 or max_new_tokens < 1 or batch_wait_ms < 0 or max_batch_wait_ms < 0:
            raise ConfigError(
                "embedded engine: max_batch_size and max_new_tokens must be >= 1, batch_wait_ms and "
                "max_batch_wait_ms >= 0"
            )
        self._source = str(model)
        self._served_name = served_name or Path(self._source).name or self._source
        self._device, self._dtype, self._cache_dir = device, dtype, cache_dir
        self.max_batch_size, self.max_new_tokens, self.batch_wait_ms = max_batch_size, max_new_tokens, batch_wait_ms
        self.max_batch_wait_ms = max(max_batch_wait_ms, batch_wait_ms)
        self._max_context_arg, self._seed, self._torch_threads = max_context, seed, torch_threads
        self._chat_template = chat_template
        self.continuous_batching = continuous_batching
        self._adapters = AgentAdapters(list(adapters), lora, self._served_name) if adapters else None
        self._model: Any = None
        self._tokenizer: Any = None
        self._eos_ids: set[int] = set()
        self._pad_id = 0
        self._generator: Any = None
        self._version = 0
        self._load_lock = threading.Lock()
        self._model_lock = threading.Lock()  # held by a running batch and by a weight update
        self._worker = BatchWorker(
            self._run,
            max_batch_size=max_batch_size,
            batch_wait_ms=batch_wait_ms,
            max_batch_wait_ms=self.max_batch_wait_ms,
            lock=self._load_lock,
            name="alight-embedded-engine",
        )

    # -- the model ---------------------------------------------------------------------------

    def load(self) -> None:
        """Load tokenizer and model (idempotent, thread-safe). Raises ConfigError if they cannot load."""
        with self._load_lock:
            if self._model is not None:
                return
            import torch
            from transformers import AutoModelForCausalLM

            from alight.models.progress import progress_bars_off

            if self._torch_threads is not None:
                torch.set_num_threads(self._torch_threads)
            from alight.models.chat_templates import load_tokenizer
            from alight.models.resolve import resolve_model

            path = resolve_model(self._source, tiny_dir=self._cache_dir)
            on_gpu = self._device.startswith("cuda")
            bf16 = on_gpu or native_bf16(self._device)  # auto: bfloat16 where the hardware computes it
            dtype = {"auto": torch.bfloat16 if bf16 else torch.float32}.get(self._dtype) or getattr(torch, self._dtype)
            try:
                with progress_bars_off():
                    tokenizer = load_tokenizer(path, self._chat_template)
                    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
                model = model.to(self._device).eval()
                if self._adapters is not None:
                    model = self._adapters.attach(model, path)
            except (OSError, ValueError, RuntimeError) as err:
                raise ConfigError(f"embedded engine: cannot load model {self._source!r}: {_first_line(err)}") from err
            eos: set[int] = set()
            for value in (model.generation_config.eos_token_id, tokenizer.eos_token_id):
                eos.update(value if isinstance(value, list) else [] if value is None else [value])
            im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
            if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
                eos.add(im_end)
            self._eos_ids = eos
            pad = tokenizer.pad_token_id
            self._pad_id = pad if pad is not None else min(eos, default=0)
            if self._seed is not None:
                self._generator = torch.Generator(device=self._device).manual_seed(self._seed)
            self._tokenizer, self._model = tokenizer, model

    @property
    def model(self) -> Any:
        """The live `transformers` model (loaded on first use). Change weights with `update_weights`."""
        self.load()
        return self._model

    @property
    def tokenizer(self) -> Any:
        self.load()
        return self._tokenizer

    @property
    def model_names(self) -> list[str]:
        adapters = self._adapters.model_names if self._adapters is not None else []
        return list(dict.fromkeys([self._served_name, self._source, *adapters]))

    @property
    def weights_version(self) -> int | None:
        return self._version

    @property
    def max_context(self) -> int | None:
        if self._max_context_arg is not None:
            return self._max_context_arg
        return int(self.model.config.max_position_embeddings)

    # -- life cycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.to_thread(self.load)
        self._worker.ensure_started()

    async def close(self) -> None:
        await self._worker.close()

    def _run(self, jobs: list[Job], join: Join) -> None:
        """Generate for `jobs` (one adapter) and the jobs that `join` lets in while they run."""
        adapter = jobs[0].adapter
        active: dict[int, Job] = {}
        decoder = Decoder(self._model, pad_id=self._pad_id, eos_ids=self._eos_ids, decode=self._decode)
        try:
            with self._model_lock, self._using(adapter):
                version = self._version
                while True:
                    joining, jobs = [job for job in jobs if not job.sequence.cancelled], []  # callers gone: dropped
                    if joining:
                        active.update((id(job.sequence), job) for job in joining)
                        decoder.add([job.sequence for job in joining])
                    if not decoder.size:
                        return
                    for sequence, output in decoder.step():
                        deliver(active.pop(id(sequence)), (output, version), None)
                    joins = self.continuous_batching and decoder.can_join
                    jobs = join(self.max_batch_size - decoder.size) if joins else []
        except Exception as err:  # a failed batch fails its requests, never the worker
            logger.exception("embedded engine: batch of %d failed", len(active) + len(jobs))
            for job in [*active.values(), *jobs]:
                deliver(job, None, err)

    def _using(self, adapter: str | None) -> contextlib.AbstractContextManager[None]:
        """The context a batch of `adapter` generates in (no adapters: nothing to switch)."""
        if self._adapters is None:
            return contextlib.nullcontext()
        return self._adapters.active(self._model, adapter)

    def _adapter_for(self, request: ChatRequest | CompletionRequest) -> str | None:
        return self._adapters.adapter_for(request.model, request.agent) if self._adapters is not None else None

    def _decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))

    # -- requests ------------------------------------------------------------------------------

    def _check_model(self, name: str) -> None:
        if name not in self.model_names:
            raise InvalidRequestError(f"unknown model {name!r}; this engine serves {', '.join(self.model_names)}")

    def _sequence(self, prompt_ids: list[int], sampling: SamplingParams) -> Sequence:
        import torch

        limit = self.max_context or 0
        if len(prompt_ids) >= limit:
            # OpenAI's wording, which clients (LiteLLM: ContextWindowExceededError) recognise
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens; the prompt is {len(prompt_ids)}"
            )
        if sampling.temperature < 0 or not 0 < sampling.top_p <= 1:
            raise InvalidRequestError("temperature must be >= 0 and top_p in (0, 1]")
        if sampling.max_tokens is not None and sampling.max_tokens < 1:
            raise InvalidRequestError("max_tokens must be at least 1")
        if not all(isinstance(s, str) and s for s in sampling.stop):
            raise InvalidRequestError("stop must be a list of non-empty strings")
        wanted = sampling.max_tokens if sampling.max_tokens is not None else self.max_new_tokens
        generator = self._generator
        if sampling.seed is not None:
            generator = torch.Generator(device=self._device).manual_seed(sampling.seed)
        return Sequence(
            prompt_ids=prompt_ids,
            max_new_tokens=min(wanted, limit - len(prompt_ids)),  # what fits in the context
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            stop=list(sampling.stop),
            generator=generator,
        )

    async def _ensure_loaded(self) -> None:
        if self._model is None:
            await asyncio.to_thread(self.load)

    async def _prepare_chat(self, request: ChatRequest) -> tuple[Sequence, bool]:
        await self._ensure_loaded()
        self._check_model(request.model)
        tools = validate_tools(request.tools)
        text = render_prompt(self._tokenizer, request.messages, tools)
        prompt_ids = list(self._tokenizer.encode(text, add_special_tokens=False))
        parse_tools = bool(tools) and request.tool_choice != "none"
        return self._sequence(prompt_ids, request.sampling), parse_tools

    def _generation(
        self, sequence: Sequence, output: SequenceOutput, version: int, parse_tools: bool, adapter: str | None = None
    ) -> Generation:
        message = assistant_message(output.text, parse_tools=parse_tools)
        finish = "tool_calls" if message.get("tool_calls") and output.finish_reason == "stop" else output.finish_reason
        return Generation(
            model=self._served_name,
            text=output.text,
            message=message,
            finish_reason=finish,
            prompt_token_ids=list(sequence.prompt_ids),
            response_token_ids=output.token_ids,
            response_logprobs=output.logprobs,
            token_ids_source="engine",
            prompt_tokens=len(sequence.prompt_ids),
            completion_tokens=len(output.token_ids),
            weights_version=version,
            adapter=adapter,
            sampling=sampled_with(sequence),
        )

    async def chat(self, request: ChatRequest) -> Generation:
        sequence, parse_tools = await self._prepare_chat(request)
        adapter = self._adapter_for(request)
        output, version = await answer(self._worker.submit(sequence, stream=False, adapter=adapter))
        return self._generation(sequence, output, version, parse_tools, adapter)

    async def chat_stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """Content deltas as tokens are generated, then the Generation (same ids as `chat`).

        Text that could still turn into tool-call markup or a stop string is held back; the
        deltas concatenate to exactly the final message's content."""
        sequence, parse_tools = await self._prepare_chat(request)
        adapter = self._adapter_for(request)
        job = self._worker.submit(sequence, stream=True, adapter=adapter)
        assert job.texts is not None
        shown = ToolCallStreamFilter() if parse_tools else PlainTextStream()
        try:
            while (text := await job.texts.get()) is not None:
                if delta := shown.feed(text):
                    yield TextDelta(delta)
            output, version = await job.future
        finally:  # the reader stopped early (client gone): stop generating for it
            sequence.cancelled = not job.future.done()
        generation = self._generation(sequence, output, version, parse_tools, adapter)
        if delta := shown.feed(output.text, final=True):
            yield TextDelta(delta)
        yield generation

    async def complete(self, request: CompletionRequest) -> Generation:
        """Continue a raw prompt (text or token ids), no chat template, no tool-call parsing."""
        await self._ensure_loaded()
        self._check_model(request.model)
        prompt_ids = self._completion_prompt(request.prompt)
        sequence = self._sequence(prompt_ids, request.sampling)
        adapter = self._adapter_for(request)
        output, version = await answer(self._worker.submit(sequence, stream=False, adapter=adapter))
        return self._generation(sequence, output, version, False, adapter)

    def _completion_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = list(self._tokenizer.encode(prompt, add_special_tokens=True))
        elif isinstance(prompt, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
            vocab = int(self._model.get_input_embeddings().num_embeddings)
            if any(not 0 <= i < vocab for i in prompt):
                raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})")
            ids = list(prompt)
        else:
            raise InvalidRequestError("prompt must be a string or a list of token ids")
        if not ids:
            raise InvalidRequestError("the prompt is empty")
        return ids

    async def update_weights(self, weights: Mapping[str, Any] | str, version: int) -> None:
        """Load new weights into the live model between batches; later answers carry `version`.

        `weights` is a state dict (tensors on any device) or a checkpoint directory/file
        (safetensors or PyTorch). Raises ConfigError when the weights do not fit the model."""
        await self._ensure_loaded()

        def apply() -> None:  # the rows running finish on the old weights; none joins meanwhile
            with self._worker.held(), self._model_lock:
                if self._adapters is not None:  # the adapters' tensors (and a directory's base weights)
                    self._adapters.load(self._model, weights)
                else:
                    load_weights_into(self._model, weights)
                self._version = version

        await asyncio.to_thread(apply)
        logger.info("embedded engine: serving weights version %d", version)


def sampled_with(sequence: Sequence) -> dict[str, Any]:
    """The settings a row was sampled with (recorded on the call's span): no top-k, min-p or penalty."""
    return {
        "temperature": sequence.temperature,
        "top_p": sequence.top_p,
        **NEUTRAL_SAMPLING,
        "max_tokens": sequence.max_new_tokens,
    }


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
