"""Memory pressure in the embedded engine: a batch that runs out of memory (torch's
OutOfMemoryError, as an accelerator or a host short of RAM raises it) fails the calls it held with
a server error that the agent's client sends again; the engine's worker goes on, so the run does
not hang and the call is answered."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from alight.proxy import Proxy, ProxyServer
from alight.store import MemoryStore
from tests.proxy.conftest import new_attempt, spans_of

torch = pytest.importorskip("torch")


def test_a_batch_out_of_memory_fails_its_calls_retryably_and_the_engine_goes_on(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alight.engines import embedded
    from alight.engines.embedded import EmbeddedEngine
    from alight.types import SpanStatus

    step, failures = embedded.Decoder.step, []

    def short_of_memory(self: object) -> object:
        if not failures:
            failures.append(1)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return step(self)  # type: ignore[arg-type]

    monkeypatch.setattr(embedded.Decoder, "step", short_of_memory)
    engine = EmbeddedEngine("tiny", cache_dir=tiny_dir, max_new_tokens=8, batch_wait_ms=1)
    with ProxyServer(Proxy(engine, MemoryStore(), version=1)) as server:
        rid, aid = new_attempt(server)
        once = openai.OpenAI(base_url=server.base_url(rid, aid), api_key="x", max_retries=0)
        with once, pytest.raises(openai.InternalServerError, match="OutOfMemoryError"):
            once.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        failures.clear()  # short of memory once more: the client's retry gets the answer
        with openai.OpenAI(base_url=server.base_url(rid, aid), api_key="x", max_retries=2) as llm:  # the default
            answer = llm.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert answer.choices[0].message.content is not None and failures == [1]
        spans = spans_of(server, rid)
        errors = [s for s in spans if s.status is SpanStatus.ERROR]
        assert len(spans) == 3 and len(errors) == 2  # each failed call recorded as an error, then the answer
        assert all("OutOfMemoryError" in (span.status_message or "") for span in errors)
