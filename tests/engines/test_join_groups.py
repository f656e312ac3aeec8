"""Requests join a running batch in groups (one prefill and one merge of the cache for each group):
they wait while more keep coming (`batch_wait_ms` apart, `max_batch_wait_ms` in all) unless they
fill the batch's free rows. On the real tiny model, then on the batch worker with a stand-in batch
(steps of a few ms, so that arrival times can be set) that records when jobs join."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from alight.engines.base import ChatRequest, Generation, SamplingParams, TextDelta
from alight.engines.batching import BatchWorker, Job, Join, answer, deliver
from alight.engines.embedded import EmbeddedEngine
from alight.engines.sampling import Decoder, Sequence, SequenceOutput

pytestmark = pytest.mark.anyio

LONG = 300  # greedy decoding of "hi" from the tiny model runs to its token limit


def chat(content: str, max_tokens: int) -> ChatRequest:
    return ChatRequest(
        model="tiny",
        messages=[{"role": "user", "content": content}],
        sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
    )


async def test_requests_arriving_a_few_tokens_apart_join_the_running_batch_together(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    added: list[int] = []  # rows of each prefill (each one after the first also merges the cache)
    real_add = Decoder.add

    def add(self: Decoder, batch: list[Sequence]) -> None:
        if batch:
            added.append(len(batch))
        real_add(self, batch)

    eng = EmbeddedEngine("tiny", cache_dir=tiny_dir, max_new_tokens=LONG, batch_wait_ms=200, max_batch_wait_ms=2000)
    await eng.start()
    try:
        contents = ["What is 2+2?", "Name a colour.", "Count to three."]
        alone = [await eng.chat(chat(content, 4)) for content in contents]
        monkeypatch.setattr(Decoder, "add", add)
        started = asyncio.Event()

        async def long_call() -> Generation:
            generation: Generation | None = None
            async for event in eng.chat_stream(chat("hi", LONG)):
                if isinstance(event, TextDelta):
                    started.set()
                else:
                    generation = event
            assert generation is not None
            return generation

        async def short_call(index: int) -> Generation:
            await started.wait()  # the long row is generating
            await asyncio.sleep(0.05 * index)  # each a few decode steps after the one before
            return await eng.chat(chat(contents[index], 4))

        long_run, *short_runs = await asyncio.gather(long_call(), *(short_call(i) for i in range(3)))
    finally:
        await eng.close()
    assert added == [1, 3]  # the long row, then the three together: one prefill and one merge
    assert len(long_run.response_token_ids or []) == LONG  # they joined it rather than waiting for its end
    for together, by_itself in zip(short_runs, alone, strict=True):
        assert together.response_token_ids == by_itself.response_token_ids


class StandInBatch:
    """Stands in for the model's batch (what the worker runs): `steps` steps of `step_s` seconds,
    asking `join` for new rows after each; records each group that joins, and when."""

    def __init__(self, *, steps: int, step_s: float = 0.002, rows: int = 8) -> None:
        self.steps, self.step_s, self.rows = steps, step_s, rows
        self.running = threading.Event()
        self.starts: list[int] = []  # jobs each batch started with
        self.joins: list[tuple[float, int]] = []  # (time.monotonic(), jobs) of each group that joined

    def __call__(self, jobs: list[Job], join: Join) -> None:
        self.starts.append(len(jobs))
        self.running.set()
        running = list(jobs)
        for _ in range(self.steps):
            time.sleep(self.step_s)
            if joined := join(self.rows - len(running)):
                self.joins.append((time.monotonic(), len(joined)))
                running += joined
        for job in running:
            deliver(job, (SequenceOutput([], [], "", "length"), 0), None)


def worker(batch: StandInBatch, *, batch_wait_ms: float, max_batch_wait_ms: float, rows: int = 8) -> BatchWorker:
    """The worker, starting batches of at most `rows` jobs (`batch` asks `join` for its own free rows)."""
    return BatchWorker(
        batch,
        max_batch_size=rows,
        batch_wait_ms=batch_wait_ms,
        max_batch_wait_ms=max_batch_wait_ms,
        lock=threading.Lock(),
        name="test-batch-worker",
    )


def submit(jobs: BatchWorker) -> tuple[Job, float]:
    """A job, and when it was submitted."""
    submitted = time.monotonic()
    return jobs.submit(Sequence([1], max_new_tokens=1), stream=False), submitted


async def run_first_batch(jobs: BatchWorker, batch: StandInBatch) -> Job:
    """Submit a job and wait until its batch runs."""
    first, _ = submit(jobs)
    await asyncio.to_thread(batch.running.wait)
    return first


async def test_a_lone_request_joins_once_no_other_came_for_batch_wait_ms_not_at_the_batch_end() -> None:
    batch = StandInBatch(steps=500)  # about a second
    jobs = worker(batch, batch_wait_ms=60, max_batch_wait_ms=5000)
    try:
        first = await run_first_batch(jobs, batch)
        lone, submitted = submit(jobs)
        await asyncio.gather(answer(first), answer(lone))
    finally:
        await jobs.close()
    assert batch.starts == [1] and len(batch.joins) == 1
    joined_at, joined = batch.joins[0]
    assert joined == 1 and 0.06 <= joined_at - submitted < 0.5


async def test_requests_that_fill_the_free_rows_join_at_once() -> None:
    batch = StandInBatch(steps=300, rows=3)
    jobs = worker(batch, batch_wait_ms=5000, max_batch_wait_ms=5000, rows=1)  # the first batch starts at once
    try:
        first = await run_first_batch(jobs, batch)
        (one, _), (two, submitted) = submit(jobs), submit(jobs)
        await asyncio.gather(answer(first), answer(one), answer(two))
    finally:
        await jobs.close()
    assert batch.starts == [1] and [joined for _, joined in batch.joins] == [2]
    assert batch.joins[0][0] - submitted < 0.3


async def test_requests_that_keep_coming_join_after_max_batch_wait_ms() -> None:
    batch = StandInBatch(steps=600, rows=32)
    jobs = worker(batch, batch_wait_ms=80, max_batch_wait_ms=150)
    try:
        first = await run_first_batch(jobs, batch)
        stream: list[Job] = []
        started = time.monotonic()
        for _ in range(20):  # one every 20 ms for 400 ms: never 80 ms without one
            stream.append(submit(jobs)[0])
            await asyncio.sleep(0.02)
        await asyncio.gather(answer(first), *map(answer, stream))
    finally:
        await jobs.close()
    assert batch.starts == [1] and sum(joined for _, joined in batch.joins) == 20
    assert 0.15 <= batch.joins[0][0] - started < 0.3  # the first group did not wait for the stream's end
