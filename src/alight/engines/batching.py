"""The request batcher of the embedded engine: one worker thread gathers concurrent requests into
batches and runs them, and each answer (or its streamed text) is handed back on the caller's loop.

Concurrent requests arrive one by one (each prompt is rendered and encoded first): a batch takes
requests while they keep coming, `batch_wait_ms` apart at most, for at most `max_batch_wait_ms`;
a batch generates together to its end, so a request that just misses it waits for the whole batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from alight.engines.sampling import Sequence, SequenceOutput

#: A job's answer: the sequence's output and the weights version that produced it.
Answer = tuple[SequenceOutput, int]


@dataclass
class Job:
    sequence: Sequence
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Answer]
    texts: asyncio.Queue[str | None] | None = None  # streaming: settled text after each token, None at the end
    adapter: str | None = None  # per-agent LoRA: the adapter that answers (None: the base model)


class BatchWorker:
    """Runs `run(jobs)` on one daemon thread for each batch gathered from `submit`; `run` resolves
    every job it is given (with `deliver`)."""

    def __init__(
        self,
        run: Callable[[list[Job]], None],
        *,
        max_batch_size: int,
        batch_wait_ms: float,
        max_batch_wait_ms: float,
        lock: threading.Lock,
        name: str,
    ) -> None:
        self._run = run
        self.max_batch_size, self.batch_wait_ms, self.max_batch_wait_ms = (
            max_batch_size,
            batch_wait_ms,
            max_batch_wait_ms,
        )
        self._lock = lock  # guards starting the thread (shared with the engine's loading)
        self._name = name
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def ensure_started(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._thread.start()

    async def close(self) -> None:
        thread = self._thread
        if thread is not None:
            self._queue.put(None)
            await asyncio.to_thread(thread.join)
            self._thread = None

    def submit(self, sequence: Sequence, *, stream: bool, adapter: str | None = None) -> Job:
        """Queue `sequence` from the running loop; with `stream`, its settled text arrives in `job.texts`."""
        self.ensure_started()
        loop = asyncio.get_running_loop()
        job = Job(sequence, loop, loop.create_future(), adapter=adapter)
        if stream:
            texts: asyncio.Queue[str | None] = asyncio.Queue()
            job.texts = texts
            sequence.on_text = _threadsafe_put(loop, texts)
        self._queue.put(job)
        return job

    def _serve(self) -> None:
        """The worker thread: gather a batch, run it, until `close`."""
        while True:
            first = self._queue.get()
            if first is None:
                return
            jobs, stop = [first], False
            cap = time.monotonic() + self.max_batch_wait_ms / 1000
            while len(jobs) < self.max_batch_size:
                wait = min(self.batch_wait_ms / 1000, cap - time.monotonic())
                try:
                    job = self._queue.get(timeout=max(wait, 0.0))
                except queue.Empty:
                    break
                if job is None:
                    stop = True
                    break
                jobs.append(job)
            self._run(jobs)
            if stop:
                return


def _threadsafe_put(loop: asyncio.AbstractEventLoop, texts: asyncio.Queue[str | None]) -> Callable[[str], None]:
    def put(text: str) -> None:
        with contextlib.suppress(RuntimeError):  # the caller's loop is gone
            loop.call_soon_threadsafe(texts.put_nowait, text)

    return put


async def answer(job: Job) -> Answer:
    """A job's result; a caller cancelled while waiting (its client gone) stops the job's sequence."""
    try:
        return await job.future
    except asyncio.CancelledError:
        job.sequence.cancelled = True
        raise


def deliver(job: Job, result: Answer | None, error: BaseException | None) -> None:
    """Resolve a job's future (and end its text stream) on the caller's loop."""

    def resolve() -> None:
        if not job.future.done():
            if error is not None:
                job.future.set_exception(error)
            else:
                assert result is not None
                job.future.set_result(result)
        if job.texts is not None:
            job.texts.put_nowait(None)

    with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits for this answer
        job.loop.call_soon_threadsafe(resolve)
